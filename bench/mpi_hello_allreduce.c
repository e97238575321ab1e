/* bench/mpi_launch's program: MPI_Init, one allreduce, MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, one = 1, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("hello from %d ranks, allreduce %d\n", size, sum);
  MPI_Finalize();
  return sum == size ? 0 : 1;
}
