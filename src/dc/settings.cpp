#include <config.h>

#include "dc/settings.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "dc/bootstrap.hpp"
#include "dc/socket.hpp"
#include "dc/transport.hpp"

namespace pytorch_exec::dc {
namespace {

// The transport that `source` (an option or a variable) names for a level; nullopt when unset.
std::optional<TransportKind> transport(const std::string& name, const std::string& source,
                                       bool inside_node) {
  if (name.empty()) return std::nullopt;
  auto fail = [&](const std::string& why) {
    return Error(source + "=" + name + ": the transport '" + name + "' " + why + "; " + source +
                 " takes " + transport_names(inside_node));
  };
  auto k = transport_kind(name);
  if (!k) throw fail("is unknown");
  if (!transport_built(*k)) throw fail("is not available: this libpytorch_dc was built without it");
  if (!inside_node && !transport_point_to_point(*k)) throw fail("works only inside a node");
  return k;
}

std::optional<TransportKind> env_transport(const char* name, bool inside_node) {
  return transport(env_or(name, ""), name, inside_node);
}

// PYTORCH_DC_TRANSPORT names both levels; "shm" means shm inside and tcp across.
void resolve_transports(const Options& o, Settings& s) {
  auto both = env_transport("PYTORCH_DC_TRANSPORT", true);
  auto intra = env_transport("PYTORCH_DC_INTRA", true);
  auto inter = env_transport("PYTORCH_DC_INTER", false);
  auto o_intra = transport(o.intra, "Options::intra", true);
  auto o_inter = transport(o.inter, "Options::inter", false);
  s.intra = o_intra ? *o_intra : intra ? *intra : both.value_or(TransportKind::Shm);
  if (both == TransportKind::Shm) both = TransportKind::Tcp;
  s.inter = o_inter ? *o_inter : inter ? *inter : both.value_or(TransportKind::Tcp);
}

int flag(int opt, const char* name, bool def) {
  if (opt >= 0) return opt != 0;
  std::string v = env_or(name, "");
  if (v.empty()) return def;
  if (v == "1" || v == "yes" || v == "true" || v == "on") return 1;
  if (v == "0" || v == "no" || v == "false" || v == "off") return 0;
  throw Error(std::string(name) + "=" + v + ": expected 1 or 0");
}

// The quota in processors of one cgroup directory, 0 when it sets none.
double quota_in(const std::string& dir, bool v2) {
  double quota = 0, period = 0;
  if (v2) {  // "max 100000" or "150000 100000"
    std::istringstream in(first_line(dir + "/cpu.max"));
    std::string q;
    if (!(in >> q >> period) || q == "max") return 0;
    quota = std::strtod(q.c_str(), nullptr);
  } else {  // cpu.cfs_quota_us: -1 for none
    quota = std::strtod(first_line(dir + "/cpu.cfs_quota_us").c_str(), nullptr);
    period = std::strtod(first_line(dir + "/cpu.cfs_period_us").c_str(), nullptr);
  }
  return quota > 0 && period > 0 ? quota / period : 0;
}

}  // namespace

double cgroup_cpu_limit(const std::string& proc_cgroup, const std::string& root) {
  double least = 0;
  std::istringstream lines(proc_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "0::/path" (v2), "4:cpu,cpuacct:/path" (v1, mounted at root/cpu,cpuacct)
    size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    std::string list = "," + controllers + ",";
    if (!v2 && list.find(",cpu,") == std::string::npos) continue;
    // v1's cpu hierarchy is mounted under its controllers' names, or under "cpu" alone (with
    // "cpu,cpuacct" a link to it, or the other way round).
    std::string mount = v2 ? root : root + "/" + controllers;
    if (!v2 && ::access(mount.c_str(), F_OK) != 0) mount = root + "/cpu";
    for (std::string p = path.empty() ? "/" : path;;) {
      double q = quota_in(mount + (p == "/" ? "" : p), v2);
      if (q > 0) least = least > 0 ? std::min(least, q) : q;
      if (p == "/" || p.empty()) break;
      size_t cut = p.find_last_of('/');
      p = cut == 0 || cut == std::string::npos ? "/" : p.substr(0, cut);
    }
  }
  return least;
}

namespace {

// `cpus`, no more than this process's cgroups' quota allows (rounded up), at least 1.
double within_quota(double cpus) {
  std::ifstream f("/proc/self/cgroup");
  std::stringstream text;
  text << f.rdbuf();
  double quota = cgroup_cpu_limit(text.str(), "/sys/fs/cgroup");
  if (quota > 0) cpus = std::min(cpus, std::ceil(quota));
  return std::max(1.0, cpus);
}

}  // namespace

double usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return within_quota(::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                    : machine_cpus());
}

double machine_cpus() {
  return within_quota(static_cast<double>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN))));
}

Settings resolve_settings(const Options& o) {
  Settings s;
  resolve_transports(o, s);
  s.timeout = o.timeout > 0 ? o.timeout : env_number("PYTORCH_DC_TIMEOUT", 300);
  if (!(s.timeout > 0)) throw Error("PYTORCH_DC_TIMEOUT must be more than 0 seconds");
  s.timeout = std::min(s.timeout, kMaxTimeout);  // Options::timeout of infinity: three years
  s.small_bytes = o.small_bytes > 0 ? o.small_bytes
                                    : static_cast<size_t>(env_number("PYTORCH_DC_SMALL", 32 << 10));
  s.hierarchical = flag(o.hierarchical, "PYTORCH_DC_HIERARCHICAL", true);
  s.bf16_wire = flag(o.bf16_wire, "PYTORCH_DC_BF16_WIRE", false);
  if (!env_or("PYTORCH_DC_SHM_BYTES", "").empty()) {
    s.shm_bytes = static_cast<size_t>(env_number("PYTORCH_DC_SHM_BYTES", 0));
    if (s.shm_bytes < 4096) throw Error("PYTORCH_DC_SHM_BYTES must be at least 4096");
  }
  std::string threads = env_or("PYTORCH_DC_SHM_THREADS", "auto");
  if (threads != "auto") {
    double v = env_number("PYTORCH_DC_SHM_THREADS", 0);
    if (!(v >= 1 && v <= 16) || v != static_cast<int>(v))
      throw Error("PYTORCH_DC_SHM_THREADS=" + threads +
                  " is not auto or a whole number from 1 to 16");
    s.shm_threads = static_cast<int>(v);
  }
  s.pipeline_bytes = static_cast<size_t>(env_number("PYTORCH_DC_PIPELINE_BYTES", 0));
  s.tcp_congestion = env_or("PYTORCH_DC_TCP_CONGESTION", "auto");
  check_congestion_name(s.tcp_congestion, "PYTORCH_DC_TCP_CONGESTION");
  return s;
}

}  // namespace pytorch_exec::dc
