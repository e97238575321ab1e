#include "exec/orphan_guard.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/error.hpp"

namespace pe {
namespace {

constexpr pid_t kGoodbye = 0;

[[noreturn]] void guard_main(int fd) {
  // Terminal signals go to pytorch_exec, which handles them; the guard only watches.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGUSR1, SIGUSR2, SIGPIPE})
    ::signal(s, SIG_IGN);
  ::prctl(PR_SET_NAME, "pe-orphan-guard");
  std::vector<pid_t> groups;
  for (;;) {
    pid_t pgid;
    ssize_t n = ::read(fd, &pgid, sizeof pgid);
    if (n < 0 && errno == EINTR) continue;
    if (n == static_cast<ssize_t>(sizeof pgid)) {
      if (pgid == kGoodbye) ::_exit(0);
      if (pgid > 0) {
        groups.push_back(pgid);
      } else {
        for (auto& g : groups)
          if (g == -pgid) g = groups.back();
        if (!groups.empty() && groups.back() == -pgid) groups.pop_back();
      }
      continue;
    }
    break;  // EOF: pytorch_exec died
  }
  for (pid_t g : groups) ::kill(-g, SIGKILL);
  ::_exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  Pipe p = make_pipe();
  pid_t pid = ::fork();
  PE_CHECK_ERRNO(pid >= 0, "fork (orphan guard)");
  if (pid == 0) {
    p.write.reset();
    guard_main(p.read.get());
  }
  pid_ = pid;
  pipe_ = std::move(p.write);
}

OrphanGuard::~OrphanGuard() {
  pid_t bye = kGoodbye;
  write_all(pipe_.get(), reinterpret_cast<const char*>(&bye), sizeof bye);
  pipe_.reset();
  ::waitpid(pid_, nullptr, 0);
}

void OrphanGuard::watch(pid_t pgid) {
  write_all(pipe_.get(), reinterpret_cast<const char*>(&pgid), sizeof pgid);
}

void OrphanGuard::forget(pid_t pgid) {
  pid_t neg = -pgid;
  write_all(pipe_.get(), reinterpret_cast<const char*>(&neg), sizeof neg);
}

}  // namespace pe
