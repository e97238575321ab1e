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

// The --display-topology printout: GPU/NIC matrix in nvidia-smi style, domains and cpusets.
std::string format_topology(const Topology& t, const Analysis& a);

}  // namespace pe::topo
