// The host copies a staged transfer makes, with ordinary and with streaming
// (non-temporal) stores: 1 GiB in 16 MiB chunks cut in 1 MiB pieces, one per thread, as
// the copy crew cuts them (runtime/src/copy_crew.rs), through a ring of 4 x 16 MiB buffers.
//   in:  pageable source (written once) -> the ring's buffers (reused, so cached)
//   out: the ring's buffers -> a fresh destination, its pages faulted in first
//        (MADV_POPULATE_WRITE, not timed), as a staged device->host copy does
//   populate: that faulting-in of a fresh 1 GiB alone, each thread its pieces
//   out, faulting: the out copy into a fresh destination not populated first
//   populate by 2 MiB: the same, each thread whole 2 MiB-aligned pieces (one page-table
//        page each, so no two threads take the same page-table lock)
// Medians of 5 runs, GB/s. Build: cc -O2 -pthread -o copyrate copyrate.c
// Run: ./copyrate [threads [offset [head]]]   (16 threads by default). `offset`: the
// destination starts that many bytes past a 2 MiB boundary (0; glibc's large allocations,
// `offload::zeroed_vec` among them, start 16 bytes past a page). `head`: streaming stores
// start at the destination's first `head`-byte boundary, 16 or 64 (16).
#define _GNU_SOURCE
#include <emmintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define TOTAL (1UL << 30)
#define CHUNK (16UL << 20)
#define DEPTH 4

static int threads = 16;
static size_t dst_off = 0, head_align = 16;
static uint8_t *ring[DEPTH];

struct job { uint8_t *src, *dst; int into_ring, streaming, t, populate; };

static void copy(uint8_t *d, const uint8_t *s, size_t n, int streaming) {
  if (!streaming) { memcpy(d, s, n); return; }
  size_t head = (head_align - ((uintptr_t)d & (head_align - 1))) & (head_align - 1);
  if (head > n) head = n;
  memcpy(d, s, head);
  size_t lines = (n - head) / 64, off = head;
  for (size_t l = 0; l < lines; l++, off += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + off));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + off + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + off + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + off + 48));
    _mm_stream_si128((__m128i *)(d + off), a);
    _mm_stream_si128((__m128i *)(d + off + 16), b);
    _mm_stream_si128((__m128i *)(d + off + 32), c);
    _mm_stream_si128((__m128i *)(d + off + 48), e);
  }
  _mm_sfence();
  memcpy(d + off, s + off, n - off);
}

static void *work(void *p) {
  struct job *j = p;
  size_t piece = CHUNK / threads;
  for (size_t c = 0; c < TOTAL / CHUNK; c++) {
    if (j->populate == 2) {
      size_t big = 2UL << 20, n = TOTAL / big;
      for (size_t k = j->t; k < n; k += threads) madvise(j->dst + k * big, big, MADV_POPULATE_WRITE);
      break;
    }
    if (j->populate) {
      madvise(j->dst + c * CHUNK + j->t * piece, piece, MADV_POPULATE_WRITE);
      continue;
    }
    uint8_t *r = ring[c % DEPTH] + j->t * piece;
    uint8_t *h = (j->into_ring ? j->src : j->dst + dst_off) + c * CHUNK + j->t * piece;
    if (j->into_ring) copy(r, h, piece, j->streaming);
    else copy(h, r, piece, j->streaming);
  }
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// mode: 0 copy, 1 populate only, 2 copy into a destination not populated first,
// 3 populate only, by 2 MiB pieces.
static double run_mode(uint8_t *src, int into_ring, int streaming, int mode) {
  double gbs[5];
  for (int k = 0; k < 5; k++) {
    uint8_t *dst = NULL, *base = NULL;
    if (!into_ring) {
      // 2 MiB-aligned, so that 2 MiB pieces are whole page-table pages.
      uint8_t *m = mmap(NULL, TOTAL + (4UL << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) { perror("mmap"); exit(1); }
      base = m;
      dst = (uint8_t *)(((uintptr_t)m + (2UL << 20) - 1) & ~((2UL << 20) - 1));
      // The copies write from dst + dst_off (see work()); populate whole pages around it.
      if (mode == 0) madvise(dst, TOTAL + (2UL << 20), MADV_POPULATE_WRITE);
    }
    pthread_t th[256];
    struct job js[256];
    double t0 = now();
    for (int t = 0; t < threads; t++) {
      js[t] = (struct job){src, dst, into_ring, streaming, t, mode == 1 ? 1 : mode == 3 ? 2 : 0};
      pthread_create(&th[t], NULL, work, &js[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    gbs[k] = TOTAL / (now() - t0) / 1e9;
    if (dst) munmap(base, TOTAL + (4UL << 20));
  }
  qsort(gbs, 5, sizeof gbs[0], cmp);
  return gbs[2];
}

static double run(uint8_t *src, int into_ring, int streaming) { return run_mode(src, into_ring, streaming, 0); }

int main(int argc, char **argv) {
  if (argc > 1) threads = atoi(argv[1]);
  if (argc > 2) dst_off = strtoul(argv[2], NULL, 10);
  if (argc > 3) head_align = strtoul(argv[3], NULL, 10);
  if (threads < 1 || threads > 256 || CHUNK % threads) { fprintf(stderr, "threads: 1-256, dividing 16 MiB\n"); return 1; }
  if (dst_off > (1UL << 20) || (head_align != 16 && head_align != 64)) { fprintf(stderr, "offset: 0-1048576; head: 16 or 64\n"); return 1; }
  uint8_t *src = malloc(TOTAL);
  if (!src) return 1;
  memset(src, 7, TOTAL);
  for (int i = 0; i < DEPTH; i++) { ring[i] = aligned_alloc(4096, CHUNK); memset(ring[i], 1, CHUNK); }
  printf("copyrate, %d threads, 1 GiB in 16 MiB chunks, ring of %d, destination %zu bytes past 2 MiB, streaming from a %zu-byte boundary (GB/s, median of 5)\n", threads, DEPTH, dst_off, head_align);
  for (int round = 0; round < 2; round++) {
    printf("in  (pageable -> ring): ordinary %.1f  streaming %.1f\n", run(src, 1, 0), run(src, 1, 1));
    printf("out (ring -> fresh):    ordinary %.1f  streaming %.1f\n", run(src, 0, 0), run(src, 0, 1));
    printf("populate a fresh 1 GiB: by 1 MiB pieces %.1f  by 2 MiB pieces %.1f\n", run_mode(src, 0, 0, 1), run_mode(src, 0, 0, 3));
    printf("out, faulting (no populate first): ordinary %.1f  streaming %.1f\n", run_mode(src, 0, 0, 2), run_mode(src, 0, 1, 2));
  }
  return 0;
}
