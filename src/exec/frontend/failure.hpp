// What a worker's exit means and how it is reported.  Pure functions.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace pe {

struct Failure {
  int rank = 0;
  pid_t pid = -1;
  std::string host;
  int status = 0;      // wait status
  int exec_errno = 0;  // execve (or, with bind_failed, the CPU binding) failed in the child
  std::string program;
  bool aborted = false;  // PMIx_Abort / MPI_Abort; status is then the abort code
  std::string abort_message;
  std::string error;  // the exception in its TORCHELASTIC_ERROR_FILE, if it wrote one
  bool unfinalized = false;  // exited 0 after connecting to PMIx without finalizing
  bool bind_failed = false;  // exec_errno is sched_setaffinity's
  int spawn = 0;  // > 0: a process of that spawned job (MPI_Comm_spawn), not a rank of the job
};

// A worker exit counts as a failure unless it exited with status 0 (and, if it connected to
// the PMIx server, finalized first).
bool is_failure(int wait_status, int exec_errno, bool unfinalized = false);
// The job's exit status for this failure: the exit code, 128+signal, or 126/127 when the
// program could not be executed.
int failure_exit_code(const Failure& f);
// "rank 1 (pid 42 on node1) exited with status 3", then ": ValueError: ..." with an error file
std::string describe_failure(const Failure& f);
// The report printed when the job ends because of `f`: the line above, then the tail of its
// stderr, indented.
std::string failure_report(const Failure& f, const std::vector<std::string>& stderr_tail);

}  // namespace pe
