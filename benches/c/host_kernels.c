// The C twins of benches/host_kernels.rs, run by scripts/host-kernels.sh: the same kernels
// at the same sizes, built twice from this file,
//   - gcc -O3 -fopenmp: `#pragma omp parallel for` on the CPU (the baseline a porter knows);
//   - clang-19 -O3 -fopenmp -fopenmp-targets=x86_64-unknown-linux-gnu -DTARGET: `target
//     teams distribute parallel for` on libomptarget's host plugin (what OpenMP itself
//     does with no GPU), data mapped once by `target data`.
// Each case prints `case<TAB>size<TAB>median seconds` over SAMPLES samples after a warm-up.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLES 11

#ifdef TARGET
#define LOOP _Pragma("omp target teams distribute parallel for")
#define LOOP_L2 _Pragma("omp target teams distribute parallel for reduction(+ : l2) map(tofrom : l2)")
#define SIDE "clang19-target"
#else
#define LOOP _Pragma("omp parallel for")
#define LOOP_L2 _Pragma("omp parallel for reduction(+ : l2)")
#define SIDE "gcc-parallel-for"
#endif

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t, int n) {
  qsort(t, n, sizeof *t, by_value);
  return t[n / 2];
}

static void report_of(const char *name, long size, double *t, int n) {
  printf("%s\t%s\t%ld\t%.9f\n", SIDE, name, size, median(t, n));
  fflush(stdout);
}

static void report(const char *name, long size, double *t) { report_of(name, size, t, SAMPLES); }

static void saxpy(long n) {
  float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  for (long i = 0; i < n; i++) {
    x[i] = (float)(i % 1000);
    y[i] = 1.0f;
  }
  double t[SAMPLES];
  int reps = n >= (1 << 22) ? 4 : n >= (1 << 18) ? 64 : 512;
#pragma omp target data map(to : x[0 : n]) map(tofrom : y[0 : n])
  for (int s = -1; s < SAMPLES; s++) {
    double t0 = omp_get_wtime();
    for (int r = 0; r < reps; r++) {
      LOOP
      for (long i = 0; i < n; i++) y[i] += 0.5f * x[i];
    }
    if (s >= 0) t[s] = (omp_get_wtime() - t0) / reps;
  }
  report("saxpy", n, t);
  free(x);
  free(y);
}

// Samples of a Jacobi run (each a whole run of 100 steps).
#define JACOBI_SAMPLES 5

// NVIDIA's multi-GPU Jacobi on one device: sine on the left and right columns, periodic
// top and bottom, the norm each step.
static void jacobi(int nx, int ny, int niter) {
  long len = (long)nx * ny;
  float *a = calloc(len, sizeof *a), *an = calloc(len, sizeof *an);
  const float pi = 2.0f * asinf(1.0f);
  for (int iy = 0; iy < ny; iy++) {
    const float y0 = sinf(2.0f * pi * iy / (ny - 1));
    a[(long)iy * nx] = an[(long)iy * nx] = y0;
    a[(long)iy * nx + nx - 1] = an[(long)iy * nx + nx - 1] = y0;
  }
  double t[JACOBI_SAMPLES];
  float *a0 = a, *an0 = an;
  // Mapped once (the timed loop excludes it, as the Rust side's does).
#pragma omp target data map(tofrom : a0[0 : len], an0[0 : len])
  for (int s = -1; s < JACOBI_SAMPLES; s++) {
    float l2 = 1.0f;
    double t0 = omp_get_wtime();
    for (int it = 0; it < niter; it++) {
      l2 = 0.0f;
      LOOP_L2
      for (int iy = 1; iy < ny - 1; iy++)
        for (int ix = 1; ix < nx - 1; ix++) {
          const float v = 0.25f * (a[(long)iy * nx + ix + 1] + a[(long)iy * nx + ix - 1] +
                                   a[(long)(iy + 1) * nx + ix] + a[(long)(iy - 1) * nx + ix]);
          an[(long)iy * nx + ix] = v;
          const float r = v - a[(long)iy * nx + ix];
          l2 += r * r;
        }
      LOOP
      for (int ix = 1; ix < nx - 1; ix++) {
        an[ix] = an[(long)(ny - 2) * nx + ix];
        an[(long)(ny - 1) * nx + ix] = an[(long)nx + ix];
      }
      l2 = sqrtf(l2);
      float *tmp = a;
      a = an;
      an = tmp;
    }
    if (s >= 0) t[s] = omp_get_wtime() - t0;
  }
  report_of("jacobi", (long)nx * ny, t, JACOBI_SAMPLES);
  free(a0);
  free(an0);
}

