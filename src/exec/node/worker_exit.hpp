// How a worker ended, as the node agent reports it (and the control plane carries it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace pe {

inline constexpr uint32_t kMaxWorkerError = 4096;  // bytes of WorkerExit::error

struct WorkerExit {
  int rank = 0;
  pid_t pid = -1;
  int generation = 0;
  int spawn = 0;       // 0: a rank of the job; else the number of the spawned job it belongs to
  int status = 0;      // wait status
  int exec_errno = 0;  // non-zero when execve (or binding, with bind_failed) failed in the child
  bool bind_failed = false;
  bool pmix_unfinalized = false;  // connected to the PMIx server but never finalized
  std::string error;  // the exception its TORCHELASTIC_ERROR_FILE names (torch's @record)
  // A spawned process that called PMIx_Abort (MPI_Abort) before it exited (a rank's abort is
  // reported at once, not with its exit): the abort's status and message.
  bool aborted = false;
  int abort_status = 0;
  std::string abort_message;
  // Front end only: a spawned process stopped on purpose (its MPI_Comm_spawn failed on another
  // node), whatever its status: no failure of the job.
  bool stopped = false;
};

}  // namespace pe
