/* Cases 42-44: a construct decides its copies over its whole map list (OpenMP 5.x).
   LLVM 19's libomptarget decides item by item; scripts/differential.sh lists the lines
   where it differs. */
#include "common.h"
int main(void) {
  int x = 0;
  #pragma omp target data map(alloc: x) map(from: x) map(alloc: x) device(0)
  {
    #pragma omp target map(present, alloc: x) device(0)
    x = 222;
  }
  SAY("case 42: host %d", x);
  int y = 111;
  #pragma omp target map(alloc: y) map(from: y) map(to: y) map(alloc: y) device(0)
  y += 111;
  SAY("case 43: host %d", y);
  int z = 0;
  #pragma omp target data map(alloc: z) device(0)
  {
    #pragma omp target enter data map(alloc: z) map(to: z) device(0)
    #pragma omp target map(present, alloc: z) device(0)
    z = 222;
    #pragma omp target exit data map(delete: z) map(from: z) map(delete: z) device(0)
  }
  SAY("case 44: host %d", z);
  return 0;
}
