// Starting one worker: fork, own process group, PR_SET_PDEATHSIG, stdio pipes, working
// directory, execve.  Everything the child needs is prepared before fork(), so the child only
// makes system calls.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/unique_fd.hpp"

namespace pe {

struct SpawnSpec {
  std::string path;                  // resolved program
  std::vector<std::string> argv;     // argv[0] included
  std::vector<std::string> envp;     // NAME=VALUE
  std::string wdir;                  // empty: inherit
  // Standard input: a pipe (stdin_pipe), a descriptor to dup (stdin_fd >= 0), or /dev/null.
  bool stdin_pipe = false;
  int stdin_fd = -1;
};

// A started child.  Move-only: owns the parent's ends of the pipes.  It does not kill or reap
// the child on destruction; the node agent does that explicitly.
struct ChildProcess {
  pid_t pid = -1;
  UniqueFd stdin_w;     // parent's write end, if stdin_pipe
  UniqueFd stdout_r;
  UniqueFd stderr_r;
  UniqueFd exec_err_r;  // receives errno if execve fails; EOF when exec succeeded
};

// Throws SystemError if fork or a pipe fails.
ChildProcess spawn_child(const SpawnSpec& spec);

// After the child was reaped: the execve errno it reported, or 0.
int read_exec_error(const ChildProcess& c);

// "exited with status 3", "killed by signal 9 (Killed)".
std::string describe_wait_status(int status);
// 0, the exit code, or 128+signal.
int exit_code_of(int status);

}  // namespace pe
