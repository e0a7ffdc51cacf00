// The C twin of benches/host_launch.rs for libomptarget's host plugin (clang-19,
// -fopenmp-targets=x86_64-unknown-linux-gnu; run by scripts/host-launch.sh): the time of
// one `target teams distribute parallel for` of y[i] += a * x[i] over n = 1, 1024 and
// 65536 floats already mapped by `target data`. Per size it prints the median over 51
// samples of the time per launch, each sample a run of LAUNCHES launches (argv[1],
// default 2000) after a warm-up. Then the same for `target enter data map(to:)` + `target
// exit data map(from:)` of a new 4 KiB array (1024 floats).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define N 65536
#define SAMPLES 51

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int launches = argc > 1 ? atoi(argv[1]) : 2000;
  float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) {
    x[i] = (float)i;
    y[i] = 1.0f;
  }
  const int sizes[] = {1, 1024, N};
  float a = 0.5f;
  double per[SAMPLES];
#pragma omp target data map(to : x[0:N]) map(tofrom : y[0:N])
  for (int s = 0; s < 3; s++) {
    int n = sizes[s];
    for (int k = -5; k < SAMPLES; k++) { // five warm-up samples
      double t0 = omp_get_wtime();
      for (int r = 0; r < launches; r++) {
#pragma omp target teams distribute parallel for
        for (int i = 0; i < n; i++)
          y[i] += a * x[i];
      }
      if (k >= 0)
        per[k] = (omp_get_wtime() - t0) / launches;
    }
    qsort(per, SAMPLES, sizeof(double), by_value);
    printf("libomptarget host plugin n=%d: median %.2f us per launch (min %.2f, max %.2f)\n", n,
           per[SAMPLES / 2] * 1e6, per[0] * 1e6, per[SAMPLES - 1] * 1e6);
  }
  float *z = x + N / 2;
  for (int k = -5; k < SAMPLES; k++) {
    double t0 = omp_get_wtime();
    for (int r = 0; r < launches; r++) {
#pragma omp target enter data map(to : z[0:1024])
#pragma omp target exit data map(from : z[0:1024])
    }
    if (k >= 0)
      per[k] = (omp_get_wtime() - t0) / launches;
  }
  qsort(per, SAMPLES, sizeof(double), by_value);
  printf("libomptarget host plugin enter(to)+exit(from) 4 KiB: median %.2f us per pair (min %.2f, max %.2f)\n",
         per[SAMPLES / 2] * 1e6, per[0] * 1e6, per[SAMPLES - 1] * 1e6);
  printf("checksum %g\n", (double)y[N - 1]);
  free(x);
  free(y);
  return 0;
}
