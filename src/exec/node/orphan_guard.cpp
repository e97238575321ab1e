#include "exec/node/orphan_guard.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "exec/node/child_process.hpp"

namespace pe {
namespace {

constexpr pid_t kGoodbye = 0;
constexpr pid_t kDirectory = INT32_MIN;    // followed by a uint32 length and the path
constexpr pid_t kMarker = INT32_MIN + 1;  // followed by a uint32 length and the marker

bool has_marker(pid_t pid, const std::string& marker) {
  const std::vector<std::string> env = environ_of(pid);
  return std::find(env.begin(), env.end(), marker) != env.end();
}

// The processes that left the ranks' process groups (setsid) and so outlived the group kill:
// those with this node agent's `marker` in their environment.  Returns how many were killed.
int kill_marked_orphans(const std::string& marker) {
  int killed = 0;
  DIR* d = ::opendir("/proc");
  if (!d) return 0;
  while (struct dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 1 || pid == ::getpid()) continue;
    auto p = static_cast<pid_t>(pid);
    if (!has_marker(p, marker)) continue;
    pid_t group = ::getpgid(p);
    if (group > 1 && group != ::getpgrp()) ::kill(-group, SIGKILL);
    ::kill(p, SIGKILL);
    ++killed;
  }
  ::closedir(d);
  return killed;
}

// The pipe's messages, read as many bytes at a time as have come (the node agent writes a
// launch's process groups at once).
class PipeReader {
 public:
  explicit PipeReader(int fd) : fd_(fd) {}
  bool read_exact(void* out, size_t len) {
    while (buf_.size() - pos_ < len) {
      buf_.erase(0, pos_);
      pos_ = 0;
      char chunk[4096];
      ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(chunk, static_cast<size_t>(n));
    }
    std::memcpy(out, buf_.data() + pos_, len);
    pos_ += len;
    return true;
  }

 private:
  int fd_;
  std::string buf_;
  size_t pos_ = 0;
};

[[noreturn]] void guard_main(int fd) {
  // Terminal signals go to pytorch_exec, which handles them; the guard only watches.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGUSR1, SIGUSR2, SIGPIPE})
    ::signal(s, SIG_IGN);
  ::prctl(PR_SET_NAME, "pe-orphan-guard");
  std::vector<pid_t> groups;
  std::vector<std::string> dirs;
  std::string marker;
  PipeReader in(fd);
  for (;;) {
    pid_t pgid;
    if (in.read_exact(&pgid, sizeof pgid)) {
      if (pgid == kGoodbye) ::_exit(0);
      if (pgid == kDirectory || pgid == kMarker) {
        uint32_t len = 0;
        std::string text;
        if (!in.read_exact(&len, sizeof len) || len > 4096) break;
        text.resize(len);
        if (!in.read_exact(text.data(), len)) break;
        if (pgid == kDirectory)
          dirs.push_back(text);
        else
          marker = text;
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
  // Then what the ranks started in sessions of their own, which the dead process no longer
  // reaps as their subreaper: three looks 20 ms apart (their parents die meanwhile), then more
  // while they still find some, for a second at most.
  for (int i = 0; i < 50 && !marker.empty(); ++i) {
    if (kill_marked_orphans(marker) == 0 && i >= 2) break;
    ::usleep(20000);
  }
  // A process killed a moment ago may still finish a system call that made an entry in one
  // (remove_all then fails, the directory not empty): tried again, for a second at most.
  for (const auto& d : dirs) {
    std::error_code ec;
    for (int i = 0; i < 50; ++i) {
      std::filesystem::remove_all(d, ec);
      if (!std::filesystem::exists(d, ec)) break;
      ::usleep(20000);
    }
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

void OrphanGuard::watch(const std::vector<pid_t>& pgids) {
  write_all(pipe_.get(), reinterpret_cast<const char*>(pgids.data()), pgids.size() * sizeof(pid_t));
}

void OrphanGuard::send_text(pid_t kind, const std::string& text) {
  uint32_t len = static_cast<uint32_t>(text.size());
  std::string msg(reinterpret_cast<const char*>(&kind), sizeof kind);
  msg.append(reinterpret_cast<const char*>(&len), sizeof len);
  msg += text;
  write_all(pipe_.get(), msg.data(), msg.size());
}

void OrphanGuard::remove_on_death(const std::string& dir) { send_text(kDirectory, dir); }

void OrphanGuard::kill_marked_on_death(const std::string& marker) { send_text(kMarker, marker); }

void OrphanGuard::forget(pid_t pgid) {
  pid_t neg = -pgid;
  write_all(pipe_.get(), reinterpret_cast<const char*>(&neg), sizeof neg);
}

}  // namespace pe
