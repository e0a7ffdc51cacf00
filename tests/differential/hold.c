/* Cases 24 and 25: the reference count and the hold count (LLVM's ompx_hold). */
#include "common.h"
int main(void) {
  int m[4] = {0, 0, 0, 0}, r[4] = {0, 0, 0, 0}, d[4] = {0, 0, 0, 0};
  #pragma omp target data map(ompx_hold, tofrom: m[0:4]) map(ompx_hold, alloc: r[0:4], d[0:4]) device(3)
  {
    #pragma omp target map(alloc: m[0:4]) device(3)
    for (int k = 0; k < 4; k++) m[k] = 7;
    #pragma omp target exit data map(from: m[0:4]) map(release: r[0:4]) map(delete: d[0:4]) device(3)
    SAY("case 24: hold inside host %d present %d %d %d", m[0], omp_target_is_present(m, 3),
        omp_target_is_present(r, 3), omp_target_is_present(d, 3));
  }
  SAY("case 24: hold after host %d present %d", m[0], omp_target_is_present(m, 3));
  int p[4] = {0, 0, 0, 0};
  #pragma omp target data map(tofrom: p[0:4]) device(3)
  {
    #pragma omp target map(alloc: p[0:4]) device(3)
    for (int k = 0; k < 4; k++) p[k] = 5;
    #pragma omp target exit data map(from: p[0:4]) device(3)
    SAY("case 24: plain inside host %d present %d", p[0], omp_target_is_present(p, 3));
  }
  SAY("case 24: plain after host %d", p[0]);
  int x[4] = {1, 1, 1, 1};
  #pragma omp target enter data map(to: x[0:4]) device(3)
  #pragma omp target data map(ompx_hold, alloc: x[0:4]) device(3)
  {
    #pragma omp target exit data map(delete: x[0:4]) device(3)
    SAY("case 25: after delete present %d", omp_target_is_present(x, 3));
  }
  SAY("case 25: after the region present %d", omp_target_is_present(x, 3));
  return 0;
}
