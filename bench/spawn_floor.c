/* The floor for bench/launch: start N copies of a program with vfork+execve, as fast as one
 * process can, and wait for them all.  No pipes, no environment of their own, no supervision:
 * what any launcher must at least spend on this machine.
 * Usage: spawn_floor N PROGRAM */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: spawn_floor N PROGRAM\n");
    return 2;
  }
  int n = atoi(argv[1]);
  for (int i = 0; i < n; ++i) {
    pid_t pid = vfork();
    if (pid == 0) {
      execve(argv[2], argv + 2, environ);
      _exit(127);
    }
    if (pid < 0) {
      perror("vfork");
      return 1;
    }
  }
  int status, failed = 0;
  while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  return failed;
}
