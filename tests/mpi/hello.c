/* MPI hello: rank, size and processor name, checked against the launcher's environment. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, len;
  char name[MPI_MAX_PROCESSOR_NAME];
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(name, &len);
  const char* er = getenv("RANK");
  const char* es = getenv("WORLD_SIZE");
  int ok = er && es && atoi(er) == rank && atoi(es) == size;
  printf("hello rank %d of %d on %s%s\n", rank, size, name, ok ? "" : " MISMATCH");
  MPI_Finalize();
  return ok ? 0 : 5;
}
