// Orphan guard: a small process forked at start-up that outlives pytorch_exec by a moment.
// pytorch_exec tells it every worker process group it creates; if pytorch_exec dies without
// saying goodbye (even by SIGKILL), the guard sees its pipe close and SIGKILLs those process
// groups.  PR_SET_PDEATHSIG alone only reaches each worker's leader, not what it started.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/unique_fd.hpp"

namespace pe {

class OrphanGuard {
 public:
  // Forks the guard.  Throws SystemError if it cannot.
  OrphanGuard();
  // Tells the guard the job ended normally: it exits without killing anything.
  ~OrphanGuard();
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  // Process groups to kill if pytorch_exec dies (a launch's, in one message).
  void watch(const std::vector<pid_t>& pgids);
  // The group's leader was reaped: forget it (its id may be reused).
  void forget(pid_t pgid);
  // A directory to remove if pytorch_exec dies (the PMIx server's temporary directory).
  void remove_on_death(const std::string& dir);
  // The workers carry `marker` (PYTORCH_EXEC_AGENT=..., one per node agent) in their
  // environment, and so does what they start: if pytorch_exec dies, the processes carrying it
  // that left the watched groups (setsid) are killed too, with their process groups.
  void kill_marked_on_death(const std::string& marker);
  // The guard's own process (a child of this one, not a stray).
  pid_t pid() const { return pid_; }

 private:
  void send_text(pid_t kind, const std::string& text);

  UniqueFd pipe_;
  pid_t pid_ = -1;
};

}  // namespace pe
