/* A row-wise layer normalisation in OpenMP's teams form, written for offload as the C
 * original of examples/ports/layernorm.rs (our own program, not taken from elsewhere): a
 * team per row with thread_limit(bs) threads, the block size bs chosen at run time, and
 * per row three `parallel for` loops, two of them `reduction(+)` (the row's sum and its
 * sum of squares), then gamma and beta.
 *
 * The inputs are -1, 0 and 1, so that for widths up to 128 every sum is exact whatever
 * order a runtime adds in: the port's lines equal this program's line for line
 * (scripts/differential.sh runs both on host devices, the lines below). Lines starting
 * with '#' (times) are not compared.
 *
 *   layernorm [rows] [width] [bs] [reps]      (4096 128 256 10)
 *
 * port run: 1000 128 256 2
 * port run: 300 128 32 1
 * port run: 257 64 1024 1
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  const int rows = argc > 1 ? atoi(argv[1]) : 4096;
  const int w = argc > 2 ? atoi(argv[2]) : 128;
  const int bs = argc > 3 ? atoi(argv[3]) : 256;
  const int reps = argc > 4 ? atoi(argv[4]) : 10;
  if (rows < 1 || w < 1 || bs < 1 || bs > 1024 || reps < 1) {
    fprintf(stderr, "usage: layernorm [rows] [width] [bs (1 to 1024)] [reps]\n");
    return 1;
  }
  const float eps = 1e-5f;
  const size_t n = (size_t)rows * w;
  float *x = malloc(n * sizeof(float));
  float *y = malloc(n * sizeof(float));
  float *gamma = malloc(w * sizeof(float));
  float *beta = malloc(w * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x[i] = (float)((int)((i * 7 + i / w * 3) % 3) - 1);
  for (int c = 0; c < w; c++) {
    gamma[c] = 1.0f + c / 256.0f;
    beta[c] = c / 512.0f - 0.125f;
  }
  double t0 = 0.0;
#pragma omp target data map(to : x[0:n], gamma[0:w], beta[0:w]) map(from : y[0:n])
  {
    /* One warm-up normalisation, then `reps` timed. */
    for (int r = 0; r <= reps; r++) {
      if (r == 1)
        t0 = omp_get_wtime();
#pragma omp target teams distribute num_teams(rows) thread_limit(bs)
      for (int row = 0; row < rows; row++) {
        const float *xr = x + (size_t)row * w;
        float *yr = y + (size_t)row * w;
        float sum = 0.0f;
#pragma omp parallel for reduction(+ : sum) num_threads(bs)
        for (int c = 0; c < w; c++)
          sum += xr[c];
        const float mean = sum / w;
        float sq = 0.0f;
#pragma omp parallel for reduction(+ : sq) num_threads(bs)
        for (int c = 0; c < w; c++) {
          const float d = xr[c] - mean;
          sq += d * d;
        }
        const float rstd = 1.0f / sqrtf(sq / w + eps);
#pragma omp parallel for num_threads(bs)
        for (int c = 0; c < w; c++)
          yr[c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
      }
    }
  }
  const double t = (omp_get_wtime() - t0) / reps;
  printf("# time per normalisation: %.3f ms\n", t * 1e3);
  double total = 0.0;
  for (size_t i = 0; i < n; i++)
    total += y[i];
  printf("rows %d width %d\n", rows, w);
  printf("checksum %.17e\n", total);
  const int pick[3] = {0, rows / 2, rows - 1};
  for (int k = 0; k < 3; k++) {
    const float *yr = y + (size_t)pick[k] * w;
    printf("row %d: %.9e %.9e %.9e %.9e\n", pick[k], yr[0], yr[1], yr[w / 2], yr[w - 1]);
  }
  free(x);
  free(y);
  free(gamma);
  free(beta);
  return 0;
}
