// A thin C++ layer over hwloc: load the live machine or an XML export (I/O objects kept), and
// find the GPUs, NICs, PCIe root complexes (host bridges) and NUMA nodes, with their cpusets.
//
// Threading: a Topology is immutable after load_topology() (and restrict_cpus(), which a node's
// plan calls once, before anything reads it) and may be read from any thread.
#pragma once

#include <hwloc.h>

#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace pe::topo {

class TopologyError : public pe::Error {
 public:
  explicit TopologyError(const std::string& what) : pe::Error(what) {}
};

struct PciAddress {
  unsigned domain = 0, bus = 0, dev = 0, func = 0;
  std::string str() const;  // "0000:3b:00.0"
};

// Where a PCI device sits.
struct PciDevice {
  PciAddress pci;
  int root_complex = -1;      // index into Topology::root_complexes()
  int numa = -1;              // logical index of the nearest NUMA node, -1 when unknown
  std::string cpuset;         // hwloc list syntax of the nearest non-I/O ancestor, "0-19"
  hwloc_obj_t obj = nullptr;  // the PCI device
};

struct Gpu : PciDevice {
  int index = 0;      // CUDA/NVML index when hwloc names one, else discovery order
  std::string name;   // "cuda0", "nvml3", or the PCI address
  std::string model;  // hwloc's GPUModel / PCI device name when known
};

struct Nic : PciDevice {
  std::string name;                  // "mlx5_0" (OpenFabrics) or the network interface name
  std::vector<std::string> netdevs;  // network interfaces of this device ("ib0", "eth0")
};

struct RootComplex {
  int index = 0;
  PciAddress pci;  // the host bridge's downstream bus domain/bus
  int numa = -1;
  std::string cpuset;
  hwloc_obj_t obj = nullptr;
};

struct LoadOptions {
  std::string xml_file;  // empty: this machine (the launcher maps --topology-file and
                         // PYTORCH_EXEC_TOPOLOGY_FILE to this for dry runs only)
};

class Topology {
 public:
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  const std::vector<Gpu>& gpus() const { return gpus_; }
  const std::vector<Nic>& nics() const { return nics_; }
  const std::vector<RootComplex>& root_complexes() const { return rcs_; }
  int numa_count() const;
  int core_count() const;
  int pu_count() const;
  // Where the topology came from: an XML path or "this machine".
  const std::string& source() const { return source_; }
  hwloc_topology_t raw() const { return topo_; }
  // Keeps the processors of `set` only (mpirun's --cpu-set): objects left without processors go,
  // GPUs and NICs move up to what is left around them.  TopologyError when none of `set` is here.
  void restrict_cpus(hwloc_const_bitmap_t set);

 private:
  friend std::unique_ptr<Topology> load_topology(const LoadOptions&);
  Topology() = default;
  void discover();
  void locate(hwloc_obj_t pci, PciDevice& where) const;

  hwloc_topology_t topo_ = nullptr;
  std::string source_;
  std::vector<Gpu> gpus_;
  std::vector<Nic> nics_;
  std::vector<RootComplex> rcs_;
};

// A cpuset in hwloc's list syntax ("0-3,8") and as OS processor numbers.
std::string cpuset_list(hwloc_const_bitmap_t set);
std::vector<int> cpuset_os_cpus(hwloc_const_bitmap_t set);

// Throws TopologyError (a pe::Error) with one sentence on a missing or malformed file.
std::unique_ptr<Topology> load_topology(const LoadOptions& opts);

}  // namespace pe::topo
