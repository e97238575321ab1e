/* An MPI job on one node that uses shared memory (Open MPI's vader): after MPI_Init and a
 * barrier every rank prints the shared-memory files it has mapped ("shm_job rank R maps PATH"),
 * then, by the first argument:
 *   abort  rank 2 calls MPI_Abort(MPI_COMM_WORLD, 3)
 *   segv   rank 2 dies of SIGSEGV
 *   hang   every rank sleeps (for the launcher to be killed)
 *   exit   every rank finalizes */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void print_mapped(int rank) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[4096], last[4096] = "";
  while (f && fgets(line, sizeof line, f)) {
    char* path = strchr(line, '/');
    if (!path || (!strstr(path, "/vader_segment.") && strncmp(path, "/dev/shm/", 9) != 0)) continue;
    path[strcspn(path, "\n")] = '\0';
    if (strcmp(path, last) == 0) continue;
    snprintf(last, sizeof last, "%s", path);
    printf("shm_job rank %d maps %s\n", rank, path);
  }
  if (f) fclose(f);
  fflush(stdout);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, token = 1, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  /* Traffic between the ranks of the node, so that shared memory is set up and used. */
  MPI_Allreduce(&token, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  print_mapped(rank);
  MPI_Barrier(MPI_COMM_WORLD);
  const char* how = argc > 1 ? argv[1] : "exit";
  if (strcmp(how, "abort") == 0 && rank == 2) MPI_Abort(MPI_COMM_WORLD, 3);
  if (strcmp(how, "segv") == 0 && rank == 2) raise(SIGSEGV);
  if (strcmp(how, "hang") == 0) {
    printf("shm_job rank %d waiting\n", rank);
    fflush(stdout);
    for (;;) sleep(1);
  }
  if (strcmp(how, "exit") == 0) {
    MPI_Finalize();
    return sum == size ? 0 : 1;
  }
  MPI_Barrier(MPI_COMM_WORLD); /* the others wait here until they are stopped */
  MPI_Finalize();
  return 0;
}
