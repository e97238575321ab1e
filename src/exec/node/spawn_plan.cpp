#include "exec/node/spawn_plan.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "common/strings.hpp"
#include "exec/frontend/allocation.hpp"

namespace pe {
namespace {

std::string hosts_of(const std::vector<NodeMap>& nodes) {
  std::vector<std::string> h;
  for (const auto& n : nodes) h.push_back(n.host);
  return join(h, ",");
}

// Why `name`, a host of no rank, cannot take an app's processes.
std::string not_a_node(const std::string& name, const JobMap& gen, bool add_hosts) {
  bool listed = std::any_of(gen.spawn_hosts.begin(), gen.spawn_hosts.end(),
                            [&name](const NodeMap& n) { return n.host == name; });
  if (listed && !add_hosts)
    return "host " + name + " runs none of the job's ranks, and a job on this machine alone " +
           "has no daemons to start there (give the job a rank there)";
  std::string others = gen.spawn_hosts.empty() ? "" : "; the host list's: " + hosts_of(gen.spawn_hosts);
  return "host " + name + " is not in the job's host list (its nodes: " + hosts_of(gen.nodes) +
         others + ")";
}

// The nodes an app may use (indices into `all`, the job's nodes then the hosts without ranks):
// its hosts (from "host" and the hostfile), else the job's nodes.
std::vector<size_t> candidates(const pmix::SpawnApp& app, const JobMap& gen,
                               const std::vector<NodeMap>& all) {
  std::vector<std::string> names = app.hosts;
  if (!app.hostfile.empty()) {
    std::ifstream in(app.hostfile);
    if (!in) throw SpawnError("cannot read the hostfile " + app.hostfile);
    try {
      for (const auto& hs : parse_hostfile(in, app.hostfile)) names.push_back(hs.host);
    } catch (const std::exception& e) {
      throw SpawnError(e.what());
    }
  }
  std::vector<size_t> out;
  if (names.empty()) {
    for (size_t i = 0; i < gen.nodes.size(); ++i) out.push_back(i);
    return out;
  }
  std::string self = gen.nodes.size() == 1 ? gen.nodes[0].host : "";
  for (const auto& name : names) {
    size_t i = 0;
    while (i < all.size() && all[i].host != name) ++i;
    // On a single-node job, this machine's other names (localhost, its short name) are it.
    if (i == all.size() && !self.empty() && is_local_host(name, self)) i = 0;
    if (i == all.size()) throw SpawnError(not_a_node(name, gen, all.size() > gen.nodes.size()));
    if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  }
  return out;
}

}  // namespace

std::string spawn_namespace(const std::string& job_nspace, int number) {
  return job_nspace + ".spawn" + std::to_string(number);
}

SpawnJob plan_spawn(const pmix::SpawnRequest& req, const JobMap& gen, const std::vector<int>& used,
                    bool oversubscribe, bool add_hosts) {
  if (req.apps.empty()) throw SpawnError("a spawn request without programs");
  SpawnJob job;
  job.parent_nspace = req.parent_nspace;
  job.parent_rank = req.parent_rank;
  job.apps = req.apps;
  std::vector<NodeMap> all = gen.nodes;
  if (add_hosts) all.insert(all.end(), gen.spawn_hosts.begin(), gen.spawn_hosts.end());
  std::vector<int> load = used;
  load.resize(all.size(), 0);
  std::vector<std::vector<int>> ranks(all.size());
  int next = 0;
  for (size_t a = 0; a < req.apps.size(); ++a) {
    const auto& app = req.apps[a];
    if (app.maxprocs < 1)
      throw SpawnError("a spawn request for " + std::to_string(app.maxprocs) + " processes of " +
                       app.cmd);
    auto nodes = candidates(app, gen, all);
    long free = 0;
    bool unlimited = false;
    for (size_t i : nodes) {
      int slots = all[i].slots;
      unlimited = unlimited || slots == 0;
      free += std::max(0, slots - load[i]);
    }
    if (!unlimited && !oversubscribe && app.maxprocs > free)
      throw SpawnError("MPI_Comm_spawn of " + std::to_string(app.maxprocs) + " process(es) of " +
                       app.cmd + " but the job's nodes have " + std::to_string(free) +
                       " free slot(s) (add --oversubscribe to place more processes than slots)");
    for (int k = 0; k < app.maxprocs; ++k) {
      // The first node with a free slot (or without a limit), else the least loaded.
      size_t pick = nodes.front();
      bool found = false;
      for (size_t i : nodes)
        if (all[i].slots == 0 || load[i] < all[i].slots) {
          pick = i, found = true;
          break;
        }
      if (!found)
        for (size_t i : nodes)
          if (load[i] - all[i].slots < load[pick] - all[pick].slots) pick = i;
      ++load[pick];
      ranks[pick].push_back(next++);
      job.appnum.push_back(static_cast<int>(a));
    }
  }
  job.map.world_size = next;
  job.map.ranks.resize(static_cast<size_t>(next));
  for (size_t i = 0; i < all.size(); ++i) {
    if (ranks[i].empty()) continue;
    NodeMap n;
    n.host = all[i].host;
    n.node_rank = static_cast<int>(job.map.nodes.size());
    n.slots = all[i].slots;
    n.ranks = ranks[i];
    for (size_t lr = 0; lr < n.ranks.size(); ++lr)
      job.map.ranks[static_cast<size_t>(n.ranks[lr])] =
          RankLocation{n.node_rank, static_cast<int>(lr)};
    job.map.nodes.push_back(std::move(n));
  }
  int total = 0;  // the job's universe (0: its size, where the slots are not limited)
  for (const auto& n : gen.nodes) total = n.slots > 0 && total >= 0 ? total + n.slots : -1;
  job.universe_size = std::max(total, 0);
  return job;
}

std::string resolve_spawn_program(const std::string& cmd, const std::string& cwd,
                                  const std::string& path) {
  auto runnable = [](const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (cmd.empty()) throw SpawnError("a spawn request without a program");
  if (cmd.find('/') != std::string::npos) {
    std::string p = cmd[0] == '/' || cwd.empty() ? cmd : cwd + "/" + cmd;
    if (runnable(p)) return p;
    throw SpawnError("cannot run " + cmd + ": not an executable file");
  }
  for (const auto& dir : split(path, ':')) {
    std::string p = (dir.empty() ? std::string(".") : dir) + "/" + cmd;
    if (runnable(p)) return p;
  }
  throw SpawnError("cannot find " + cmd + " on PATH");
}

}  // namespace pe
