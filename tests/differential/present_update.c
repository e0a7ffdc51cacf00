/* Cases 11, 13-15 and target update (the cases that do not fail: libomptarget aborts a
   program whose construct fails, where offload returns an error). */
#include "common.h"
int main(void) {
  int i[4] = {4, 4, 4, 4};
  #pragma omp target data map(alloc: i[0:4]) device(1)
  {
    #pragma omp target data map(present, alloc: i[0:4]) device(1)
    SAY("case 11: present %d", omp_target_is_present(i, 1));
  }
  SAY("case 11: after present %d", omp_target_is_present(i, 1));
  int r[4] = {0, 0, 0, 0};
  #pragma omp target enter data map(to: r[0:4]) device(1)
  #pragma omp target enter data map(to: r[0:4]) device(1)
  #pragma omp target exit data map(present, release: r[0:4]) device(1)
  SAY("case 13: after one present release %d", omp_target_is_present(r, 1));
  #pragma omp target exit data map(present, delete: r[0:4]) device(1)
  SAY("case 13: after present delete %d", omp_target_is_present(r, 1));
  int u[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  #pragma omp target enter data map(to: u[0:8]) device(1)
  u[0] = 9; u[7] = 9;
  #pragma omp target update to(present: u[0:8]) device(1)
  SAY("case 14: device %d %d", device_value(u, 0, 1), device_value(u, 7, 1));
  #pragma omp target map(alloc: u[0:8]) device(1)
  for (int k = 0; k < 8; k++) u[k] += 1;
  #pragma omp target update from(present: u[2:4]) device(1)
  SAY("case 14: host %d %d %d", u[0], u[2], u[7]);
  #pragma omp target data map(present, alloc: u[2:3]) device(1)
  SAY("case 15: sub-range present %d", omp_target_is_present(&u[2], 1));
  #pragma omp target exit data map(from: u[0:8]) device(1)
  SAY("update: after exit host %d %d present %d", u[0], u[7], omp_target_is_present(u, 1));
  int a[4] = {2, 2, 2, 2};
  #pragma omp target update to(a[0:4]) device(1)
  #pragma omp target update from(a[0:4]) device(1)
  SAY("update: of an absent range host %d present %d", a[0], omp_target_is_present(a, 1));
  return 0;
}
