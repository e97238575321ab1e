/* bench/allreduce/common.h: what dc_bench, mpi_bench and p2p_tcp share (C and C++).
 *
 * Command line (written by bench/allreduce/run):
 *   --sizes BYTES:ITERS,...   message sizes, and how many operations one timed batch holds
 *   --reps K                  timed batches per size (after one untimed batch, the warm-up)
 *   --p2p                     mpi_bench: time an MPI_Isend+MPI_Irecv exchange instead
 *   --bind                    p2p_tcp: pin its two threads to two different processors
 *   --cc NAME                 p2p_tcp: the connection's TCP congestion control ("auto": as
 *                             the DataChannel's default chooses it; "system": unchanged)
 *   --bucket                  as a training step: for each size, K operations back to back
 *                             (ITERS is ignored), each timed on its own, with no warm-up and no
 *                             barrier between them; the first is the checked one and the rest
 *                             work on zeros (T1 is the first operation of the process at that
 *                             size; the driver drops the first few)
 *
 * Output, on rank 0, one line per size, for the driver to parse:
 *   @@ROW BYTES COUNT WRONG T1 ... TK
 * T1..TK: the time of one operation in microseconds, for each timed batch (batch time / ITERS),
 * the maximum over ranks; WRONG: elements that did not hold the expected result.
 * Also one `@@INFO key=value ...` line before the rows.
 *
 * Test pattern: rank r holds (r+1)*(1+i%5) at element i, so the sum over n ranks is
 * n(n+1)/2*(1+i%5): exact in f32, and different per element so a misplaced chunk shows.
 */
#ifndef PE_BENCH_ALLREDUCE_COMMON_H
#define PE_BENCH_ALLREDUCE_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PE_MAX_SIZES 64
#define PE_MAX_REPS 256

typedef struct {
  size_t bytes[PE_MAX_SIZES];
  int iters[PE_MAX_SIZES];
  int nsizes;
  int reps;
  int p2p;
  int bind;
  int bucket;
  const char* cc;
} pe_args;

/* Returns 0 and fills `a`, or prints what is wrong and returns -1. */
static inline int pe_parse_args(int argc, char** argv, pe_args* a) {
  memset(a, 0, sizeof *a);
  a->reps = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--p2p")) {
      a->p2p = 1;
    } else if (!strcmp(argv[i], "--bind")) {
      a->bind = 1;
    } else if (!strcmp(argv[i], "--bucket")) {
      a->bucket = 1;
    } else if (!strcmp(argv[i], "--cc") && i + 1 < argc) {
      a->cc = argv[++i];
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      a->reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      const char* p = argv[++i];
      while (*p) {
        char* end;
        if (a->nsizes == PE_MAX_SIZES) break;
        unsigned long long b = strtoull(p, &end, 10);
        int it = 1;
        if (*end == ':') it = (int)strtol(end + 1, &end, 10);
        if (end == p || (*end && *end != ',') || b == 0 || it < 1) {
          fprintf(stderr, "%s: bad --sizes entry at '%s' (want BYTES:ITERS,...)\n", argv[0], p);
          return -1;
        }
        a->bytes[a->nsizes] = (size_t)b;
        a->iters[a->nsizes++] = it;
        p = *end ? end + 1 : end;
      }
    } else {
      fprintf(stderr,
              "usage: %s --sizes BYTES:ITERS,... [--reps K] [--bucket] [--p2p] [--bind] [--cc NAME]\n",
              argv[0]);
      return -1;
    }
  }
  if (a->nsizes == 0 || a->reps < 1 || a->reps > PE_MAX_REPS) {
    fprintf(stderr, "%s: need --sizes, and 1 <= --reps <= %d\n", argv[0], PE_MAX_REPS);
    return -1;
  }
  return 0;
}

static inline size_t pe_max_bytes(const pe_args* a) {
  size_t m = 0;
  for (int i = 0; i < a->nsizes; i++)
    if (a->bytes[i] > m) m = a->bytes[i];
  return m;
}

static inline float pe_pattern(int rank, size_t i) {
  return (float)(rank + 1) * (float)(1 + i % 5);
}

static inline float pe_expected(int nranks, size_t i) {
  return (float)(nranks * (nranks + 1) / 2) * (float)(1 + i % 5);
}

static inline void pe_print_row(size_t bytes, size_t count, long long wrong, const double* us,
                                int reps) {
  printf("@@ROW %zu %zu %lld", bytes, count, wrong);
  for (int r = 0; r < reps; r++) printf(" %.3f", us[r]);
  printf("\n");
  fflush(stdout);
}

#endif
