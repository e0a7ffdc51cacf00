/* Cases 26, 29, 31: associated pointers and mapped addresses. */
#include "common.h"
int main(void) {
  int init = omp_get_initial_device();
  int h[4] = {1, 1, 1, 1};
  int *d = omp_target_alloc(sizeof h, 0);
  int ok = 1;
  for (int k = 0; k < 8; k++) {
    ok &= omp_target_associate_ptr(h, d, sizeof h, 0, 0) == 0;
    ok &= omp_target_is_present(h, 0) && omp_get_mapped_ptr(h, 0) == d;
    ok &= omp_target_disassociate_ptr(h, 0) == 0;
    ok &= !omp_target_is_present(h, 0);
  }
  SAY("case 26: eight rounds ok %d", ok);
  int zero[4] = {0, 0, 0, 0};
  omp_target_memcpy(d, zero, sizeof zero, 0, 0, 0, init);
  omp_target_associate_ptr(h, d, sizeof h, 0, 0);
  #pragma omp target map(tofrom: h[0:4]) device(0)
  for (int k = 0; k < 4; k++) h[k] += 10;
  SAY("case 29: after a tofrom launch host %d device %d", h[0], device_value(h, 0, 0));
  #pragma omp target exit data map(delete: h[0:4]) device(0)
  SAY("case 29: after delete present %d", omp_target_is_present(h, 0));
  #pragma omp target update from(h[0:4]) device(0)
  SAY("case 29: after update from host %d", h[0]);
  omp_target_disassociate_ptr(h, 0);
  omp_target_free(d, 0);
  int q[8] = {0};
  SAY("case 31: before %d", omp_get_mapped_ptr(q, 0) == NULL);
  #pragma omp target enter data map(to: q[0:8]) device(0)
  long off = (char *)omp_get_mapped_ptr(&q[4], 0) - (char *)omp_get_mapped_ptr(q, 0);
  SAY("case 31: offset of q+4 %ld", off);
  #pragma omp target exit data map(delete: q[0:8]) device(0)
  return 0;
}
