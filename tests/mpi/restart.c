/* Rank 1 fails right after MPI_Init in the first generation; every generation allreduces. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* rc = getenv("TORCHELASTIC_RESTART_COUNT");
  int restart = rc ? atoi(rc) : -1;
  if (rank == 1 && restart == 0) exit(3);
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("restart %d rank %d sum %d\n", restart, rank, sum);
  MPI_Finalize();
  return sum == size ? 0 : 1;
}
