// What the kernel gives threads that read a file in small strided pieces: the probe behind
// docs/decisions/0022-a-descriptor-per-io-thread.md.
//
//   cc -O2 -pthread python/bench/strided_preads.c -o strided_preads
//   ./strided_preads FILE ROW_BYTES RUN_BYTES THREADS MODE [OWN]
//
// FILE (warm in the page cache) is read as rows of ROW_BYTES; each of THREADS threads takes its
// own block of rows and reads the first RUN_BYTES of each (a tensor-parallel rank's column
// slice) into a 4 MiB buffer of its own, reused. MODE 0: one pread per run; 1: one preadv per
// up to 511 rows, the bytes between runs read into a 64 KiB scratch buffer; 2: the file mapped,
// each run copied with memcpy. OWN 1: each thread opens FILE itself; 0 (default): every thread
// reads through one shared descriptor. Prints the best of three passes in GB/s of run bytes.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char *path;
static int shared_fd, own, mode;
static size_t row_bytes, run, nthreads, rows_total;
static char *mapped;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct job { size_t id, bytes; };

static void *work(void *arg) {
  struct job *job = arg;
  int fd = own ? open(path, O_RDONLY) : shared_fd;
  size_t per = rows_total / nthreads, r = job->id * per, end = r + per;
  size_t cap = 4 << 20, filled = 0, got = 0;
  char *dst = aligned_alloc(4096, cap), *scratch = aligned_alloc(4096, 1 << 16);
  memset(dst, 0, cap);
  memset(scratch, 0, 1 << 16);
  struct iovec iov[1024];
  while (r < end) {
    if (mode == 0) {
      if (pread(fd, dst + filled, run, r * row_bytes) == (ssize_t)run) got += run;
      filled += run;
      r++;
    } else if (mode == 1) {
      int k = 0;
      size_t first = r, room = (cap - filled) / run, n = 0;
      while (k + 2 <= 1024 && r < end && n < room) {
        iov[k++] = (struct iovec){dst + filled, run};
        filled += run;
        n++;
        r++;
        if (r < end && k + 2 <= 1024 && n < room) iov[k++] = (struct iovec){scratch, row_bytes - run};
      }
      if (preadv(fd, iov, k, first * row_bytes) > 0) got += n * run;
    } else {
      memcpy(dst + filled, mapped + r * row_bytes, run);
      filled += run;
      got += run;
      r++;
    }
    if (filled + run > cap) filled = 0;
  }
  job->bytes = got;
  if (own) close(fd);
  free(dst);
  free(scratch);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s FILE ROW_BYTES RUN_BYTES THREADS MODE [OWN]\n", argv[0]);
    return 2;
  }
  path = argv[1];
  row_bytes = strtoul(argv[2], 0, 10);
  run = strtoul(argv[3], 0, 10);
  nthreads = strtoul(argv[4], 0, 10);
  mode = atoi(argv[5]);
  own = argc > 6 && atoi(argv[6]);
  shared_fd = open(path, O_RDONLY);
  if (shared_fd < 0 || run == 0 || run > row_bytes || nthreads == 0 || nthreads > 256) {
    fprintf(stderr, "bad arguments or FILE\n");
    return 2;
  }
  size_t size = lseek(shared_fd, 0, SEEK_END);
  rows_total = size / row_bytes;
  if (mode == 2) mapped = mmap(0, size, PROT_READ, MAP_SHARED, shared_fd, 0);
  double best = 0;
  for (int pass = 0; pass < 3; pass++) {
    pthread_t threads[256];
    struct job jobs[256];
    double t0 = now();
    for (size_t i = 0; i < nthreads; i++) {
      jobs[i] = (struct job){i, 0};
      pthread_create(&threads[i], NULL, work, &jobs[i]);
    }
    size_t bytes = 0;
    for (size_t i = 0; i < nthreads; i++) {
      pthread_join(threads[i], NULL);
      bytes += jobs[i].bytes;
    }
    double rate = bytes / (now() - t0) / 1e9;
    if (rate > best) best = rate;
  }
  printf("own %d mode %d row %zu run %zu threads %zu: %.2f GB/s of slice\n", own, mode, row_bytes,
         run, nthreads, best);
  return 0;
}
