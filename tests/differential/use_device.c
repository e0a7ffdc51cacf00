/* use_device_ptr of a pointer whose mapped section starts past element 0: the device
   address that corresponds to the pointer (the section's device address minus its offset),
   and a zero-length section at that base names the section's entry. */
#include <stdlib.h>
#include "common.h"
int main(void) {
  int *A = malloc(256 * sizeof(int));
  int *h = A;
  for (int k = 0; k < 256; k++) A[k] = k;
  #pragma omp target enter data map(to: A[64:128]) device(1)
  long section = (long)omp_get_mapped_ptr(&h[64], 1);
  SAY("A[0] present %d, A[64] present %d", omp_target_is_present(h, 1), omp_target_is_present(&h[64], 1));
  #pragma omp target data use_device_ptr(A) device(1)
  SAY("use_device_ptr(A): section minus A %ld, A itself %d", section - (long)A, A == h);
  int *B = &h[100];
  #pragma omp target data use_device_ptr(B) device(1)
  SAY("use_device_ptr(&A[100]): minus section %ld", (long)B - section);
  #pragma omp target enter data map(alloc: A[0:0]) device(1)
  #pragma omp target exit data map(release: A[64:128]) device(1)
  SAY("enter A[0:0], release A[64:128]: present %d", omp_target_is_present(&h[64], 1));
  #pragma omp target exit data map(present, release: A[0:0]) device(1)
  SAY("present release A[0:0]: present %d", omp_target_is_present(&h[64], 1));
  int *C = malloc(16 * sizeof(int));
  int *hc = C;
  #pragma omp target data use_device_ptr(C) device(1)
  SAY("use_device_ptr of unmapped C: C itself %d, null %d", C == hc, C == NULL);
  free(C);
  free(h);
  return 0;
}
