#include "topology/topology_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/log.hpp"
#include "topology/hwloc_init.hpp"

extern char** environ;

namespace pe::topo {
namespace {

// Bumped when what is written (or how it is loaded) changes.
constexpr const char* kCacheSchema = "pytorch_exec topology cache 1";

std::string read_small(const char* path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str().substr(0, 4096);
}

// The entries of a directory, sorted ("" when it does not exist).
std::string listing(const char* path) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(path)) {
    while (struct dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::string s;
  for (const auto& n : names) s += n + "\n";
  return s;
}

std::string hostname() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "localhost";
  std::string s;
  for (char c : std::string(h))  // a file name: letters, digits, '-', '.', '_' only
    s +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_') ? c : '_';
  return s.empty() ? "localhost" : s;
}

std::string cache_dir() {
  const char* set = std::getenv("PYTORCH_EXEC_TOPOLOGY_CACHE");
  if (set && (!std::strcmp(set, "0") || !std::strcmp(set, "off"))) return "";
  if (set && *set) return set;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg == '/')
    return std::string(xdg) + "/pytorch_exec";
  if (const char* home = std::getenv("HOME"); home && *home == '/')
    return std::string(home) + "/.cache/pytorch_exec";
  return "";
}

// mkdir -p, the last component 0700; false when it is not a directory of ours afterwards.
bool make_dir(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), i == dir.size() ? 0700 : 0755) != 0 && errno != EEXIST)
        return false;
    }
  struct stat st;
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid();
}

std::string prefix() { return "topology-" + hostname() + "-"; }

}  // namespace

std::string topology_cache_file() {
#if HWLOC_API_VERSION < 0x00020100
  return "";  // (no HWLOC_TOPOLOGY_FLAG_THISSYSTEM_ALLOWED_RESOURCES before hwloc 2.1)
#endif
  std::string dir = cache_dir();
  if (dir.empty()) return "";
  std::string what = kCacheSchema;
  what += "\nhwloc " + std::to_string(hwloc_get_api_version()) + "\n";
  what += read_small("/proc/sys/kernel/random/boot_id");
  what += hostname() + "\n";
  what += read_small("/sys/devices/system/cpu/online");
  what += read_small("/sys/devices/system/cpu/present");
  for (const char* d : {"/sys/bus/pci/devices", "/sys/class/net", "/sys/class/infiniband",
                        "/proc/driver/nvidia/gpus"})
    what += std::string(d) + ":\n" + listing(d);
  std::vector<std::string> hwloc_vars;
  for (char** e = environ; e && *e; ++e)
    if (!std::strncmp(*e, "HWLOC_", 6)) hwloc_vars.emplace_back(*e);
  std::sort(hwloc_vars.begin(), hwloc_vars.end());
  for (const auto& v : hwloc_vars) what += v + "\n";
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : what) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return dir + "/" + prefix() + hex + ".xml";
}

bool write_topology_cache(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (!make_dir(dir)) return false;
  hwloc_topology_t full;
  if (init_hwloc_topology(&full) != 0) return false;
  hwloc_topology_set_io_types_filter(full, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_flags(full, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  char* xml = nullptr;
  int len = 0;
  bool ok = hwloc_topology_load(full) == 0 &&
            hwloc_topology_export_xmlbuffer(full, &xml, &len, 0) == 0 && xml && len > 1;
  std::string text = ok ? std::string(xml, static_cast<size_t>(len - 1)) : std::string();
  if (xml) hwloc_free_xmlbuffer(full, xml);
  hwloc_topology_destroy(full);
  if (!ok) return false;
  std::string tmp = dir + "/.tmp-" + std::to_string(::getpid()) + "-" + prefix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bool written = ::close(fd) == 0 && done == text.size();
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  // The files of this host for other boots, versions or devices are stale.
  const std::string mine = path.substr(dir.size() + 1), host = prefix();
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != mine && name.rfind(host, 0) == 0) ::unlinkat(::dirfd(d), e->d_name, 0);
    }
    ::closedir(d);
  }
  logger("topo")->debug("topology of this machine kept in {}", path);
  return true;
}

}  // namespace pe::topo
