#include "exec/node/node_plan.hpp"

#include <algorithm>
#include <map>
#include <sstream>

#include "common/error.hpp"
#include "topology/gpu_levels.hpp"

namespace pe {

void apply_rank_by(topo::RankBy rank_by, const topo::Topology& t,
                   std::vector<topo::RankPlacement>& ranks) {
  // The logical index of the object of a type around the rank's place.
  auto around = [&t](const topo::RankPlacement& r, hwloc_obj_type_t type) {
    if (r.pu < 0) return -1;
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t.raw(), static_cast<unsigned>(r.pu));
    hwloc_obj_t o = pu ? hwloc_get_ancestor_obj_by_type(t.raw(), type, pu) : nullptr;
    if (type == HWLOC_OBJ_PU) o = pu;
    return o ? static_cast<int>(o->logical_index) : -1;
  };
  // The NUMA node holding the rank's place (NUMA nodes are no ancestors in hwloc 2).
  auto numa_of = [&t](const topo::RankPlacement& r) {
    int n = hwloc_get_nbobjs_by_type(t.raw(), HWLOC_OBJ_NUMANODE);
    for (int i = 0; r.pu >= 0 && i < n; ++i) {
      hwloc_obj_t o = hwloc_get_obj_by_type(t.raw(), HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
      if (o && o->cpuset && hwloc_bitmap_isset(o->cpuset, static_cast<unsigned>(r.pu))) return i;
    }
    return -1;
  };
  auto key = [rank_by, &around, &numa_of](const topo::RankPlacement& r) {
    switch (rank_by) {
      case topo::RankBy::Core:
        return around(r, HWLOC_OBJ_CORE);
      case topo::RankBy::HwThread:
        return around(r, HWLOC_OBJ_PU);
      case topo::RankBy::L3Cache:
        return around(r, HWLOC_OBJ_L3CACHE);
      case topo::RankBy::Socket:
        return around(r, HWLOC_OBJ_PACKAGE);
      case topo::RankBy::Gpu:
        return r.gpus.empty() ? -1 : r.gpus.front();
      case topo::RankBy::Domain:
        return r.domain;
      case topo::RankBy::Numa:
        return numa_of(r);
      case topo::RankBy::Slot:
      case topo::RankBy::Node:
        break;
    }
    return 0;
  };
  // gpu and domain (ours) group the ranks; Open MPI's objects deal them round-robin over the
  // objects, as mpirun: the first rank of each object in turn, then the second, ...
  const bool dealt = rank_by == topo::RankBy::Numa || rank_by == topo::RankBy::Core ||
                     rank_by == topo::RankBy::HwThread || rank_by == topo::RankBy::L3Cache ||
                     rank_by == topo::RankBy::Socket;
  if (!dealt) {
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&key](const auto& x, const auto& y) { return key(x) < key(y); });
  } else {
    std::map<int, std::vector<topo::RankPlacement>> by;  // object -> its ranks, in order
    for (auto& r : ranks) by[key(r)].push_back(std::move(r));
    std::vector<topo::RankPlacement> dealt_out;
    for (size_t round = 0; dealt_out.size() < ranks.size(); ++round)
      for (auto& [object, on] : by)
        if (round < on.size()) dealt_out.push_back(std::move(on[round]));
    ranks = std::move(dealt_out);
  }
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i].local_rank = static_cast<int>(i);
}

PlacementRequest placement_of(const LaunchConfig& cfg) {
  return PlacementRequest{cfg.map_by,        cfg.rank_by,      cfg.bind_to,    cfg.gpus_per_rank,
                          cfg.topology_file, cfg.ppr,          cfg.ppr_object, cfg.pe,
                          cfg.bind_overload, cfg.hwthread_cpus};
}

PlacementRequest placement_for(const LaunchConfig& cfg, const JobMap& map, int node) {
  PlacementRequest r = placement_of(cfg);
  r.cpu_set = cfg.cpu_set;
  r.cpu_list = cfg.cpu_list;
  r.cpu_list_ordered = cfg.cpu_list_ordered;
  if (!cfg.rankfile.empty())
    for (int rank : map.nodes.at(static_cast<size_t>(node)).ranks)
      r.places.push_back(cfg.rankfile.at(static_cast<size_t>(rank)).slots);
  return r;
}

NodePlan plan_node(const PlacementRequest& cfg, int nlocal) {
  NodePlan p;
  try {
    p.topology = topo::load_topology(topo::LoadOptions{cfg.topology_file});
    if (!cfg.cpu_set.empty()) topo::restrict_to(*p.topology, cfg.cpu_set, cfg.hwthread_cpus);
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
    o.ppr = cfg.ppr;
    o.ppr_object = cfg.ppr_object;
    o.pe = cfg.pe;
    o.overload = cfg.bind_overload;
    o.hwthread_cpus = cfg.hwthread_cpus;
    o.places = cfg.places;
    o.cpu_list = cfg.cpu_list;
    o.cpu_list_ordered = cfg.cpu_list_ordered;
    o.confine = !cfg.cpu_set.empty();
    p.ranks = topo::place_ranks(*p.topology, p.analysis, o);
  } catch (const topo::TopologyError& e) {
    throw UsageError(e.what());
  }
  if (cfg.rank_by == topo::RankBy::Gpu && p.topology->gpus().empty())
    throw UsageError("--rank-by gpu: " + p.topology->source() + " has no GPUs");
  apply_rank_by(cfg.rank_by, *p.topology, p.ranks);
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
