#include "topology/gpu_levels.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace pe::topo {
namespace {

// One node's ranks by domain (local ranks, in local rank order), domains in index order.
std::vector<std::vector<size_t>> by_domain(const NodeRanks& n) {
  std::map<int, std::vector<size_t>> m;
  for (size_t lr = 0; lr < n.placement.size(); ++lr) m[n.placement[lr].domain].push_back(lr);
  std::vector<std::vector<size_t>> v;
  for (auto& [d, lrs] : m) v.push_back(lrs);
  return v;
}

bool shares_gpu(const NodeRanks& n, const std::vector<size_t>& lrs) {
  std::set<int> seen;
  for (size_t lr : lrs)
    for (int g : n.placement[lr].gpus)
      if (!seen.insert(g).second) return true;
  return false;
}

int gpu_position(const Topology& t, int index) {
  for (size_t i = 0; i < t.gpus().size(); ++i)
    if (t.gpus()[i].index == index) return static_cast<int>(i);
  return -1;
}

// NCCL across domains when every pair of the members' GPUs is closer than SYS.
std::string rail_engine(const NodeRanks& n, const std::vector<size_t>& lrs) {
  if (shares_gpu(n, lrs)) return "shm";
  for (size_t a : lrs)
    for (size_t b : lrs)
      for (int ga : n.placement[a].gpus)
        for (int gb : n.placement[b].gpus) {
          int i = gpu_position(*n.topology, ga), j = gpu_position(*n.topology, gb);
          if (i < 0 || j < 0) return "shm";
          Path p = gpu_path(*n.topology, n.analysis->nvlinks, static_cast<size_t>(i),
                            static_cast<size_t>(j));
          if (p.cls == PathClass::SYS) return "shm";
        }
  return "nccl";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
  return s;
}

}  // namespace

GpuPlan plan_gpu_levels(const std::vector<NodeRanks>& all) {
  GpuPlan p;
  std::vector<NodeRanks> nodes;  // the nodes with ranks
  for (const auto& n : all)
    if (!n.placement.empty()) nodes.push_back(n);
  int world = 0;
  for (const auto& n : nodes) {
    for (int r : n.ranks) world = std::max(world, r + 1);
    for (const auto& r : n.placement)
      if (r.gpus.empty()) {
        p.note = "ranks without GPUs: the host path";
        return p;
      }
  }
  if (world == 0) {
    p.note = "no ranks";
    return p;
  }
  p.gpus = true;
  p.shard_of.assign(static_cast<size_t>(world), -1);
  std::vector<std::vector<std::vector<size_t>>> doms;
  for (const auto& n : nodes) doms.push_back(by_domain(n));
  if (nodes.size() == 1 && doms[0].size() == 1) {
    p.flat = true;
    p.rings.push_back({1,
                       shares_gpu(nodes[0], doms[0][0]) ? "shm" : "nccl",
                       0,
                       nodes[0].placement[0].domain,
                       -1,
                       nodes[0].ranks,
                       {}});
    return p;
  }
  std::vector<size_t> rails(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) {
    const NodeRanks& n = nodes[k];
    rails[k] = n.placement.size();
    for (const auto& lrs : doms[k]) {
      rails[k] = std::min(rails[k], lrs.size());
      if (lrs.size() < 2) continue;
      Ring r{1,
             shares_gpu(n, lrs) ? "shm" : "nccl",
             static_cast<int>(k),
             n.placement[lrs[0]].domain,
             -1,
             {},
             {}};
      for (size_t lr : lrs) r.ranks.push_back(n.ranks[lr]);
      p.rings.push_back(r);
    }
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (doms[k].size() < 2) continue;
    for (size_t rail = 0; rail < rails[k]; ++rail) {
      std::vector<size_t> lrs;
      for (const auto& d : doms[k]) lrs.push_back(d[rail]);
      Ring r{2, rail_engine(nodes[k], lrs), static_cast<int>(k), -1, static_cast<int>(rail), {},
             {}};
      for (size_t lr : lrs) r.ranks.push_back(nodes[k].ranks[lr]);
      p.rings.push_back(r);
    }
  }
  if (nodes.size() < 2) return p;
  size_t shards = rails[0] * doms[0].size();
  for (size_t k = 1; k < nodes.size(); ++k) shards = std::min(shards, rails[k] * doms[k].size());
  p.shards = static_cast<int>(shards);
  for (size_t s = 0; s < shards; ++s) {
    Ring r{3, "net", -1, -1, static_cast<int>(s), {}, {}};
    for (size_t k = 0; k < nodes.size(); ++k) {
      size_t nd = doms[k].size();
      size_t lr = doms[k][s % nd][s / nd];
      int g = nodes[k].ranks[lr];
      r.ranks.push_back(g);
      r.nics.push_back(join(nodes[k].placement[lr].nics));
      p.shard_of[static_cast<size_t>(g)] = static_cast<int>(s);
    }
    p.rings.push_back(r);
  }
  return p;
}

std::string format_gpu_plan(const GpuPlan& p) {
  std::ostringstream os;
  if (!p.gpus) return "GPU levels: none (" + p.note + ")\n";
  if (p.flat) {
    const Ring& r = p.rings.front();
    if (r.ranks.size() == 1) return "GPU levels: one rank, nothing to combine\n";
    os << "GPU levels: one " << (r.engine == "nccl" ? "NCCL communicator" : "shared-memory group")
       << " of all " << r.ranks.size() << " ranks (one node, one locality domain)\n";
    return os.str();
  }
  os << "GPU levels (1: inside a domain, 2: across the domains of a node, 3: across nodes";
  if (p.shards > 0) os << ", " << p.shards << " shards";
  os << "):\n";
  for (const auto& r : p.rings) {
    os << "  level " << r.level << " (" << (r.engine == "net" ? "tcp/mpi" : r.engine) << ") ";
    if (r.level == 1) os << "node " << r.node << " domain " << r.domain;
    if (r.level == 2) os << "node " << r.node << " rail " << r.index;
    if (r.level == 3) os << "shard " << r.index;
    os << ": ranks";
    for (size_t i = 0; i < r.ranks.size(); ++i) {
      os << " " << r.ranks[i];
      if (r.level == 3) os << " (" << (r.nics[i].empty() ? "no NIC" : r.nics[i]) << ")";
    }
    os << "\n";
  }
  if (p.shards == 0) os << "  (one node: levels 1 and 2 make the allreduce)\n";
  return os.str();
}

}  // namespace pe::topo
