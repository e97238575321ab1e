/* MPI_Allreduce, MPI_Alltoall and every-pair point-to-point connectivity, checked. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, bad = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  /* allreduce of 1000 doubles */
  double in[1000], out[1000];
  for (int i = 0; i < 1000; ++i) in[i] = rank * 1000.0 + i;
  MPI_Allreduce(in, out, 1000, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < 1000; ++i)
    if (out[i] != 1000.0 * size * (size - 1) / 2 + (double)i * size) bad = 1;
  /* alltoall: element j from rank r is r*100+j */
  int* send = malloc(sizeof(int) * size);
  int* recv = malloc(sizeof(int) * size);
  for (int j = 0; j < size; ++j) send[j] = rank * 100 + j;
  MPI_Alltoall(send, 1, MPI_INT, recv, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < size; ++r)
    if (recv[r] != r * 100 + rank) bad = 1;
  /* connectivity: every pair exchanges a message */
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    int msg = rank, got = -1;
    MPI_Sendrecv(&msg, 1, MPI_INT, peer, 7, &got, 1, MPI_INT, peer, 7, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    if (got != peer) bad = 1;
  }
  int anybad = 0;
  MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf("collectives over %d ranks: %s\n", size, anybad ? "WRONG" : "ok");
  free(send);
  free(recv);
  MPI_Finalize();
  return anybad;
}
