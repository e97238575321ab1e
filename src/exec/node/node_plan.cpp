#include "exec/node/node_plan.hpp"

#include <algorithm>
#include <sstream>

#include "common/error.hpp"
#include "topology/gpu_levels.hpp"

namespace pe {

void apply_rank_by(topo::RankBy rank_by, const topo::Analysis& a,
                   std::vector<topo::RankPlacement>& ranks) {
  auto key = [rank_by, &a](const topo::RankPlacement& r) {
    switch (rank_by) {
      case topo::RankBy::Gpu:
        return r.gpus.empty() ? -1 : r.gpus.front();
      case topo::RankBy::Domain:
        return r.domain;
      case topo::RankBy::Numa:
        return a.domains.at(static_cast<size_t>(r.domain)).numa;
      case topo::RankBy::Slot:
      case topo::RankBy::Node:
        break;
    }
    return 0;
  };
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&key](const auto& a, const auto& b) { return key(a) < key(b); });
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i].local_rank = static_cast<int>(i);
}

PlacementRequest placement_of(const LaunchConfig& cfg) {
  return PlacementRequest{cfg.map_by, cfg.rank_by, cfg.bind_to, cfg.gpus_per_rank,
                          cfg.topology_file};
}

NodePlan plan_node(const PlacementRequest& cfg, int nlocal) {
  NodePlan p;
  try {
    p.topology = topo::load_topology(topo::LoadOptions{cfg.topology_file});
    p.analysis = topo::analyse(*p.topology);
  } catch (const topo::TopologyError& e) {
    throw UsageError(e.what());
  }
  place_again(p, cfg, nlocal);
  return p;
}

void place_again(NodePlan& p, const PlacementRequest& cfg, int nlocal) {
  try {
    topo::PlacementOptions o;
    o.nranks = nlocal;
    o.map_by = cfg.map_by;
    o.bind_to = cfg.bind_to;
    o.gpus_per_rank = cfg.gpus_per_rank;
    p.ranks = topo::place_ranks(*p.topology, p.analysis, o);
  } catch (const topo::TopologyError& e) {
    throw UsageError(e.what());
  }
  if (cfg.rank_by == topo::RankBy::Gpu && p.topology->gpus().empty())
    throw UsageError("--rank-by gpu: " + p.topology->source() + " has no GPUs");
  apply_rank_by(cfg.rank_by, p.analysis, p.ranks);
}

RankLocality locality_of(const topo::RankPlacement& p) {
  RankLocality l;
  l.domain = p.domain;
  l.gpus = p.gpus;
  l.nics = p.nics;
  l.cpus = p.cpuset;
  return l;
}

std::string format_job_map(const JobMap& map, const std::vector<const NodePlan*>& plans) {
  std::ostringstream os;
  os << "Job map: " << map.world_size << " ranks on " << map.nodes.size() << " node(s)\n";
  for (size_t i = 0; i < map.nodes.size(); ++i) {
    const NodeMap& n = map.nodes[i];
    const NodePlan* plan = i < plans.size() ? plans[i] : nullptr;
    os << "node " << n.node_rank << " (" << n.host;
    if (plan) os << ", topology of " << plan->topology->source();
    os << "): " << n.ranks.size() << " ranks\n";
    for (size_t lr = 0; lr < n.ranks.size(); ++lr) {
      os << "  rank " << n.ranks[lr] << " (local " << lr << ")";
      if (plan) os << ": " << topo::describe_placement(plan->ranks.at(lr));
      os << "\n";
    }
  }
  os << format_gpu_levels(map, plans);
  return os.str();
}

std::string format_gpu_levels(const JobMap& map, const std::vector<const NodePlan*>& plans) {
  std::vector<topo::NodeRanks> nodes;
  bool gpus = false;
  for (size_t i = 0; i < map.nodes.size(); ++i) {
    const NodePlan* plan = i < plans.size() ? plans[i] : nullptr;
    if (!plan) return "";  // placement unknown somewhere: no plan
    nodes.push_back({plan->topology.get(), &plan->analysis, map.nodes[i].ranks, plan->ranks});
    gpus = gpus || !plan->topology->gpus().empty();
  }
  return gpus ? topo::format_gpu_plan(topo::plan_gpu_levels(nodes)) : "";
}

}  // namespace pe
