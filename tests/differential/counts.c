/* Cases 1-10: counts and copies. */
#include "common.h"
int main(void) {
  int x[4] = {1, 1, 1, 1};
  #pragma omp target enter data map(to: x[0:4]) device(0)
  SAY("case 1: present %d device %d", omp_target_is_present(x, 0), device_value(x, 0, 0));
  x[0] = 2;
  #pragma omp target enter data map(to: x[0:4]) device(0)
  SAY("case 2: device %d", device_value(x, 0, 0));
  #pragma omp target enter data map(always, to: x[0:4]) device(0)
  SAY("case 3: device %d", device_value(x, 0, 0));
  x[0] = 5;
  #pragma omp target exit data map(from: x[0:4]) device(0)
  SAY("case 4: host %d present %d", x[0], omp_target_is_present(x, 0));
  #pragma omp target exit data map(from: x[0:4]) device(0)
  #pragma omp target exit data map(from: x[0:4]) device(0)
  SAY("case 5: host %d present %d", x[0], omp_target_is_present(x, 0));
  int y[4] = {7, 7, 7, 7};
  #pragma omp target enter data map(to: y[0:4]) device(0)
  y[0] = 8;
  #pragma omp target exit data map(release: y[0:4]) device(0)
  SAY("case 6: host %d present %d", y[0], omp_target_is_present(y, 0));
  int z[4] = {3, 3, 3, 3};
  for (int k = 0; k < 5; k++) {
    #pragma omp target enter data map(to: z[0:4]) device(0)
  }
  #pragma omp target exit data map(delete: z[0:4]) device(0)
  SAY("case 7: present %d", omp_target_is_present(z, 0));
  int m[4] = {0, 0, 0, 0};
  #pragma omp target data map(tofrom: m[0:4]) device(0)
  {
    #pragma omp target data map(tofrom: m[0:4]) device(0)
    {
      #pragma omp target map(tofrom: m[0:4]) device(0)
      for (int i = 0; i < 4; i++) m[i] += 1;
    }
    SAY("case 8: inner end host %d present %d", m[0], omp_target_is_present(m, 0));
  }
  SAY("case 8: outer end host %d present %d", m[0], omp_target_is_present(m, 0));
  int n[4] = {0, 0, 0, 0};
  #pragma omp target map(tofrom: n[0:4]) device(0)
  for (int i = 0; i < 4; i++) n[i] += 1;
  SAY("case 9: no region host %d present %d", n[0], omp_target_is_present(n, 0));
  #pragma omp target data map(tofrom: n[0:4]) device(0)
  {
    #pragma omp target map(tofrom: n[0:4]) device(0)
    for (int i = 0; i < 4; i++) n[i] += 1;
    SAY("case 9: in region host %d present %d", n[0], omp_target_is_present(n, 0));
  }
  SAY("case 9: after region host %d", n[0]);
  int b[4] = {0, 0, 0, 0};
  #pragma omp target map(from: b[0:4]) device(0)
  for (int i = 0; i < 4; i++) b[i] = 1;
  SAY("case 10: host %d", b[0]);
  return 0;
}
