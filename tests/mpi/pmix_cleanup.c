/* A PMIx client that asks its server to clean up after it (PMIx_Job_control, as Open MPI does for
 * its shared-memory segments).  Usage: pmix_cleanup DIR [exit|segv|held|fence]
 * Rank R makes DIR/R/file (registered with PMIX_REGISTER_CLEANUP) and DIR/R/tree/a/b plus
 * DIR/R/tree/c (DIR/R/tree registered with PMIX_REGISTER_CLEANUP_DIR and PMIX_CLEANUP_RECURSIVE),
 * prints "pmix_cleanup rank R registered", then, after a fence, finalizes and exits (with "segv",
 * rank 0 dies of SIGSEGV instead; with "held", rank 0 first leaves a process that holds its
 * connection to the server open, without pytorch_exec's marks, in a session of its own: `sleep 30`,
 * whose pid is in DIR/held.pid, so that the server never sees rank 0's connection drop; with
 * "fence", rank 1 dies of SIGSEGV and the others wait in a second fence until they are stopped).
 * (No PMIX_CLEANUP_IGNORE: PMIx 4.2.2's server crashes on it.) */
#include <dirent.h>
#include <fcntl.h>
#include <pmix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char** environ;

/* A process in a session of its own, no PYTORCH_EXEC_* variables, every socket of this one kept
 * open across its exec of sleep. */
static void leave_holder(const char* dir) {
  pid_t pid = fork();
  if (pid != 0) return;
  setsid();
  if (fork() != 0) _exit(0);
  DIR* fds = opendir("/proc/self/fd");
  struct dirent* e;
  char link[300], target[256];
  while (fds && (e = readdir(fds))) {
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0 && strncmp(target, "socket:", 7) == 0) fcntl(atoi(e->d_name), F_SETFD, 0);
  }
  char* env[64];
  int k = 0;
  for (char** v = environ; *v && k < 63; ++v)
    if (strncmp(*v, "PYTORCH_EXEC_", 13) != 0) env[k++] = *v;
  env[k] = NULL;
  char pidfile[2100];
  snprintf(pidfile, sizeof pidfile, "%s/held.pid", dir);
  FILE* f = fopen(pidfile, "w");
  if (f) {
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
  }
  char* argv[] = {"sleep", "30", NULL};
  execve("/bin/sleep", argv, env);
  _exit(127);
}

static void touch(const char* path) {
  FILE* f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(2);
  }
  fputs("x\n", f);
  fclose(f);
}

static void control(pmix_info_t* info, size_t n, const char* what) {
  pmix_status_t st = PMIx_Job_control(NULL, 0, info, n, NULL, NULL);
  if (st != PMIX_SUCCESS && st != PMIX_OPERATION_SUCCEEDED) {
    fprintf(stderr, "pmix_cleanup: PMIx_Job_control(%s) failed: %s\n", what, PMIx_Error_string(st));
    exit(3);
  }
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  pmix_proc_t me;
  pmix_status_t st = PMIx_Init(&me, NULL, 0);
  if (st != PMIX_SUCCESS) {
    fprintf(stderr, "pmix_cleanup: PMIx_Init failed: %s\n", PMIx_Error_string(st));
    return 2;
  }
  char base[2048], file[2100], tree[2100], deep[2200], other[2200];
  snprintf(base, sizeof base, "%s/%u", argv[1], me.rank);
  snprintf(file, sizeof file, "%s/file", base);
  snprintf(tree, sizeof tree, "%s/tree", base);
  snprintf(deep, sizeof deep, "%s/a", tree);
  mkdir(base, 0700);
  mkdir(tree, 0700);
  mkdir(deep, 0700);
  snprintf(deep, sizeof deep, "%s/a/b", tree);
  snprintf(other, sizeof other, "%s/c", tree);
  touch(file);
  touch(deep);
  touch(other);
  pmix_info_t info[2];
  bool yes = true;
  PMIX_INFO_LOAD(&info[0], PMIX_REGISTER_CLEANUP, file, PMIX_STRING);
  control(info, 1, "PMIX_REGISTER_CLEANUP");
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_LOAD(&info[0], PMIX_REGISTER_CLEANUP_DIR, tree, PMIX_STRING);
  PMIX_INFO_LOAD(&info[1], PMIX_CLEANUP_RECURSIVE, &yes, PMIX_BOOL);
  control(info, 2, "PMIX_REGISTER_CLEANUP_DIR");
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  printf("pmix_cleanup rank %u registered\n", me.rank);
  fflush(stdout);
  /* Every rank has registered before any dies. */
  st = PMIx_Fence(NULL, 0, NULL, 0);
  if (st != PMIX_SUCCESS) {
    fprintf(stderr, "pmix_cleanup: PMIx_Fence failed: %s\n", PMIx_Error_string(st));
    return 2;
  }
  if (argc > 2 && strcmp(argv[2], "held") == 0 && me.rank == 0) {
    leave_holder(argv[1]);
    raise(SIGSEGV);
  }
  if (argc > 2 && strcmp(argv[2], "segv") == 0 && me.rank == 0) raise(SIGSEGV);
  if (argc > 2 && strcmp(argv[2], "fence") == 0) {
    if (me.rank == 1) raise(SIGSEGV);
    PMIx_Fence(NULL, 0, NULL, 0); /* never completes: the others are stopped in it */
  }
  PMIx_Finalize(NULL, 0);
  return 0;
}
