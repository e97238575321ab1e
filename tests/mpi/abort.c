/* Rank ABORT_RANK calls MPI_Abort(MPI_COMM_WORLD, ABORT_CODE); the others wait in a barrier. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int who = atoi(getenv("ABORT_RANK") ? getenv("ABORT_RANK") : "1");
  int code = atoi(getenv("ABORT_CODE") ? getenv("ABORT_CODE") : "7");
  if (rank == who) {
    fprintf(stderr, "rank %d aborting with %d\n", rank, code);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
