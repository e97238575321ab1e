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
#include <vector>

#include "common/log.hpp"
#include "common/unique_fd.hpp"
#include "topology/hwloc_init.hpp"

extern char** environ;

namespace pe::topo {
namespace {

// Bumped when what is written (or how it is loaded) changes.
constexpr const char* kCacheSchema = "pytorch_exec topology cache 1";

std::string read_small(const char* path) { return read_file(path, 4096); }

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
  if (set && *set) {
    std::string d = set;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    return d;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg == '/')
    return std::string(xdg) + "/pytorch_exec";
  if (const char* home = std::getenv("HOME"); home && *home == '/')
    return std::string(home) + "/.cache/pytorch_exec";
  return "";
}

// A directory of ours that nobody else may write in (not a link).
bool own_dir(const std::string& dir) {
  struct stat st;
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & 022) == 0;
}

// mkdir -p, the last component 0700; false when it is not a directory of ours afterwards.
bool make_dir(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), i == dir.size() ? 0700 : 0755) != 0 && errno != EEXIST)
        return false;
    }
  return own_dir(dir);
}

constexpr size_t kMaxCacheBytes = 64u << 20;
constexpr int kKeepFiles = 16;  // of one host: concurrent jobs (their cgroups) each have one

std::string prefix() { return "topology-" + hostname() + "-"; }

}  // namespace

std::string topology_cache_file() {
#if HWLOC_API_VERSION < 0x00020100
  return "";  // (no HWLOC_TOPOLOGY_FLAG_THISSYSTEM_ALLOWED_RESOURCES before hwloc 2.1)
#endif
  // hwloc told to read another machine or another root: that is no topology of this system.
  for (const char* v : {"HWLOC_XMLFILE", "HWLOC_SYNTHETIC", "HWLOC_FSROOT", "HWLOC_THISSYSTEM",
                        "HWLOC_CPUID_PATH", "HWLOC_COMPONENTS"})
    if (std::getenv(v)) return "";
  std::string dir = cache_dir();
  if (dir.empty() || dir[0] != '/') return "";
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
  // The GPUs a job may see (CUDA numbers only the visible ones; a device cgroup hides others):
  // each job's own file.
  for (const char* v : {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                        "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"})
    if (const char* x = std::getenv(v)) what += std::string(v) + "=" + x + "\n";
  what += read_small("/proc/self/cgroup");
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : what) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return dir + "/" + prefix() + hex + ".xml";
}

std::string read_topology_cache(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (!own_dir(dir)) return "";
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      (st.st_mode & 022) == 0 && static_cast<size_t>(st.st_size) <= kMaxCacheBytes) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    text.resize(done);
  }
  ::close(fd);
  return text;
}

std::string discover_topology_xml() {
  hwloc_topology_t full;
  if (init_hwloc_topology(&full) != 0) return "";
  hwloc_topology_set_io_types_filter(full, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_flags(full, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  char* xml = nullptr;
  int len = 0;
  bool ok = hwloc_topology_load(full) == 0 &&
            hwloc_topology_export_xmlbuffer(full, &xml, &len, 0) == 0 && xml && len > 1;
  std::string text = ok ? std::string(xml, static_cast<size_t>(len - 1)) : std::string();
  if (xml) hwloc_free_xmlbuffer(full, xml);
  hwloc_topology_destroy(full);
  return text;
}

bool write_topology_cache(const std::string& path, const std::string& text) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (text.empty() || !make_dir(dir)) return false;
  std::string tmp = dir + "/.tmp-" + std::to_string(::getpid()) + "-" + prefix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return false;
  bool written = write_all(fd, text.data(), text.size());
  written = ::close(fd) == 0 && written;
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  // This host's files (exactly topology-HOST-<16 hex>.xml), the newest kKeepFiles kept: others
  // are of other boots, devices or jobs.
  const std::string host = prefix();
  std::vector<std::pair<long long, std::string>> mine;  // (mtime, name)
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() != host.size() + 16 + 4 || name.rfind(host, 0) != 0 ||
          name.compare(name.size() - 4, 4, ".xml") != 0 ||
          name.find_first_not_of("0123456789abcdef", host.size()) != name.size() - 4)
        continue;
      struct stat st;
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        mine.emplace_back(static_cast<long long>(st.st_mtime), name);
    }
    std::sort(mine.rbegin(), mine.rend());
    for (size_t i = kKeepFiles; i < mine.size(); ++i)
      ::unlinkat(::dirfd(d), mine[i].second.c_str(), 0);
    ::closedir(d);
  }
  logger("topo")->debug("topology of this machine kept in {}", path);
  return true;
}

}  // namespace pe::topo
