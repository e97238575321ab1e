// Locality domains: the GPUs that share an NVLink island, else a PCIe root complex, else a NUMA
// node; for each, the nearest NIC(s) and the cpuset to bind its ranks to.  A machine without
// GPUs has one domain per NUMA node.  Pure functions of a loaded Topology.
#pragma once

#include <string>
#include <vector>

#include "topology/paths.hpp"
#include "topology/topology.hpp"

namespace pe::topo {

struct Domain {
  int index = 0;
  std::string kind;          // "nvlink", "root-complex", "numa"
  std::vector<int> gpus;     // positions in Topology::gpus(), in GPU index order
  std::vector<int> nics;     // positions in Topology::nics(), nearest first
  std::string nic_path;      // the path class to those NICs ("PIX", ...), "" without NICs
  std::string cpuset;        // hwloc list syntax
  std::vector<int> os_cpus;  // the same, as OS processor numbers
  int numa = -1;
};

struct Analysis {
  NvLinks nvlinks;
  std::vector<Domain> domains;
};

Analysis analyse(const Topology& t);

// The NICs nearest a set of PCI devices (a domain's or a rank's GPUs): the lowest worst path
// class from those devices (PIX before PXB, PHB, NODE, SYS; at SYS, one in the same package
// before one in another), an RDMA device before a plain network interface at equal distance; in
// Topology::nics() order.
struct NearestNics {
  std::vector<int> nics;  // positions in Topology::nics()
  std::string path;       // their path class, "" without NICs
};
NearestNics nearest_nics(const Topology& t, const std::vector<hwloc_obj_t>& from);

// The --display-topology printout: GPU/NIC matrix in nvidia-smi style, domains and cpusets.
std::string format_topology(const Topology& t, const Analysis& a);

}  // namespace pe::topo
