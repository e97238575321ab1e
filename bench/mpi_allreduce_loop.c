/* bench/mpi_oversubscribe's program: MPI_Init, a loop of small and medium allreduces (every
 * rank waits on every other each time, so ranks that spin instead of yielding show at once),
 * MPI_Finalize.  Usage: mpi_allreduce_loop [iterations] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int iters = argc > 1 ? atoi(argv[1]) : 500;
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  enum { kMedium = 8192 };
  double one = 1.0, sum = 0.0;
  double* in = malloc(kMedium * sizeof *in);
  double* out = malloc(kMedium * sizeof *out);
  for (int i = 0; i < kMedium; ++i) in[i] = rank;
  int ok = 1;
  for (int it = 0; it < iters; ++it) {
    MPI_Allreduce(&one, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    ok &= sum == size;
    if (it % 10 == 0) {
      MPI_Allreduce(in, out, kMedium, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      ok &= out[kMedium - 1] == size * (size - 1) / 2.0;
    }
  }
  if (rank == 0)
    printf("%d allreduce iterations over %d ranks: %s\n", iters, size, ok ? "ok" : "WRONG");
  free(in);
  free(out);
  MPI_Finalize();
  return ok ? 0 : 1;
}
