/* Shared by the differential programs: each prints one line per observation, the same
   lines its twin in examples/differential.rs prints with offload::omp. */
#include <omp.h>
#include <stdio.h>

/* Element `i` of the device copy of the mapped host array `h` on device `dev`. */
__attribute__((unused)) static int device_value(int *h, int i, int dev) {
  int v = -999;
  void *d = omp_get_mapped_ptr(h, dev);
  if (d) omp_target_memcpy(&v, d, sizeof v, 0, (size_t)i * sizeof v, omp_get_initial_device(), dev);
  return v;
}

#define SAY(...) (printf(__VA_ARGS__), printf("\n"))
