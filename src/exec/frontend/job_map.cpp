#include "exec/frontend/job_map.hpp"

#include <algorithm>
#include <climits>
#include <fstream>

#include "common/error.hpp"
#include "exec/frontend/allocation.hpp"

namespace pe {

long max_processes(bool here) {
  const long limit = 4194304;
  long v = 0;
  if (here) std::ifstream("/proc/sys/kernel/pid_max") >> v;
  return v > 0 && v < limit ? v : limit;
}

JobMap map_single_node(const std::string& host, int np) {
  if (long most = max_processes(); np > most)
    throw UsageError("-n " + std::to_string(np) + ": more processes than this machine can run (" +
                     std::to_string(most) + ", kernel.pid_max)");
  JobMap m;
  m.world_size = np;
  NodeMap node;
  node.host = host;
  for (int r = 0; r < np; ++r) {
    node.ranks.push_back(r);
    m.ranks.push_back(RankLocation{0, r});
  }
  m.nodes.push_back(std::move(node));
  return m;
}


JobMap map_of(const Allocation& alloc, const std::vector<std::vector<int>>& ranks, int np);

JobMap map_job(const Allocation& alloc, const MapRequest& req) {
  const size_t n = alloc.nodes.size();
  const std::string per_node = req.npernode_option.empty()
                                   ? "-N " + std::to_string(req.npernode)
                                   : req.npernode_option;
  std::vector<int> cap(n), count(n, 0);
  for (size_t i = 0; i < n; ++i) {
    cap[i] = alloc.nodes[i].slots;
    if (req.npernode > 0) {
      if (alloc.limited && !req.oversubscribe && req.npernode > cap[i])
        throw UsageError(per_node + ": node " + alloc.nodes[i].host + " has " +
                         std::to_string(cap[i]) + " slot(s) in " + alloc.source +
                         " (add --oversubscribe to place more ranks than slots)");
      cap[i] = req.npernode;
    }
  }
  long long total = 0;
  for (int c : cap) total += c;
  int np = req.np > 0 ? req.np : static_cast<int>(std::min<long long>(total, INT_MAX));
  if (np <= 0) throw UsageError(alloc.source + " has no slots");
  if (np / static_cast<long long>(n) >= max_processes(false))
    throw UsageError("-n " + std::to_string(np) + ": more processes than " + std::to_string(n) +
                     " node(s) can run (Linux runs at most " +
                     std::to_string(max_processes(false)) + " on one)");
  if (np > total) {
    if (req.npernode > 0)
      throw UsageError("-n " + std::to_string(np) + " with " + per_node +
                       " needs " + std::to_string((np + req.npernode - 1) / req.npernode) +
                       " nodes; " + alloc.source + " has " + std::to_string(n));
    if (!req.oversubscribe)
      throw UsageError("-n " + std::to_string(np) + " but " + alloc.source + " has " +
                       std::to_string(total) +
                       " slots (add --oversubscribe to place more ranks than slots)");
  }
  std::vector<std::vector<int>> ranks(n);
  int next = 0;
  if (req.by_node) {
    // Round-robin while there are free slots, then (oversubscribed) round-robin regardless.
    bool free_left = true;
    while (next < np) {
      bool placed = false;
      for (size_t i = 0; i < n && next < np; ++i)
        if (!free_left || count[i] < cap[i]) {
          ranks[i].push_back(next++);
          ++count[i];
          placed = true;
        }
      if (!placed) free_left = false;
    }
  } else {
    for (size_t i = 0; i < n && next < np; ++i)
      while (count[i] < cap[i] && next < np) {
        ranks[i].push_back(next++);
        ++count[i];
      }
    // Oversubscribed: the rest one per node in turn.  Ranks stay contiguous per node below.
    for (size_t i = 0; next < np; i = (i + 1) % n) {
      ranks[i].push_back(next++);
      ++count[i];
    }
    int r = 0;
    for (auto& v : ranks)
      for (int& x : v) x = r++;
  }
  return map_of(alloc, ranks, np);
}

// The map of `np` ranks, ranks[i] (in local-rank order) on node i of `alloc`; nodes without
// ranks are left out.
JobMap map_of(const Allocation& alloc, const std::vector<std::vector<int>>& ranks, int np) {
  const size_t n = alloc.nodes.size();
  JobMap m;
  m.world_size = np;
  m.slurm = alloc.slurm;
  m.ranks.resize(static_cast<size_t>(np));
  for (size_t i = 0; i < n; ++i) {
    if (ranks[i].empty()) continue;
    NodeMap node;
    node.host = alloc.nodes[i].host;
    node.node_rank = static_cast<int>(m.nodes.size());
    node.slots = alloc.limited ? alloc.nodes[i].slots : 0;
    node.ranks = ranks[i];
    for (size_t lr = 0; lr < node.ranks.size(); ++lr)
      m.ranks[static_cast<size_t>(node.ranks[lr])] =
          RankLocation{node.node_rank, static_cast<int>(lr)};
    m.nodes.push_back(std::move(node));
  }
  return m;
}

Allocation rankfile_allocation(Allocation alloc, const std::vector<RankfileLine>& lines,
                               const std::string& name, const std::string& hostname) {
  if (alloc.limited) return alloc;
  for (const auto& l : lines) {
    bool known = false;
    for (const auto& n : alloc.nodes)
      known = known || n.host == l.host ||
              (is_local_host(l.host, hostname) && is_local_host(n.host, hostname));
    if (!known && l.host.compare(0, 2, "+n") != 0) alloc.nodes.push_back(HostSlots{l.host, 0});
  }
  alloc.source = "--rankfile " + name;
  return alloc;
}

JobMap map_rankfile(Allocation alloc, const std::vector<RankfileLine>& lines,
                    const std::string& name, const std::string& hostname) {
  alloc = rankfile_allocation(std::move(alloc), lines, name, hostname);
  std::vector<std::vector<int>> ranks(alloc.nodes.size());
  for (const auto& l : lines) {
    size_t at = alloc.nodes.size();
    if (l.host.compare(0, 2, "+n") == 0) {
      at = static_cast<size_t>(std::stoll(l.host.substr(2)));
      if (at >= alloc.nodes.size())
        throw UsageError(name + ":" + std::to_string(l.line) + ": " + l.host + ": " +
                         alloc.source + " has " + std::to_string(alloc.nodes.size()) +
                         " node(s), +n0 to +n" + std::to_string(alloc.nodes.size() - 1));
    }
    for (size_t i = 0; i < alloc.nodes.size() && at == alloc.nodes.size(); ++i)
      if (alloc.nodes[i].host == l.host ||
          (is_local_host(l.host, hostname) && is_local_host(alloc.nodes[i].host, hostname)))
        at = i;
    if (at == alloc.nodes.size())
      throw UsageError(name + ":" + std::to_string(l.line) + ": host " + l.host + " is not in " +
                       alloc.source);
    ranks[at].push_back(l.rank);  // lines come in rank order: local ranks by rank
  }
  return map_of(alloc, ranks, static_cast<int>(lines.size()));
}

JobMap reform_map(const JobMap& base, const std::vector<bool>& alive) {
  std::vector<int> nodes;
  for (size_t i = 0; i < base.nodes.size(); ++i)
    if (alive.at(i)) nodes.push_back(static_cast<int>(i));
  return reform_map(base, nodes);
}

JobMap reform_map(const JobMap& base, const std::vector<int>& nodes) {
  JobMap m;
  m.slurm = base.slurm;
  m.spawn_hosts = base.spawn_hosts;
  for (int i : nodes) {
    const NodeMap& from = base.nodes.at(static_cast<size_t>(i));
    NodeMap n;
    n.host = from.host;
    n.node_rank = static_cast<int>(m.nodes.size());
    n.slots = from.slots;
    for (size_t lr = 0; lr < from.ranks.size(); ++lr) {
      n.ranks.push_back(m.world_size++);
      m.ranks.push_back(RankLocation{n.node_rank, static_cast<int>(lr)});
    }
    m.nodes.push_back(std::move(n));
  }
  return m;
}

void set_node(JobMap& map, size_t slot, const std::string& host, int nranks) {
  if (slot == map.nodes.size()) map.nodes.emplace_back();
  NodeMap& node = map.nodes.at(slot);
  node.host = host;
  node.ranks.assign(static_cast<size_t>(nranks), 0);
  node.slots = nranks;  // what the host source said (MPI_Comm_spawn places into the slots)
  std::vector<int> all(map.nodes.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  map = reform_map(map, all);
}

std::vector<NodeMap> hosts_without_ranks(const Allocation& alloc, const JobMap& map) {
  std::vector<NodeMap> out;
  for (const auto& hs : alloc.nodes) {
    bool used = std::any_of(map.nodes.begin(), map.nodes.end(),
                            [&hs](const NodeMap& n) { return n.host == hs.host; });
    if (used) continue;
    NodeMap n;
    n.host = hs.host;
    n.slots = alloc.limited ? hs.slots : 0;
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace pe
