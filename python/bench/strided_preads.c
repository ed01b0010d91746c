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
// each run copied with memcpy; 3: each thread maps its block afresh every pass and copies up to
// 1,024 runs per process_vm_readv (a file truncated underneath gives EFAULT, not SIGBUS); 4: 3
// with the block populated first (MADV_POPULATE_READ); 5: the fresh mapping, memcpy per run;
// 6: io_uring, up to 256 reads a submission.
// OWN 1: each thread opens FILE itself; 0 (default): every thread
// reads through one shared descriptor. Prints the best of three passes in GB/s of run bytes.
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdatomic.h>
#include <sys/syscall.h>
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

// Mode 6: a minimal io_uring (raw system calls, no liburing): a ring per thread, up to 256
// reads submitted and reaped per io_uring_enter.
struct ring {
  int fd;
  unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe *sqes;
  struct io_uring_cqe *cqes;
};

static int ring_init(struct ring *r, unsigned entries) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  r->fd = syscall(__NR_io_uring_setup, entries, &p);
  if (r->fd < 0) return -1;
  size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  char *sq = mmap(0, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
  char *cq = mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_CQ_RING);
  r->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
  if (sq == MAP_FAILED || cq == MAP_FAILED || r->sqes == MAP_FAILED) return -1;
  r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
  r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
  r->sq_array = (unsigned *)(sq + p.sq_off.array);
  r->cq_head = (unsigned *)(cq + p.cq_off.head);
  r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
  r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
  r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
  return 0;
}

// Reads n runs (dst[k] <- run bytes at off[k]) through the ring; returns the bytes read.
static size_t ring_reads(struct ring *r, int fd, char **dst, size_t *off, unsigned n) {
  unsigned tail = *r->sq_tail;
  for (unsigned k = 0; k < n; k++) {
    unsigned i = (tail + k) & *r->sq_mask;
    struct io_uring_sqe *e = &r->sqes[i];
    memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_READ;
    e->fd = fd;
    e->addr = (unsigned long)dst[k];
    e->len = run;
    e->off = off[k];
    r->sq_array[i] = i;
  }
  atomic_store_explicit((_Atomic unsigned *)r->sq_tail, tail + n, memory_order_release);
  if (syscall(__NR_io_uring_enter, r->fd, n, n, IORING_ENTER_GETEVENTS, NULL, 0) < 0) {
    perror("io_uring_enter");
    exit(1);
  }
  size_t got = 0;
  unsigned head = *r->cq_head, seen = 0;
  while (seen < n) {
    unsigned ctail = atomic_load_explicit((_Atomic unsigned *)r->cq_tail, memory_order_acquire);
    for (; head != ctail; head++, seen++) {
      int res = r->cqes[head & *r->cq_mask].res;
      if (res > 0) got += res;
    }
    atomic_store_explicit((_Atomic unsigned *)r->cq_head, head, memory_order_release);
    if (seen < n) syscall(__NR_io_uring_enter, r->fd, 0, n - seen, IORING_ENTER_GETEVENTS, NULL, 0);
  }
  return got;
}

static void *work(void *arg) {
  struct job *job = arg;
  int fd = own ? open(path, O_RDONLY) : shared_fd;
  size_t per = rows_total / nthreads, r = job->id * per, end = r + per;
  size_t cap = 4 << 20, filled = 0, got = 0;
  char *dst = aligned_alloc(4096, cap), *scratch = aligned_alloc(4096, 1 << 16);
  memset(dst, 0, cap);
  memset(scratch, 0, 1 << 16);
  struct iovec iov[1024];
  if (mode == 6) {
    struct ring ring;
    if (ring_init(&ring, 256)) { perror("io_uring_setup"); exit(1); }
    char *dsts[256];
    size_t offs[256];
    while (r < end) {
      unsigned n = 0;
      while (n < 256 && r < end && filled + run <= cap) {
        dsts[n] = dst + filled;
        offs[n] = r * row_bytes;
        n++;
        filled += run;
        r++;
      }
      got += ring_reads(&ring, fd, dsts, offs, n);
      if (filled + run > cap) filled = 0;
    }
    close(ring.fd);
  }
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
    } else if (mode == 2) {
      memcpy(dst + filled, mapped + r * row_bytes, run);
      filled += run;
      got += run;
      r++;
    } else {
      // Modes 3-5: the thread maps its own block of rows afresh (the cost of mapping, faulting
      // and unmapping included), then copies runs out of it.
      size_t lo = (r * row_bytes) & ~(size_t)4095, hi = end * row_bytes;
      char *map = mmap(0, hi - lo, PROT_READ, MAP_SHARED, fd, lo);
      if (map == MAP_FAILED) { perror("mmap"); exit(1); }
      if (mode == 4 && madvise(map, hi - lo, 22 /* MADV_POPULATE_READ */)) { perror("madvise"); exit(1); }
      while (r < end) {
        if (mode == 5) {
          memcpy(dst + filled, map + (r * row_bytes - lo), run);
          filled += run;
          got += run;
          r++;
        } else {
          // process_vm_readv from our own mapping: a truncated file gives EFAULT, not SIGBUS.
          struct iovec local[1024], remote[1024];
          int k = 0;
          while (k < 1024 && r < end && filled + run <= cap) {
            local[k] = (struct iovec){dst + filled, run};
            remote[k] = (struct iovec){map + (r * row_bytes - lo), run};
            k++;
            filled += run;
            r++;
          }
          ssize_t n = process_vm_readv(getpid(), local, k, remote, k, 0);
          if (n < 0) { perror("process_vm_readv"); exit(1); }
          got += n;
        }
        if (filled + run > cap) filled = 0;
      }
      munmap(map, hi - lo);
      break;
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
