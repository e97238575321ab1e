/* The machine's state for the allreduce benchmarks: how long it takes to move 1 MiB that one
 * processor just wrote to another, as an allreduce between two ranks on one machine does all the
 * time.  Two threads, each on its own processor (the first two this process may use), hand a
 * 1 MiB buffer back and forth: each turn, one copies what the other wrote last into its own
 * buffer, and the other then copies it back.  Prints the median microseconds per turn over
 * windows of 20 turns, and the fastest and slowest window.  No part of pytorch_exec runs.
 *
 * On some virtual machines this number changes by 5x or more from one moment to the next (where
 * the host puts the two virtual processors), and so does every shared-memory allreduce timed
 * then, whatever its implementation: benchmarks print it beside their tables.
 * Usage: core_copy SECONDS */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES (1 << 20)
#define TURNS 20

static _Atomic long turn;  /* even: the main thread's move; odd: the helper's; -1: end */
static char *mine, *theirs;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static int cpus[2];

static void* helper(void* arg) {
  (void)arg;
  pin(cpus[1]);
  for (;;) {
    long v;
    while (((v = atomic_load(&turn)) & 1) == 0) {
    }
    if (v < 0) return NULL;
    memcpy(theirs, mine, BYTES);
    atomic_store(&turn, v + 1);
  }
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 0;
  if (!(seconds > 0 && seconds <= 600)) {
    fprintf(stderr, "usage: core_copy SECONDS (more than 0, at most 600)\n");
    return 2;
  }
  cpu_set_t s;
  CPU_ZERO(&s);
  sched_getaffinity(0, sizeof s, &s);
  int found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; ++c)
    if (CPU_ISSET(c, &s)) cpus[found++] = c;
  if (found < 2) {
    printf("core_copy: one processor only\n");
    return 0;
  }
  mine = aligned_alloc(4096, BYTES);
  /* half a page further: no 4K aliasing between the two buffers */
  char* area = aligned_alloc(4096, BYTES + 4096);
  if (!mine || !area) return 1;
  theirs = area + 2048;
  memset(mine, 1, BYTES);
  memset(theirs, 2, BYTES);
  pin(cpus[0]);
  pthread_t t;
  if (pthread_create(&t, NULL, helper, NULL) != 0) return 1;
  size_t cap = 1 << 16, n = 0;
  double* us = malloc(cap * sizeof *us);
  if (!us) return 1;
  double end = now() + seconds;
  while (now() < end && n < cap) {
    double t0 = now();
    for (int k = 0; k < TURNS; ++k) {
      memcpy(mine, theirs, BYTES);
      long v = atomic_load(&turn);
      atomic_store(&turn, v + 1);
      while (atomic_load(&turn) == v + 1) {
      }
    }
    us[n++] = (now() - t0) / TURNS / 2 * 1e6; /* two copies a turn */
  }
  atomic_store(&turn, -1);
  pthread_join(t, NULL);
  qsort(us, n, sizeof *us, by_value);
  printf("core_copy: 1 MiB from one processor to another: median %.0f us (windows: %.0f..%.0f, "
         "%zu)\n", us[n / 2], us[0], us[n - 1], n);
  return 0;
}
