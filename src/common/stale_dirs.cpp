#include "common/stale_dirs.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/unique_fd.hpp"

namespace pe {

namespace {

const char kMark[] = ".pytorch_exec_owner";
const char kMagic[] = "pytorch_exec-owner-1";

std::string read_line(const std::string& path) {
  std::string s = read_file(path);
  return s.substr(0, s.find('\n'));
}

// Field 22 of /proc/WHO/stat (the start time in clock ticks since boot); "" if there is no such
// process.  `pid`, if given, gets field 1.
std::string start_time(const std::string& who, long* pid = nullptr) {
  std::string s = read_file("/proc/" + who + "/stat");
  size_t open = s.find(' '), close = s.rfind(')');  // the name may hold blanks, ')' and newlines
  if (open == std::string::npos || close == std::string::npos) return "";
  if (pid) *pid = std::atol(s.substr(0, open).c_str());
  std::istringstream in(s.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 22) return field;
  }
  return "";
}

// Whether /proc is this process's PID namespace's (it may be another's, as after
// `unshare --pid --fork` without --mount-proc): then pids read there are not ours.
bool own_proc() {
  long pid = 0;
  return !start_time("self", &pid).empty() && pid == ::getpid();
}

std::string pid_namespace() {
  std::error_code ec;
  auto target = std::filesystem::read_symlink("/proc/self/ns/pid", ec);
  return ec ? "" : target.string();
}

std::string boot_id() { return read_line("/proc/sys/kernel/random/boot_id"); }

struct Mark {
  long pid = 0;
  std::string start, pidns, boot;
};

bool read_mark(const std::string& dir, Mark& m) {
  std::ifstream f(dir + "/" + kMark);
  std::string magic;
  return static_cast<bool>(f >> magic >> m.pid >> m.start >> m.pidns >> m.boot) &&
         magic == kMagic && m.pid > 0;
}

}  // namespace

bool mark_owner(const std::string& dir) {
  if (!own_proc()) return false;
  std::string start = start_time("self"), ns = pid_namespace(), boot = boot_id();
  if (start.empty() || ns.empty() || boot.empty()) return false;
  std::ofstream f(dir + "/" + kMark);
  f << kMagic << ' ' << ::getpid() << ' ' << start << ' ' << ns << ' ' << boot << '\n';
  return static_cast<bool>(f);
}

int remove_stale(const std::string& parent) {
  const std::string ns = pid_namespace(), boot = boot_id();
  if (ns.empty() || boot.empty() || !own_proc()) return 0;
  int removed = 0;
  // readdir, not std::filesystem: a /tmp of a thousand entries took 0.5 ms of every launch.
  DIR* d = ::opendir(parent.c_str());
  if (!d) return 0;
  std::vector<std::string> dirs;
  while (struct dirent* e = ::readdir(d))
    if (std::strncmp(e->d_name, "pytorch_exec.", 13) == 0) dirs.push_back(parent + "/" + e->d_name);
  ::closedir(d);
  for (const std::string& dir : dirs) {
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    Mark m;
    if (!read_mark(dir, m) || m.pidns != ns || m.boot != boot) continue;
    if (start_time(std::to_string(m.pid)) == m.start) continue;  // its maker is alive
    std::error_code rm;
    if (std::filesystem::remove_all(dir, rm) > 0 && !rm) ++removed;
  }
  return removed;
}

}  // namespace pe
