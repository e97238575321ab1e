// hwloc_topology_init for the live machine, without the discovery components that can only
// cost time here: "gl" probes X displays :0 to :9 (and resolves names for each), "opencl"
// starts every OpenCL platform installed (PoCL compiles on start).  GPUs are found from PCI,
// CUDA and NVML; neither component adds anything the launcher or the PMIx server uses.
#pragma once

#include <hwloc.h>

namespace pe::topo {

inline int init_hwloc_topology(hwloc_topology_t* topo) {
  if (hwloc_topology_init(topo) != 0) return -1;
  for (const char* name : {"gl", "opencl"})
    hwloc_topology_set_components(*topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, name);
  return 0;
}

}  // namespace pe::topo
