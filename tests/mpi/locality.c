/* Which peers Open MPI finds sharing this rank's package and core (MPI_Comm_split_type), and the
   first processor the rank may run on: under --bind-to core, from the launcher's
   PMIX_LOCALITY_STRING. */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>

static int split_size(int type) {
  MPI_Comm c;
  int size = -1;
  MPI_Comm_split_type(MPI_COMM_WORLD, type, 0, MPI_INFO_NULL, &c);
  if (c != MPI_COMM_NULL) {
    MPI_Comm_size(c, &size);
    MPI_Comm_free(&c);
  }
  return size;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, cpu = -1, ncpus = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    ncpus = CPU_COUNT(&set);
    for (int i = 0; i < CPU_SETSIZE && cpu < 0; ++i)
      if (CPU_ISSET(i, &set)) cpu = i;
  }
  printf("rank %d cpu %d of %d socket %d core %d\n", rank, cpu, ncpus,
         split_size(OMPI_COMM_TYPE_SOCKET), split_size(OMPI_COMM_TYPE_CORE));
  MPI_Finalize();
  return 0;
}
