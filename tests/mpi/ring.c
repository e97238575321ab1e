/* Passes a token around the ring LAPS times; rank 0 checks it was incremented by every rank. */
#include <mpi.h>
#include <stdio.h>

#define LAPS 5

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, token = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (int lap = 0; lap < LAPS; ++lap) {
    if (rank == 0) {
      token += 1;
      MPI_Send(&token, 1, MPI_INT, next, 0, MPI_COMM_WORLD);
      MPI_Recv(&token, 1, MPI_INT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(&token, 1, MPI_INT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      token += 1;
      MPI_Send(&token, 1, MPI_INT, next, 0, MPI_COMM_WORLD);
    }
  }
  int ok = rank != 0 || token == LAPS * size;
  if (rank == 0)
    printf("ring %d laps over %d ranks: token %d (%s)\n", LAPS, size, token, ok ? "ok" : "WRONG");
  MPI_Finalize();
  return ok ? 0 : 1;
}
