/* Cases 17, 18, 20 (containment) and 21-23 (zero-length sections), the ones that do not fail. */
#include "common.h"
int main(void) {
  int arr[100];
  for (int k = 0; k < 100; k++) arr[k] = k;
  #pragma omp target enter data map(alloc: arr[0:100]) device(2)
  #pragma omp target enter data map(to: arr[98:2]) device(2)
  long off = (char *)omp_get_mapped_ptr(&arr[98], 2) - (char *)omp_get_mapped_ptr(arr, 2);
  SAY("case 17: offset %ld", off);
  #pragma omp target exit data map(release: arr[98:2]) device(2)
  #pragma omp target exit data map(delete: arr[0:100]) device(2)
  #pragma omp target enter data map(alloc: arr[50:2]) device(2)
  SAY("case 18: %d %d %d %d", omp_target_is_present(&arr[50], 2), omp_target_is_present(&arr[51], 2),
      omp_target_is_present(&arr[49], 2), omp_target_is_present(&arr[52], 2));
  #pragma omp target exit data map(delete: arr[50:2]) device(2)
  SAY("case 18: after exit %d", omp_target_is_present(&arr[50], 2));
  #pragma omp target enter data map(to: arr[0:5]) device(2)
  arr[1] = 100; arr[2] = 200; arr[3] = 300; arr[4] = 400;
  #pragma omp target update to(arr[2:2]) device(2)
  SAY("case 20: device %d %d %d %d", device_value(arr, 1, 2), device_value(arr, 2, 2), device_value(arr, 3, 2),
      device_value(arr, 4, 2));
  #pragma omp target data map(present, alloc: arr[3:0]) device(2)
  SAY("case 21: zero-length inside present %d", omp_target_is_present(&arr[3], 2));
  #pragma omp target exit data map(present, release: arr[0:0]) device(2)
  SAY("case 23: after zero-length present release %d", omp_target_is_present(arr, 2));
  #pragma omp target exit data map(delete: arr[0:5]) device(2)
  int z[4];
  #pragma omp target data map(alloc: z[0:0]) device(2)
  SAY("case 22: zero-length creates no entry %d", omp_target_is_present(z, 2));
  return 0;
}
