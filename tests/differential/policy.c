/* Case 48 and 49: OMP_TARGET_OFFLOAD. Run twice (the run lines below, which
   scripts/differential.sh reads): under mandatory with no device (an offload image that no
   plugin here can run, nvptx64; the twin with OFFLOAD_HOST_DEVICES=0), where the queries
   answer, the memory routines work on the initial device and every construct fails; and
   under disabled, where everything runs on the host and omp_set_default_device is taken
   for any number. */
/* run mandatory-no-device: no-devices OMP_TARGET_OFFLOAD=mandatory */
/* run disabled: OMP_TARGET_OFFLOAD=disabled */
#include "common.h"

int main(void) {
  int I = omp_get_initial_device();
  int x[4] = {1, 2, 3, 4}, y[4] = {0, 0, 0, 0};
  size_t vol[1] = {4}, off[1] = {0}, dim[1] = {4};
  SAY("queries: devices %d initial %d default is initial %d is_initial_device %d", omp_get_num_devices(), I,
      omp_get_default_device() == I, omp_is_initial_device());
  ATTEMPT("routine", "set_default_device(2)", omp_set_default_device(2);
          SAY("routine: set_default_device(2): returns, then the default is the initial device %d",
              omp_get_default_device() == omp_get_initial_device()));
  ATTEMPT("routine", "alloc", char *p = omp_target_alloc(16, I); p[15] = 1; omp_target_free(p, I);
          SAY("routine: alloc: on the initial device, host writes, free"));
  ATTEMPT("routine", "alloc on device 1", void *p = omp_target_alloc(16, 1);
          SAY("routine: alloc on device 1: not null %d", p != NULL));
  ATTEMPT("routine", "is_present", SAY("routine: is_present: %d", omp_target_is_present(x, I)));
  ATTEMPT("routine", "mapped_ptr", SAY("routine: mapped_ptr: the host address %d", omp_get_mapped_ptr(x, I) == x));
  ATTEMPT("routine", "associate_ptr",
          SAY("routine: associate_ptr: returns %d", omp_target_associate_ptr(x, y, 16, 0, I)));
  ATTEMPT("routine", "memcpy", int r = omp_target_memcpy(y, x, 16, 0, 0, I, I);
          SAY("routine: memcpy: %d y %d", r, y[3]));
  ATTEMPT("routine", "memset", void *r = omp_target_memset(y, 7, 16, I);
          SAY("routine: memset: returns the pointer %d y %x", r == y, (unsigned)y[0]));
  ATTEMPT("routine", "memcpy_rect", int r = omp_target_memcpy_rect(y, x, 4, 1, vol, off, off, dim, dim, I, I);
          SAY("routine: memcpy_rect: %d y %d", r, y[1]));
  ATTEMPT("routine", "memcpy_rect query",
          SAY("routine: memcpy_rect query: %d",
              omp_target_memcpy_rect_async(NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, I, I, 0, NULL)));
  ATTEMPT("routine", "memcpy_async", int r = omp_target_memcpy_async(y, x, 16, 0, 0, I, I, 0, NULL);
          _Pragma("omp taskwait") SAY("routine: memcpy_async: %d y %d", r, y[2]));
  /* On the host the region writes x itself (map to: a device copy would not come back). */
  ATTEMPT("construct", "target", _Pragma("omp target map(to: x[0:4])") for (int k = 0; k < 4; k++) x[k] = 9;
          SAY("construct: target: ran on host memory %d", x[0] == 9));
  ATTEMPT("construct", "target device(initial)",
          _Pragma("omp target map(to: x[0:4]) device(I)") for (int k = 0; k < 4; k++) x[k] = 9;
          SAY("construct: target device(initial): ran on host memory %d", x[0] == 9));
  ATTEMPT("construct", "target if(0)", _Pragma("omp target map(to: x[0:4]) if(0)") for (int k = 0; k < 4; k++) x[k] = 9;
          SAY("construct: target if(0): ran on host memory %d", x[0] == 9));
  ATTEMPT("construct", "enter data", _Pragma("omp target enter data map(to: x[0:4])") SAY("construct: enter data: done"));
  ATTEMPT("construct", "target data", _Pragma("omp target data map(to: x[0:4])") { SAY("construct: target data: inside"); });
  ATTEMPT("construct", "update", _Pragma("omp target update to(x[0:4])") SAY("construct: update: done"));
  ATTEMPT("construct", "exit data", _Pragma("omp target exit data map(from: x[0:4])") SAY("construct: exit data: done"));
  ATTEMPT("construct", "enter data nowait", _Pragma("omp target enter data map(to: x[0:4]) nowait")
          _Pragma("omp taskwait") SAY("construct: enter data nowait: done"));
  return 0;
}
