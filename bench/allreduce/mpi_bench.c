/* bench/allreduce/mpi_bench: Open MPI's side of bench/allreduce/run.
 *
 * Default: MPI_Allreduce(MPI_IN_PLACE, f32, MPI_SUM) for each size.  --p2p: the point-to-point
 * reference, rank r and rank r^1 exchanging BYTES each way at once (MPI_Irecv + MPI_Isend,
 * MPI_Waitall); the time is that of one exchange.  Which transport carries it is chosen on
 * the mpirun command line (--mca btl ...).  See common.h for the command line and the output.
 * Built by the driver at run time: mpicc -O2 -o mpi_bench mpi_bench.c
 */
#include <mpi.h>
#include <stdint.h>

#include "common.h"

static void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "mpi_bench: %s failed: %s\n", what, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

static void allreduce_once(float* buf, size_t count) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
}

static void exchange_once(const char* sbuf, char* rbuf, size_t bytes, int peer) {
  MPI_Request rq[2];
  check_mpi(MPI_Irecv(rbuf, (int)bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &rq[0]), "MPI_Irecv");
  check_mpi(MPI_Isend(sbuf, (int)bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &rq[1]), "MPI_Isend");
  check_mpi(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE), "MPI_Waitall");
}

/* One size of the allreduce: verify once, then time (--bucket: reps single allreduces back to
 * back, the checked one first); returns the wrong elements seen here. */
static long long allreduce_size(float* buf, size_t count, int iters, const pe_args* a, int rank,
                                int nranks, double* us) {
  long long wrong = 0;
  int reps = a->reps;
  for (size_t i = 0; i < count; i++) buf[i] = pe_pattern(rank, i);
  double t0 = MPI_Wtime();
  allreduce_once(buf, count);
  if (a->bucket) us[0] = (MPI_Wtime() - t0) * 1e6;
  for (size_t i = 0; i < count; i++) wrong += buf[i] != pe_expected(nranks, i);
  memset(buf, 0, count * sizeof *buf);
  for (int r = 1; a->bucket && r < reps; r++) {
    t0 = MPI_Wtime();
    allreduce_once(buf, count);
    us[r] = (MPI_Wtime() - t0) * 1e6;
  }
  if (a->bucket) reps = 0;
  for (int k = 0; k < iters && reps > 0; k++) allreduce_once(buf, count); /* warm-up batch */
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++) allreduce_once(buf, count);
    us[r] = (MPI_Wtime() - t0) * 1e6 / iters;
  }
  for (size_t i = 0; i < count; i++) wrong += buf[i] != 0.0f; /* zeros must stay zeros */
  return wrong;
}

/* One size of the exchange with rank^1: check the bytes once, then time (--bucket: reps single
 * exchanges back to back, the checked one first). */
static long long exchange_size(char* sbuf, char* rbuf, size_t bytes, int iters, const pe_args* a,
                               int rank, double* us) {
  int peer = rank ^ 1, reps = a->reps;
  long long wrong = 0;
  for (size_t i = 0; i < bytes; i++) sbuf[i] = (char)(rank * 31 + i % 251);
  double t0 = MPI_Wtime();
  exchange_once(sbuf, rbuf, bytes, peer);
  if (a->bucket) us[0] = (MPI_Wtime() - t0) * 1e6;
  for (size_t i = 0; i < bytes; i++) wrong += rbuf[i] != (char)(peer * 31 + i % 251);
  for (int r = 1; a->bucket && r < reps; r++) {
    t0 = MPI_Wtime();
    exchange_once(sbuf, rbuf, bytes, peer);
    us[r] = (MPI_Wtime() - t0) * 1e6;
  }
  if (a->bucket) reps = 0;
  for (int k = 0; k < iters && reps > 0; k++) exchange_once(sbuf, rbuf, bytes, peer);
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++) exchange_once(sbuf, rbuf, bytes, peer);
    us[r] = (MPI_Wtime() - t0) * 1e6 / iters;
  }
  return wrong;
}

int main(int argc, char** argv) {
  pe_args a;
  MPI_Init(&argc, &argv);
  if (pe_parse_args(argc, argv, &a) != 0) MPI_Abort(MPI_COMM_WORLD, 2);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (a.p2p && nranks % 2 != 0) {
    if (rank == 0) fprintf(stderr, "mpi_bench --p2p: needs an even number of ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  size_t maxb = pe_max_bytes(&a);
  char* sbuf = malloc(maxb);
  char* rbuf = malloc(maxb);
  if (!sbuf || !rbuf) {
    fprintf(stderr, "mpi_bench: cannot allocate %zu bytes\n", maxb);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    printf("@@INFO ranks=%d mode=%s\n", nranks, a.p2p ? "p2p" : "allreduce");
    fflush(stdout);
  }
  for (int s = 0; s < a.nsizes; s++) {
    double us[PE_MAX_REPS], maxus[PE_MAX_REPS];
    size_t count = a.bytes[s] / sizeof(float);
    long long wrong =
        a.p2p ? exchange_size(sbuf, rbuf, a.bytes[s], a.iters[s], &a, rank, us)
              : allreduce_size((float*)sbuf, count, a.iters[s], &a, rank, nranks, us);
    long long wrong_all = 0;
    MPI_Reduce(us, maxus, a.reps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) pe_print_row(a.bytes[s], count, wrong_all, maxus, a.reps);
  }
  free(sbuf);
  free(rbuf);
  MPI_Finalize();
  return 0;
}
