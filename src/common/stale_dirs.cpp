#include "common/stale_dirs.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace pe {

namespace {

const char kMark[] = ".pytorch_exec_owner";
const char kMagic[] = "pytorch_exec-owner-1";

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// Field 22 of /proc/PID/stat (the start time in clock ticks since boot); "" if there is no such
// process.
std::string start_time(long pid) {
  std::string s = read_line("/proc/" + std::to_string(pid) + "/stat");
  size_t close = s.rfind(')');  // the command name may hold blanks and parentheses
  if (close == std::string::npos) return "";
  std::istringstream in(s.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 22) return field;
  }
  return "";
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
  std::string start = start_time(::getpid()), ns = pid_namespace(), boot = boot_id();
  if (start.empty() || ns.empty() || boot.empty()) return false;
  std::ofstream f(dir + "/" + kMark);
  f << kMagic << ' ' << ::getpid() << ' ' << start << ' ' << ns << ' ' << boot << '\n';
  return static_cast<bool>(f);
}

int remove_stale(const std::string& parent) {
  const std::string ns = pid_namespace(), boot = boot_id();
  if (ns.empty() || boot.empty()) return 0;
  int removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(parent, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("pytorch_exec.", 0) != 0) continue;
    const std::string dir = it->path().string();
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    Mark m;
    if (!read_mark(dir, m) || m.pidns != ns || m.boot != boot) continue;
    if (start_time(m.pid) == m.start) continue;  // its maker is alive
    std::error_code rm;
    if (std::filesystem::remove_all(dir, rm) > 0 && !rm) ++removed;
  }
  return removed;
}

}  // namespace pe