// A 3-D 7-point stencil on an nx x ny x nz cube (examples/stencil3d.rs): zero inside, the
// z = 0 face at 1 and the x = 0 face at 0.5; each step sets every interior point to the
// mean of its six neighbours.
static void stencil3d(int nx, int ny, int nz, int niter) {
  long plane = (long)nx * ny, len = plane * nz;
  float *a = calloc(len, sizeof *a), *an = calloc(len, sizeof *an);
  for (int z = 0; z < nz; z++)
    for (int y = 0; y < ny; y++)
      for (int x = 0; x < nx; x++) {
        float v = z == 0 ? 1.0f : x == 0 ? 0.5f : 0.0f;
        a[z * plane + (long)y * nx + x] = an[z * plane + (long)y * nx + x] = v;
      }
  double t[JACOBI_SAMPLES];
  float *a0 = a, *an0 = an;
#pragma omp target data map(tofrom : a0[0 : len], an0[0 : len])
  for (int s = -1; s < JACOBI_SAMPLES; s++) {
    double t0 = omp_get_wtime();
    for (int it = 0; it < niter; it++) {
      LOOP
      for (int z = 1; z < nz - 1; z++)
        for (int y = 1; y < ny - 1; y++)
          for (int x = 1; x < nx - 1; x++) {
            long i = z * plane + (long)y * nx + x;
            an[i] = (1.0f / 6.0f) * (a[i - 1] + a[i + 1] + a[i - nx] + a[i + nx] + a[i - plane] + a[i + plane]);
          }
      float *tmp = a;
      a = an;
      an = tmp;
    }
    if (s >= 0) t[s] = omp_get_wtime() - t0;
  }
  report_of("stencil3d", len, t, JACOBI_SAMPLES);
  free(a0);
  free(an0);
}

// Row-wise layer normalisation (mean, variance, scale and shift), a row per iteration.
static void layernorm(int rows, int cols) {
  long len = (long)rows * cols;
  float *x = malloc(len * sizeof *x), *y = malloc(len * sizeof *y);
  float *g = malloc(cols * sizeof *g), *b = malloc(cols * sizeof *b);
  for (long i = 0; i < len; i++) x[i] = (float)((i * 7) % 101) * 0.01f;
  for (int c = 0; c < cols; c++) {
    g[c] = 1.0f + 0.001f * c;
    b[c] = 0.01f * (c % 5);
  }
  double t[SAMPLES];
#pragma omp target data map(to : x[0 : len], g[0 : cols], b[0 : cols]) map(from : y[0 : len])
  for (int s = -1; s < SAMPLES; s++) {
    double t0 = omp_get_wtime();
    LOOP
    for (int r = 0; r < rows; r++) {
      const float *xr = x + (long)r * cols;
      float mean = 0.0f, var = 0.0f;
      for (int c = 0; c < cols; c++) mean += xr[c];
      mean /= cols;
      for (int c = 0; c < cols; c++) var += (xr[c] - mean) * (xr[c] - mean);
      const float inv = 1.0f / sqrtf(var / cols + 1e-5f);
      for (int c = 0; c < cols; c++) y[(long)r * cols + c] = (xr[c] - mean) * inv * g[c] + b[c];
    }
    if (s >= 0) t[s] = omp_get_wtime() - t0;
  }
  report("layernorm", len, t);
  free(x);
  free(y);
  free(g);
  free(b);
}

// Row-wise softmax, a row per iteration.
static void softmax(int rows, int cols) {
  long len = (long)rows * cols;
  float *x = malloc(len * sizeof *x), *y = malloc(len * sizeof *y);
  for (long i = 0; i < len; i++) x[i] = (float)((i * 13) % 97) * 0.05f;
  double t[SAMPLES];
#pragma omp target data map(to : x[0 : len]) map(from : y[0 : len])
  for (int s = -1; s < SAMPLES; s++) {
    double t0 = omp_get_wtime();
    LOOP
    for (int r = 0; r < rows; r++) {
      const float *xr = x + (long)r * cols;
      float m = -INFINITY, sum = 0.0f;
      for (int c = 0; c < cols; c++) m = fmaxf(m, xr[c]);
      for (int c = 0; c < cols; c++) sum += expf(xr[c] - m);
      for (int c = 0; c < cols; c++) y[(long)r * cols + c] = expf(xr[c] - m) / sum;
    }
    if (s >= 0) t[s] = omp_get_wtime() - t0;
  }
  report("softmax", len, t);
  free(x);
  free(y);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : "";
  if (!*only || !strcmp(only, "saxpy"))
    for (long n = 1 << 16; n <= 1 << 24; n <<= 4) saxpy(n);
  if (!*only || !strcmp(only, "jacobi")) jacobi(2048, 2048, 100);
  if (!*only || !strcmp(only, "stencil3d")) stencil3d(256, 256, 256, 100);
  if (!*only || !strcmp(only, "layernorm")) layernorm(8192, 768);
  if (!*only || !strcmp(only, "softmax")) softmax(8192, 768);
  return 0;
}
