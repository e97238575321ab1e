// Placing the ranks of one node: which GPU(s), domain, NIC(s) and processors each local rank
// gets.  A pure function of the topology analysis and the options.
//
// Order: ranks follow the locality domains (GPUs of one NVLink island / root complex get
// consecutive ranks).  --map-by gpu takes GPUs in index order instead; --map-by numa deals ranks
// round-robin over NUMA nodes.  With more ranks than GPU blocks (GPUs / --gpus-per-rank), GPUs
// are shared: consecutive ranks take the same block (ranks 0,1 on GPU 0, 2,3 on GPU 1, ...),
// except with --map-by numa, which keeps dealing round-robin.
// Binding: default = the cpus nearest the rank's GPU(s) when there are GPUs, none otherwise;
// core = one core per rank among those cpus (its domain's without GPUs), wrapping when there
// are more ranks than cores; numa = its domain's NUMA node; gpu = as default (GPUs required).
// NICs (rail alignment): the NICs nearest the rank's own GPUs by PCIe path (PIX, PXB, PHB, NODE,
// SYS; RDMA before Ethernet); GPU blocks with the same nearest NICs share them out, so that two
// GPUs behind one switch pair with its two NICs one each.  Without GPUs: the domain's NICs.
#pragma once

#include <string>
#include <vector>

#include "topology/domains.hpp"
#include "topology/placement_choices.hpp"

namespace pe::topo {

// Parse "slot", "node", "numa", "gpu", "domain" / "none", "core", "numa", "gpu"; throw
// TopologyError naming the option and the choices.
MapBy parse_map_by(const std::string& s);
BindTo parse_bind_to(const std::string& s);

struct PlacementOptions {
  int nranks = 1;
  MapBy map_by = MapBy::Default;
  BindTo bind_to = BindTo::Default;
  int gpus_per_rank = 1;
};

struct RankPlacement {
  int local_rank = 0;
  std::vector<int> gpus;  // GPU indexes (CUDA/NVML numbering); empty without GPUs
  int domain = 0;
  // NICs: with GPUs, those nearest the rank's own GPUs, shared out among the ranks that find the
  // same ones (rail alignment); without GPUs, its domain's.
  std::vector<std::string> nics;
  std::string nic_path;           // path class from its GPUs to them ("PIX", ...), "" without GPUs
  std::vector<int> os_cpus;       // binding; empty: unbound
  std::string cpuset;             // the same in hwloc list syntax, "" when unbound
};

// Throws TopologyError for impossible requests (gpus-per-rank larger than the GPUs there are,
// --bind-to gpu without GPUs).
std::vector<RankPlacement> place_ranks(const Topology& t, const Analysis& a,
                                       const PlacementOptions& o);

// "GPU 0, domain 0, NIC mlx5_0 (PIX), cpus 0-17,36-53"
std::string describe_placement(const RankPlacement& r);
// One line per rank: "local rank 0: " + describe_placement.
std::string format_placement(const std::vector<RankPlacement>& p);

}  // namespace pe::topo
