#include "topology/domains.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "topology/gpu_levels.hpp"

namespace pe::topo {
namespace {

void fill_cpus(const Topology& t, Domain& d, hwloc_bitmap_t set) {
  hwloc_bitmap_and(set, set, hwloc_topology_get_allowed_cpuset(t.raw()));
  if (hwloc_bitmap_iszero(set)) hwloc_bitmap_copy(set, hwloc_topology_get_allowed_cpuset(t.raw()));
  d.cpuset = cpuset_list(set);
  d.os_cpus = cpuset_os_cpus(set);
}

// The package (socket) above a device, or nullptr.
hwloc_obj_t package_of(const Topology& t, hwloc_obj_t o) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t.raw(), o);
  while (anc && anc->type != HWLOC_OBJ_PACKAGE) anc = anc->parent;
  return anc;
}

}  // namespace

NearestNics nearest_nics(const Topology& t, const std::vector<hwloc_obj_t>& from) {
  NearestNics r;
  int best = 1 << 30;
  for (size_t n = 0; n < t.nics().size(); ++n) {
    const Nic& nic = t.nics()[n];
    // The worst over `from` of (path class, then: in another package).  Two NUMA nodes of one
    // package are SYS apart like two packages, but nearer.
    int worst = -1;
    std::string cls;
    for (hwloc_obj_t o : from) {
      Path p = pci_path(t, o, nic.obj);
      int key = p.rank() * 2 + (package_of(t, o) == package_of(t, nic.obj) ? 0 : 1);
      if (key > worst) {
        worst = key;
        cls = p.str();
      }
    }
    // At equal distance an RDMA device (an OpenFabrics name, not a plain netdev) comes first.
    bool rdma = nic.netdevs.empty() || nic.name != nic.netdevs.front();
    worst = worst * 2 + (rdma ? 0 : 1);
    if (worst < best) {
      best = worst;
      r.nics.clear();
      r.path = cls;
    }
    if (worst == best) r.nics.push_back(static_cast<int>(n));
  }
  return r;
}

Analysis analyse(const Topology& t) {
  Analysis a;
  a.nvlinks = find_nvlinks(t);
  const auto& gpus = t.gpus();
  // Group GPUs: NVLink island, else root complex, else NUMA node; domains in order of their
  // lowest GPU index.
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (size_t i = 0; i < gpus.size(); ++i) {
    std::string key;
    if (a.nvlinks.island[i] >= 0)
      key = "nvlink:" + std::to_string(a.nvlinks.island[i]);
    else if (gpus[i].root_complex >= 0)
      key = "root-complex:" + std::to_string(gpus[i].root_complex);
    else
      key = "numa:" + std::to_string(gpus[i].numa);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(static_cast<int>(i));
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (const auto& key : order) {
    Domain d;
    d.index = static_cast<int>(a.domains.size());
    d.kind = key.substr(0, key.find(':'));
    d.gpus = groups[key];
    hwloc_bitmap_zero(set);
    std::vector<hwloc_obj_t> objs;
    for (int g : d.gpus) {
      hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t.raw(), gpus[static_cast<size_t>(g)].obj);
      if (anc && anc->cpuset) hwloc_bitmap_or(set, set, anc->cpuset);
      objs.push_back(gpus[static_cast<size_t>(g)].obj);
    }
    d.numa = gpus[static_cast<size_t>(d.gpus.front())].numa;
    fill_cpus(t, d, set);
    NearestNics near = nearest_nics(t, objs);
    d.nics = near.nics;
    d.nic_path = near.path;
    a.domains.push_back(d);
  }
  if (gpus.empty()) {
    // No GPUs: a domain per NUMA node, with the NICs attached there.
    int nnuma = t.numa_count();
    for (int n = 0; n < nnuma; ++n) {
      hwloc_obj_t node =
          hwloc_get_obj_by_type(t.raw(), HWLOC_OBJ_NUMANODE, static_cast<unsigned>(n));
      Domain d;
      d.index = n;
      d.kind = "numa";
      d.numa = n;
      hwloc_bitmap_copy(set, node->cpuset);
      fill_cpus(t, d, set);
      for (size_t k = 0; k < t.nics().size(); ++k)
        if (t.nics()[k].numa == n) d.nics.push_back(static_cast<int>(k));
      a.domains.push_back(d);
    }
  }
  hwloc_bitmap_free(set);
  return a;
}

std::string format_topology(const Topology& t, const Analysis& a) {
  std::ostringstream os;
  const auto& gpus = t.gpus();
  const auto& nics = t.nics();
  os << "Topology of " << t.source() << ": " << t.pu_count() << " processors, " << t.core_count()
     << " cores, " << t.numa_count() << " NUMA nodes, " << t.root_complexes().size()
     << " PCIe root complexes, " << gpus.size() << " GPUs, " << nics.size() << " NICs\n";
  if (!gpus.empty()) {
    os << "NVLink: " << (a.nvlinks.source.empty() ? "none found" : a.nvlinks.source) << "\n\n";
    char cell[32];
    os << "       ";
    for (const auto& g : gpus) {
      std::snprintf(cell, sizeof cell, " %-5s", ("GPU" + std::to_string(g.index)).c_str());
      os << cell;
    }
    for (const auto& n : nics) {
      std::snprintf(cell, sizeof cell, " %-7s", n.name.c_str());
      os << cell;
    }
    os << " CPU affinity   NUMA\n";
    for (size_t i = 0; i < gpus.size(); ++i) {
      std::snprintf(cell, sizeof cell, "%-7s", ("GPU" + std::to_string(gpus[i].index)).c_str());
      os << cell;
      for (size_t j = 0; j < gpus.size(); ++j) {
        std::snprintf(cell, sizeof cell, " %-5s", gpu_path(t, a.nvlinks, i, j).str().c_str());
        os << cell;
      }
      for (const auto& n : nics) {
        std::snprintf(cell, sizeof cell, " %-7s", pci_path(t, gpus[i].obj, n.obj).str().c_str());
        os << cell;
      }
      std::snprintf(cell, sizeof cell, " %-14s %d", gpus[i].cpuset.c_str(), gpus[i].numa);
      os << cell << "\n";
    }
    os << "\n";
  }
  os << "Locality domains:\n";
  for (const auto& d : a.domains) {
    os << "  domain " << d.index << " (" << d.kind << "): GPUs";
    if (d.gpus.empty()) os << " none";
    for (int g : d.gpus) os << " " << gpus[static_cast<size_t>(g)].index;
    os << "; NICs";
    if (d.nics.empty()) os << " none";
    for (int n : d.nics) os << " " << nics[static_cast<size_t>(n)].name;
    if (!d.nic_path.empty()) os << " (" << d.nic_path << ")";
    os << "; cpus " << d.cpuset << "; NUMA " << d.numa << "\n";
  }
  if (!gpus.empty()) {
    // The levels a job of one rank per GPU on this machine alone would build.
    NodeRanks n{&t, &a, {}, place_ranks(t, a, PlacementOptions{static_cast<int>(gpus.size())})};
    for (size_t i = 0; i < gpus.size(); ++i) n.ranks.push_back(static_cast<int>(i));
    os << "\nWith one rank per GPU:\n" << format_gpu_plan(plan_gpu_levels({n}));
  }
  return os.str();
}

}  // namespace pe::topo
