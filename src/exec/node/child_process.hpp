// Starting one worker: own process group, PR_SET_PDEATHSIG, stdio pipes (stdout: a
// pseudo-terminal on request), working directory,
// execve.  The child is created as posix_spawn does it, with clone(CLONE_VM | CLONE_VFORK) on a
// stack of its own: the launcher's memory is not copied, and the launcher resumes once the child
// has exec'd (or failed to, in which case the child stores errno in the launcher's memory).
// Everything the child needs is prepared before the clone, so the child only makes system calls.
#pragma once

#include <sys/types.h>

#include <exception>
#include <string>
#include <vector>

#include "common/unique_fd.hpp"

namespace pe {

struct SpawnSpec {
  std::string path;               // resolved program
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> envp;  // NAME=VALUE
  std::string wdir;               // empty: inherit
  // Standard input: a pipe (stdin_pipe), a descriptor to dup (stdin_fd >= 0), or /dev/null.
  bool stdin_pipe = false;
  int stdin_fd = -1;
  std::vector<int> cpus;  // bind to these OS processors before exec; empty: unbound
  // Standard output on a pseudo-terminal of this size (not the controlling terminal, no output
  // processing), as a program run from a terminal has it: C's stdio then flushes each line.
  // Where no pseudo-terminal can be had (no /dev/ptmx), a pipe as without.
  bool stdout_tty = false;
  unsigned short tty_rows = 0, tty_cols = 0;
};

// A started child.  Move-only: owns the parent's ends of the pipes.  It does not kill or reap
// the child on destruction; the node agent does that explicitly.
struct ChildProcess {
  pid_t pid = -1;
  UniqueFd stdin_w;  // parent's write end, if stdin_pipe
  UniqueFd stdout_r;  // a pipe's read end, or a pseudo-terminal's master (EIO once it is done)
  UniqueFd stderr_r;
  int exec_errno = 0;        // non-zero: the child could not exec (it exits with 127)
  bool bind_failed = false;  // exec_errno came from sched_setaffinity, not execve
};

// Throws SystemError if clone or a pipe fails.  From one thread at a time (the first one's
// stack serves every child).
ChildProcess spawn_child(const SpawnSpec& spec);

// Starts every spec, out[i] for specs[i], from up to kMaxSpawnThreads threads (this one and
// helpers; one for every 4 specs, no more than the processors this process may use).  Stops at
// the first failure, which it returns: the children started by then are in out (pid > 0).  From
// one thread only, and not at the same time as spawn_child.
constexpr size_t kMaxSpawnThreads = 8;
std::exception_ptr spawn_children(const std::vector<const SpawnSpec*>& specs,
                                  std::vector<ChildProcess>& out);

// The environment of process `pid` (NAME=VALUE each, read whole from /proc); empty when it is
// gone or a zombie.
std::vector<std::string> environ_of(pid_t pid);

// "exited with status 3", "killed by signal 9 (Killed)".
std::string describe_wait_status(int status);
// 0, the exit code, or 128+signal.
int exit_code_of(int status);

}  // namespace pe
