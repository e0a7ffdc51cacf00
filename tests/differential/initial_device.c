/* OpenMP 5.1's omp_initial_device (-1) in every routine and construct that takes a device
   number, beside the same steps with omp_get_initial_device(). Each step runs in a child
   process (ATTEMPT), since libomptarget 19 aborts on -1 in its memory routines ("Device
   number '-1' out of range") and takes -1 in a construct's device clause for the default
   device (its OFFLOAD_DEVICE_DEFAULT): those lines are known differences. */
#include "common.h"
#include <string.h>

#ifndef omp_initial_device
#define omp_initial_device (-1) /* OpenMP 5.1; LLVM 19's omp.h lacks it */
#endif

static void steps(const char *name, int I) {
  int x[4] = {1, 2, 3, 4}, y[4] = {0, 0, 0, 0};
  size_t vol[1] = {4}, off[1] = {0}, dim[1] = {4};
  ATTEMPT(name, "set_default_device", omp_set_default_device(I);
          SAY("%s: set_default_device, then the default is the initial device %d", name,
              omp_get_default_device() == omp_get_initial_device()));
  ATTEMPT(name, "alloc", char *p = omp_target_alloc(16, I); memset(p, 1, 16); omp_target_free(p, I);
          SAY("%s: alloc, host writes, free", name));
  ATTEMPT(name, "is_present", SAY("%s: is_present %d", name, omp_target_is_present(x, I)));
  ATTEMPT(name, "mapped_ptr", SAY("%s: mapped_ptr is the host address %d", name, omp_get_mapped_ptr(x, I) == x));
  ATTEMPT(name, "associate_ptr", int *d = omp_target_alloc(16, 0);
          SAY("%s: associate_ptr returns %d", name, omp_target_associate_ptr(x, d, 16, 0, I)));
  ATTEMPT(name, "disassociate_ptr", SAY("%s: disassociate_ptr returns %d", name, omp_target_disassociate_ptr(x, I)));
  ATTEMPT(name, "memcpy", int r = omp_target_memcpy(y, x, 16, 0, 0, I, I); SAY("%s: memcpy %d y %d", name, r, y[3]));
  ATTEMPT(name, "memcpy through device 0", int *d = omp_target_alloc(16, 0); omp_target_memcpy(d, x, 16, 0, 0, 0, I);
          omp_target_memcpy(y, d, 16, 0, 0, I, 0); SAY("%s: memcpy through device 0 y %d", name, y[2]));
  ATTEMPT(name, "memset", void *r = omp_target_memset(y, 7, 16, I);
          SAY("%s: memset returns the pointer %d y %x", name, r == y, (unsigned)y[0]));
  ATTEMPT(name, "memcpy_rect", int r = omp_target_memcpy_rect(y, x, 4, 1, vol, off, off, dim, dim, I, I);
          SAY("%s: memcpy_rect %d y %d", name, r, y[1]));
  ATTEMPT(name, "memcpy_rect query", SAY("%s: memcpy_rect query %d", name,
                    omp_target_memcpy_rect(NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, I, I)));
  ATTEMPT(name, "memcpy_rect_async query", SAY("%s: memcpy_rect_async query %d", name,
                    omp_target_memcpy_rect_async(NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, I, I, 0, NULL)));
  ATTEMPT(name, "memcpy_async", int r = omp_target_memcpy_async(y, x, 16, 0, 0, I, I, 0, NULL);
          _Pragma("omp taskwait") SAY("%s: memcpy_async %d y %d", name, r, y[1]));
  ATTEMPT(name, "memcpy_rect_async", int r = omp_target_memcpy_rect_async(y, x, 4, 1, vol, off, off, dim, dim, I, I, 0, NULL);
          _Pragma("omp taskwait") SAY("%s: memcpy_rect_async %d y %d", name, r, y[2]));
  ATTEMPT(name, "memset_async", void *r = omp_target_memset_async(y, 9, 16, I, 0, NULL);
          _Pragma("omp taskwait") SAY("%s: memset_async returns the pointer %d y %x", name, r == y, (unsigned)y[0]));
  /* On the host the region writes x itself; on a device, its copy (map to: not copied back). */
  ATTEMPT(name, "target", _Pragma("omp target map(to: x[0:4]) device(I)") for (int k = 0; k < 4; k++) x[k] = 9;
          SAY("%s: target ran on host memory %d", name, x[0] == 9));
  ATTEMPT(name, "enter data", _Pragma("omp target enter data map(to: x[0:4]) device(I)")
          SAY("%s: enter data, present on device 0 %d", name, omp_target_is_present(x, 0)));
  ATTEMPT(name, "target data", _Pragma("omp target data map(to: x[0:4]) device(I)")
          { SAY("%s: target data, present on device 0 %d", name, omp_target_is_present(x, 0)); });
  ATTEMPT(name, "update", _Pragma("omp target update to(x[0:4]) device(I)") SAY("%s: update", name));
  ATTEMPT(name, "exit data", _Pragma("omp target exit data map(from: x[0:4]) device(I)") SAY("%s: exit data", name));
  ATTEMPT(name, "enter data nowait", _Pragma("omp target enter data map(to: x[0:4]) device(I) nowait") _Pragma("omp taskwait")
          SAY("%s: enter data nowait, present on device 0 %d", name, omp_target_is_present(x, 0)));
  ATTEMPT(name, "use_device_ptr", int *p = x; _Pragma("omp target data map(to: x[0:4]) device(I) use_device_ptr(p)")
          { SAY("%s: use_device_ptr is the host address %d", name, p == x); });
}

int main(void) {
  steps("initial device number", omp_get_initial_device());
  steps("omp_initial_device", omp_initial_device);
  return 0;
}
