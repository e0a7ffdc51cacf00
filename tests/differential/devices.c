/* Cases 32, 34, 37, 39-41: allocation, memcpy and several devices. */
#include "common.h"
int main(void) {
  int init = omp_get_initial_device(), last = omp_get_num_devices() - 1;
  SAY("case 32: null for 0 bytes %d", omp_target_alloc(0, 0) == NULL);
  int *p = omp_target_alloc(130 * sizeof(int), 0);
  int src[128], back[128];
  for (int k = 0; k < 128; k++) src[k] = k;
  omp_target_memcpy(p, src, sizeof src, 4, 0, 0, init);
  omp_target_memcpy(back, p, sizeof back, 0, 4, init, 0);
  int same = 1;
  for (int k = 0; k < 128; k++) same &= back[k] == k;
  SAY("case 34: round trip with offsets equal %d", same);
  int *q = omp_target_alloc(130 * sizeof(int), last);
  omp_target_memcpy(q, p, 130 * sizeof(int), 0, 0, last, 0);
  omp_target_memcpy(back, q, sizeof back, 0, 4, init, last);
  SAY("case 37: device 0 to %d: %d %d", last, back[0], back[127]);
  omp_target_free(p, 0);
  omp_target_free(q, last);
  int h[4 * 4];
  for (int d = 0; d < 4; d++) {
    #pragma omp target map(from: h[d * 4:4]) device(d)
    for (int k = 0; k < 4; k++) h[d * 4 + k] = d;
  }
  SAY("case 39: %d %d %d %d", h[0], h[5], h[10], h[15]);
  int x[4] = {1, 1, 1, 1};
  #pragma omp target enter data map(to: x[0:4]) device(0)
  SAY("case 40: present on 0 %d on 1 %d mapped on 1 null %d", omp_target_is_present(x, 0),
      omp_target_is_present(x, 1), omp_get_mapped_ptr(x, 1) == NULL);
  #pragma omp target exit data map(delete: x[0:4]) device(0)
  int a[4];
  int *da = omp_target_alloc(sizeof a, 0);
  omp_target_associate_ptr(a, da, sizeof a, 0, 0);
  SAY("case 41: associated on 0 %d on 1 %d", omp_target_is_present(a, 0), omp_target_is_present(a, 1));
  omp_target_disassociate_ptr(a, 0);
  omp_target_free(da, 0);
  return 0;
}
