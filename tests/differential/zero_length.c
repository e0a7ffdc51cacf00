/* Rule 6: a zero-length section inside a mapped range stands for that range's entry, at
   entry and at exit, with or without `present`; it copies nothing. */
#include "common.h"
int main(void) {
  int a[8];
  for (int k = 0; k < 8; k++) a[k] = k;
  #pragma omp target enter data map(alloc: a[0:5]) device(1)
  #pragma omp target exit data map(present, release: a[0:0]) device(1)
  SAY("present release a[0:0]: present %d", omp_target_is_present(a, 1));
  #pragma omp target enter data map(alloc: a[0:5]) device(1)
  #pragma omp target exit data map(release: a[3:0]) device(1)
  SAY("release a[3:0]: present %d", omp_target_is_present(a, 1));
  #pragma omp target enter data map(to: a[0:5]) device(1)
  #pragma omp target enter data map(to: a[2:0]) device(1)
  #pragma omp target exit data map(release: a[0:5]) device(1)
  SAY("enter to a[2:0], release a[0:5]: present %d", omp_target_is_present(a, 1));
  #pragma omp target map(present, alloc: a[0:5]) device(1)
  for (int k = 0; k < 5; k++) a[k] = 9;
  #pragma omp target exit data map(from: a[2:0]) device(1)
  SAY("from a[2:0] at the last count: present %d host %d %d", omp_target_is_present(a, 1), a[0], a[2]);
  #pragma omp target enter data map(alloc: a[0:5]) device(1)
  #pragma omp target enter data map(alloc: a[0:5]) device(1)
  #pragma omp target enter data map(alloc: a[0:5]) device(1)
  #pragma omp target exit data map(delete: a[4:0]) device(1)
  SAY("delete a[4:0] at count 3: present %d", omp_target_is_present(a, 1));
  #pragma omp target enter data map(alloc: a[0:5]) device(1)
  #pragma omp target enter data map(alloc: a[5:0]) device(1)
  SAY("a[5:0] one past the end: present %d", omp_target_is_present(&a[5], 1));
  #pragma omp target exit data map(release: a[5:0]) device(1)
  SAY("release a[5:0]: a present %d", omp_target_is_present(a, 1));
  #pragma omp target data map(alloc: a[3:0]) device(1)
  {
    #pragma omp target exit data map(release: a[0:5]) device(1)
    SAY("inside target data a[3:0], release a[0:5]: present %d", omp_target_is_present(a, 1));
  }
  SAY("after the region: present %d", omp_target_is_present(a, 1));
  return 0;
}
