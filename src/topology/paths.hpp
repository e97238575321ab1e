// How two devices talk: NVLink (direct or through NVSwitches) and the PCIe/SMP path, classified
// as `nvidia-smi topo -m` does:
//   NV#  connected by # NVLinks (through NVSwitches: the smaller of the two GPUs' switch links)
//   PIX  at most one PCIe switch in between
//   PXB  several PCIe switches, no host bridge
//   PHB  through a PCIe host bridge (the CPU's root complex)
//   NODE between host bridges of one NUMA node
//   SYS  across the SMP interconnect between NUMA nodes
// Pure functions of a loaded Topology.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace pe::topo {

enum class PathClass { Self, NV, PIX, PXB, PHB, NODE, SYS };

struct Path {
  PathClass cls = PathClass::SYS;
  int nvlinks = 0;          // with NV
  std::string str() const;  // "X", "NV6", "PIX", ...
  // Lower is closer.
  int rank() const;
};

struct NvLinks {
  std::vector<std::vector<int>> links;  // [gpu][gpu]: NVLinks between GPU positions in gpus()
  std::vector<int> island;              // per GPU: NVLink island id, -1 when it has no NVLink
  std::string source;                   // "hwloc NVLinkBandwidth", "NVML", or "" (none)
};

// NVLink connectivity from hwloc's NVLinkBandwidth distances; on the live machine, when hwloc
// has none, from NVML if libnvidia-ml can be loaded (otherwise: no NVLink, not an error).  All
// GPUs attached to NVSwitches of one machine form one island (the switches are one fabric; hwloc
// does not record switch-to-switch links).
NvLinks find_nvlinks(const Topology& t);

// PCIe/SMP path between two PCI devices (or bridges).
Path pci_path(const Topology& t, hwloc_obj_t a, hwloc_obj_t b);
// GPU positions i, j in t.gpus().
Path gpu_path(const Topology& t, const NvLinks& nv, size_t i, size_t j);

}  // namespace pe::topo
