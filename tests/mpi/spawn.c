/* MPI_Comm_spawn: the parent job spawns N copies of this program (argv: N [HOST] [FAIL]) and
 * both sides exchange messages over the intercommunicator.  The parent's rank 0 sends each child
 * 100 + its rank; every child answers with twice that and its node: the processor name and
 * the network namespace (separate hosts on one machine share a name, not a namespace); a broadcast
 * from the parent and an allreduce across the intercommunicator check the collective path.
 * FAIL (a child rank) makes that child exit with status 3 after MPI_Finalize; SPAWN_CHILD_SLEEP
 * (seconds, in the environment) makes the children sleep before they answer; SPAWN_HOST_KEY names
 * the info key HOST goes under ("host" by default); SPAWN_CHILD_PROGRAM the program the children
 * run (this one by default).  MPI_ERRORS_RETURN on the parent: a refused spawn prints
 * "spawn failed: ..." and aborts with 4 (the other parents would wait in MPI_Comm_spawn for the
 * root, as under mpirun), SPAWN_FAIL_LINGER seconds later. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int child(MPI_Comm parent, int fail_rank) {
  int rank, size, prank, v, len;
  char name[MPI_MAX_PROCESSOR_NAME];
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(name, &len);
  char net[64] = "?";
  ssize_t n = readlink("/proc/self/ns/net", net, sizeof net - 1);
  if (n > 0) net[n] = '\0';
  snprintf(name + len, MPI_MAX_PROCESSOR_NAME - len, " %s", net);
  const char* nap = getenv("SPAWN_CHILD_SLEEP");
  if (nap) sleep((unsigned)atoi(nap));
  MPI_Recv(&v, 1, MPI_INT, 0, 7, parent, MPI_STATUS_IGNORE);
  int answer[2] = {2 * v, rank};
  MPI_Send(answer, 2, MPI_INT, 0, 8, parent);
  MPI_Send(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, 9, parent);
  int token = 0;
  MPI_Bcast(&token, 1, MPI_INT, 0, parent);
  int mine = 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, parent);
  MPI_Comm_remote_size(parent, &prank);
  printf("child %d of %d: got %d, token %d, parents %d, sum %d\n", rank, size, v, token, prank,
         sum);
  fflush(stdout);
  MPI_Comm_disconnect(&parent);
  MPI_Finalize();
  return rank == fail_rank ? 3 : 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm parent;
  MPI_Comm_get_parent(&parent);
  int fail_rank = argc > 3 ? atoi(argv[3]) : -1;
  if (parent != MPI_COMM_NULL) return child(parent, fail_rank);

  int n = argc > 1 ? atoi(argv[1]) : 2;
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Info info = MPI_INFO_NULL;
  if (argc > 2 && strcmp(argv[2], "-") != 0) {
    MPI_Info_create(&info);
    const char* key = getenv("SPAWN_HOST_KEY"); /* "host" unless it says "add-host" */
    MPI_Info_set(info, key ? key : "host", argv[2]);
  }
  char fail[16];
  snprintf(fail, sizeof fail, "%d", fail_rank);
  char* child_argv[] = {"1", "-", fail, NULL};
  MPI_Comm inter;
  int errs[64];
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const char* program = getenv("SPAWN_CHILD_PROGRAM");
  int rc = MPI_Comm_spawn(program ? program : argv[0], child_argv, n, info, 0, MPI_COMM_WORLD,
                          &inter, errs);
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len;
    MPI_Error_string(rc, msg, &len);
    printf("spawn failed: %s\n", msg);
    fflush(stdout);
    const char* linger = getenv("SPAWN_FAIL_LINGER");
    if (linger) sleep((unsigned)atoi(linger));
    MPI_Abort(MPI_COMM_WORLD, 4);
  }
  int remote;
  MPI_Comm_remote_size(inter, &remote);
  int ok = remote == n;
  if (rank == 0) {
    for (int i = 0; i < n; ++i) {
      int v = 100 + i;
      MPI_Send(&v, 1, MPI_INT, i, 7, inter);
    }
    for (int i = 0; i < n; ++i) {
      int answer[2];
      char name[MPI_MAX_PROCESSOR_NAME];
      MPI_Recv(answer, 2, MPI_INT, i, 8, inter, MPI_STATUS_IGNORE);
      MPI_Recv(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, i, 9, inter, MPI_STATUS_IGNORE);
      ok = ok && answer[0] == 2 * (100 + i) && answer[1] == i;
      printf("parent: child %d answered %d from %s\n", i, answer[0], name);
    }
  }
  int token = 42;
  MPI_Bcast(&token, 1, MPI_INT, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter);
  int mine = 10, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, inter);  /* the children's values: n */
  ok = ok && sum == n;
  printf("parent %d of %d: spawned %d, sum %d: %s\n", rank, size, remote, sum, ok ? "ok" : "BAD");
  fflush(stdout);
  MPI_Comm_disconnect(&inter);
  MPI_Finalize();
  return ok ? 0 : 5;
}
