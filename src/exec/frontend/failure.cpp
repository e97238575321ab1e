#include "exec/frontend/failure.hpp"

#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#include "common/strings.hpp"
#include "exec/node/child_process.hpp"

namespace pe {

bool is_failure(int wait_status, int exec_errno, bool unfinalized) {
  return exec_errno != 0 || exit_code_of(wait_status) != 0 || unfinalized;
}

int failure_exit_code(const Failure& f) {
  if (f.exec_errno && f.bind_failed) return 1;
  if (f.exec_errno) return f.exec_errno == ENOENT ? 127 : 126;
  if (f.aborted) return f.status & 0xff;
  if (f.unfinalized && exit_code_of(f.status) == 0) return 1;
  return exit_code_of(f.status);
}

std::string describe_failure(const Failure& f) {
  std::string who = (f.spawn ? "spawned process " + std::to_string(f.rank) +
                                   " of MPI_Comm_spawn #" + std::to_string(f.spawn)
                             : "rank " + std::to_string(f.rank)) +
                    " (pid " + std::to_string(f.pid) + (f.host.empty() ? "" : " on " + f.host) +
                    ")";
  if (f.exec_errno && f.bind_failed)
    return who + " could not be bound to its processors: " + std::strerror(f.exec_errno);
  if (f.exec_errno)
    return who + " could not execute " + f.program + ": " + std::strerror(f.exec_errno);
  if (f.aborted)
    return who + " called MPI_Abort/PMIx_Abort with status " + std::to_string(f.status) +
           // Open MPI 4.1 sends "N/A" when MPI_Abort has no message.
           (f.abort_message.empty() || f.abort_message == "N/A" ? "" : ": " + f.abort_message);
  // Only for a rank that initialized PMIx and exited by itself: a signal is the whole story.
  if (f.unfinalized && !WIFSIGNALED(f.status))
    return who + " " + describe_wait_status(f.status) +
           " without calling MPI_Finalize (it had connected to the PMIx server)";
  // torch's @record wrote the uncaught exception: its first line (the traceback is on stderr).
  std::string error = f.error.substr(0, f.error.find('\n'));
  return who + " " + describe_wait_status(f.status) +
         (error.empty() ? "" : ": " + printable(error, 400));
}

std::string failure_report(const Failure& f, const std::vector<std::string>& stderr_tail) {
  std::string out = "pytorch_exec: " + describe_failure(f) + "\n";
  if (!stderr_tail.empty()) {
    out += "pytorch_exec: last lines of rank " + std::to_string(f.rank) + "'s stderr:\n";
    for (const auto& l : stderr_tail) out += "    " + l + "\n";
  }
  return out;
}

}  // namespace pe
