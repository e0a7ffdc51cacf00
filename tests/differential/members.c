/* Struct members mapped by one construct: libomptarget gives them one device block (from
   the first listed member to the end of the last), so a kernel may index from one member
   into the next; offload makes one entry per member (docs/PORTING.md). */
#include "common.h"
struct T { int i; int pad; int j; };
int main(void) {
  struct T t = {1, 2, 3};
  #pragma omp target enter data map(to: t.i, t.j) device(1)
  SAY("t.i present %d, t.pad present %d, t.j present %d", omp_target_is_present(&t.i, 1),
      omp_target_is_present(&t.pad, 1), omp_target_is_present(&t.j, 1));
  #pragma omp target exit data map(release: t.i, t.j) device(1)
  SAY("after release: t.i present %d, t.j present %d", omp_target_is_present(&t.i, 1), omp_target_is_present(&t.j, 1));
  #pragma omp target map(tofrom: t.i, t.j) device(1)
  {
    t.i += 10;
    t.j += 10;
  }
  SAY("each member through its own name: %d %d %d", t.i, t.pad, t.j);
  return 0;
}
