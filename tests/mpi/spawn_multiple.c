/* MPI_Comm_spawn_multiple: two commands (this program twice, with different arguments and
 * counts 1 and 2) in one spawned job.  Each child reports its MPI_APPNUM, its argument and its
 * rank in the children's world; the parent checks the sizes and sums the application numbers
 * over the intercommunicator. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm parent;
  MPI_Comm_get_parent(&parent);
  if (parent != MPI_COMM_NULL) {
    int rank, size, flag, *appnum;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    int a = flag ? *appnum : -1;
    printf("child %d of %d: appnum %d arg %s\n", rank, size, a, argc > 1 ? argv[1] : "-");
    fflush(stdout);
    int sum = 0;
    MPI_Allreduce(&a, &sum, 1, MPI_INT, MPI_SUM, parent);
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
  }
  char* args0[] = {"first", NULL};
  char* args1[] = {"second", NULL};
  char* cmds[2] = {argv[0], argv[0]};
  char** args[2] = {args0, args1};
  int counts[2] = {1, 2};
  MPI_Info infos[2] = {MPI_INFO_NULL, MPI_INFO_NULL};
  MPI_Comm inter;
  int errs[3];
  MPI_Comm_spawn_multiple(2, cmds, args, counts, infos, 0, MPI_COMM_WORLD, &inter, errs);
  int remote;
  MPI_Comm_remote_size(inter, &remote);
  int zero = 0, sum = -1;
  MPI_Allreduce(&zero, &sum, 1, MPI_INT, MPI_SUM, inter);  /* appnums 0 + 1 + 1 */
  int ok = remote == 3 && sum == 2;
  printf("parent: %d children, appnum sum %d: %s\n", remote, sum, ok ? "ok" : "BAD");
  fflush(stdout);
  MPI_Comm_disconnect(&inter);
  MPI_Finalize();
  return ok ? 0 : 5;
}
