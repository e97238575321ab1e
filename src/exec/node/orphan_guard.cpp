#include "exec/node/orphan_guard.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace pe {
namespace {

constexpr pid_t kGoodbye = 0;
constexpr pid_t kDirectory = INT32_MIN;  // followed by a uint32 length and the path

bool read_exact(int fd, void* buf, size_t len) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void guard_main(int fd) {
  // Terminal signals go to pytorch_exec, which handles them; the guard only watches.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGUSR1, SIGUSR2, SIGPIPE})
    ::signal(s, SIG_IGN);
  ::prctl(PR_SET_NAME, "pe-orphan-guard");
  std::vector<pid_t> groups;
  std::vector<std::string> dirs;
  for (;;) {
    pid_t pgid;
    if (read_exact(fd, &pgid, sizeof pgid)) {
      if (pgid == kGoodbye) ::_exit(0);
      if (pgid == kDirectory) {
        uint32_t len = 0;
        std::string dir;
        if (!read_exact(fd, &len, sizeof len) || len > 4096) break;
        dir.resize(len);
        if (!read_exact(fd, dir.data(), len)) break;
        dirs.push_back(dir);
        continue;
      }
      if (pgid > 0) {
        groups.push_back(pgid);
      } else {
        auto it = std::find(groups.begin(), groups.end(), -pgid);
        if (it != groups.end()) {
          *it = groups.back();
          groups.pop_back();
        }
      }
      continue;
    }
    break;  // EOF: pytorch_exec died
  }
  for (pid_t g : groups) ::kill(-g, SIGKILL);
  for (const auto& d : dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
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

void OrphanGuard::remove_on_death(const std::string& dir) {
  pid_t marker = kDirectory;
  uint32_t len = static_cast<uint32_t>(dir.size());
  std::string msg(reinterpret_cast<const char*>(&marker), sizeof marker);
  msg.append(reinterpret_cast<const char*>(&len), sizeof len);
  msg += dir;
  write_all(pipe_.get(), msg.data(), msg.size());
}

void OrphanGuard::forget(pid_t pgid) {
  pid_t neg = -pgid;
  write_all(pipe_.get(), reinterpret_cast<const char*>(&neg), sizeof neg);
}

}  // namespace pe
