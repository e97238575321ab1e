#include "topology/paths.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "common/log.hpp"

namespace pe::topo {
namespace {

// hwloc_get_common_ancestor_obj compares depths, which I/O objects do not have: walk parents.
hwloc_obj_t common_ancestor(hwloc_obj_t a, hwloc_obj_t b) {
  for (hwloc_obj_t x = a; x; x = x->parent)
    for (hwloc_obj_t y = b; y; y = y->parent)
      if (x == y) return x;
  return nullptr;
}

bool is_host_bridge(hwloc_obj_t o) {
  return o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
}

// MB/s of one NVLink: NVLink 1 (P100) carries 20 GB/s, later generations 25 GB/s per link.
double link_bandwidth(const Gpu& g) {
  return g.model.find("P100") != std::string::npos ? 20000.0 : 25000.0;
}

int gpu_position(const Topology& t, hwloc_obj_t o) {
  // Distances name GPUs by their OS device; match it to the GPU's PCI device.
  hwloc_obj_t pci = o->type == HWLOC_OBJ_OS_DEVICE ? o->parent : o;
  for (size_t i = 0; i < t.gpus().size(); ++i)
    if (t.gpus()[i].obj == pci) return static_cast<int>(i);
  return -1;
}

// Union-find over GPU positions.
int find(std::vector<int>& p, int x) { return p[x] == x ? x : p[x] = find(p, p[x]); }

void from_hwloc(const Topology& t, NvLinks& nv) {
  unsigned nr = 1;
  struct hwloc_distances_s* d = nullptr;
  if (hwloc_distances_get_by_name(t.raw(), "NVLinkBandwidth", &nr, &d, 0) != 0 || nr == 0) return;
  const size_t n = t.gpus().size();
  std::vector<int> switch_links(n, 0);
  for (unsigned a = 0; a < d->nbobjs; ++a) {
    int ga = gpu_position(t, d->objs[a]);
    if (ga < 0) continue;
    for (unsigned b = 0; b < d->nbobjs; ++b) {
      if (a == b) continue;
      double bw = static_cast<double>(d->values[a * d->nbobjs + b]);
      if (bw <= 0) continue;
      int links = std::max(
          1, static_cast<int>(std::lround(bw / link_bandwidth(t.gpus()[static_cast<size_t>(ga)]))));
      int gb = gpu_position(t, d->objs[b]);
      if (gb >= 0) {
        nv.links[static_cast<size_t>(ga)][static_cast<size_t>(gb)] = links;
      } else if (d->objs[b]->type == HWLOC_OBJ_PCI_DEVICE) {
        switch_links[static_cast<size_t>(ga)] += links;  // an NVSwitch
      }  // links to CPU packages (POWER) do not join GPUs
    }
  }
  hwloc_distances_release(t.raw(), d);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j && switch_links[i] > 0 && switch_links[j] > 0)
        nv.links[i][j] = std::max(nv.links[i][j], std::min(switch_links[i], switch_links[j]));
  nv.source = "hwloc NVLinkBandwidth";
}

// NVML, loaded at run time (no build dependency).  Only the few calls we need.
struct NvmlPci {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

void from_nvml(const Topology& t, NvLinks& nv) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  using InitF = int (*)();
  using HandleF = int (*)(const char*, void**);
  using StateF = int (*)(void*, unsigned, int*);
  using RemoteF = int (*)(void*, unsigned, NvmlPci*);
  auto init = reinterpret_cast<InitF>(::dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<InitF>(::dlsym(lib, "nvmlShutdown"));
  auto handle = reinterpret_cast<HandleF>(::dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto state = reinterpret_cast<StateF>(::dlsym(lib, "nvmlDeviceGetNvLinkState"));
  auto remote = reinterpret_cast<RemoteF>(::dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2"));
  if (!init || !shutdown || !handle || !state || !remote || init() != 0) {
    ::dlclose(lib);
    return;
  }
  const size_t n = t.gpus().size();
  std::vector<int> switch_links(n, 0);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    void* dev = nullptr;
    if (handle(t.gpus()[i].pci.str().c_str(), &dev) != 0) continue;
    for (unsigned l = 0; l < 18; ++l) {
      int active = 0;
      NvmlPci rp{};
      if (state(dev, l, &active) != 0 || !active || remote(dev, l, &rp) != 0) continue;
      any = true;
      bool gpu = false;
      for (size_t j = 0; j < n; ++j) {
        const auto& p = t.gpus()[j].pci;
        if (p.domain == rp.domain && p.bus == rp.bus && p.dev == rp.device) {
          ++nv.links[i][j];
          gpu = true;
        }
      }
      if (!gpu) ++switch_links[i];
    }
  }
  shutdown();
  ::dlclose(lib);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j && switch_links[i] > 0 && switch_links[j] > 0)
        nv.links[i][j] = std::max(nv.links[i][j], std::min(switch_links[i], switch_links[j]));
  if (any) nv.source = "NVML";
}

}  // namespace

std::string Path::str() const {
  switch (cls) {
    case PathClass::Self:
      return "X";
    case PathClass::NV:
      return "NV" + std::to_string(nvlinks);
    case PathClass::PIX:
      return "PIX";
    case PathClass::PXB:
      return "PXB";
    case PathClass::PHB:
      return "PHB";
    case PathClass::NODE:
      return "NODE";
    case PathClass::SYS:
      return "SYS";
  }
  return "?";
}

int Path::rank() const {
  // NV with more links is closer; then the PCIe classes in order.
  if (cls == PathClass::Self) return 0;
  if (cls == PathClass::NV) return 100 - std::min(nvlinks, 99);
  return 100 + static_cast<int>(cls);
}

NvLinks find_nvlinks(const Topology& t) {
  NvLinks nv;
  const size_t n = t.gpus().size();
  nv.links.assign(n, std::vector<int>(n, 0));
  nv.island.assign(n, -1);
  from_hwloc(t, nv);
  // NVML only where there are GPUs to join (loading it is a search of the library path).
  if (nv.source.empty() && n > 1 && t.source() == "this machine") from_nvml(t, nv);
  std::vector<int> parent(n);
  for (size_t i = 0; i < n; ++i) parent[i] = static_cast<int>(i);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (nv.links[i][j] > 0)
        parent[static_cast<size_t>(find(parent, static_cast<int>(i)))] =
            find(parent, static_cast<int>(j));
  std::map<int, int> ids;
  for (size_t i = 0; i < n; ++i) {
    bool linked = std::any_of(nv.links[i].begin(), nv.links[i].end(), [](int l) { return l > 0; });
    if (!linked) continue;
    int root = find(parent, static_cast<int>(i));
    if (!ids.count(root)) ids[root] = static_cast<int>(ids.size());
    nv.island[i] = ids[root];
  }
  return nv;
}

Path pci_path(const Topology& t, hwloc_obj_t a, hwloc_obj_t b) {
  Path p;
  if (a == b) {
    p.cls = PathClass::Self;
    return p;
  }
  hwloc_obj_t lca = common_ancestor(a, b);
  if (lca && lca->type == HWLOC_OBJ_BRIDGE) {
    if (is_host_bridge(lca)) {
      p.cls = PathClass::PHB;
      return p;
    }
    // Below one PCIe switch: each device hangs off a port of the switch whose upstream bridge
    // is the common ancestor (or off the ancestor itself).
    auto near = [lca](hwloc_obj_t o) {
      hwloc_obj_t up = o->parent;
      return up == lca || (up && up->parent == lca);
    };
    p.cls = near(a) && near(b) ? PathClass::PIX : PathClass::PXB;
    return p;
  }
  hwloc_obj_t na = hwloc_get_non_io_ancestor_obj(t.raw(), a);
  hwloc_obj_t nb = hwloc_get_non_io_ancestor_obj(t.raw(), b);
  bool same_numa =
      na && nb && na->nodeset && nb->nodeset && hwloc_bitmap_isequal(na->nodeset, nb->nodeset);
  p.cls = same_numa ? PathClass::NODE : PathClass::SYS;
  return p;
}

Path gpu_path(const Topology& t, const NvLinks& nv, size_t i, size_t j) {
  if (i == j) return Path{PathClass::Self, 0};
  if (nv.links[i][j] > 0) return Path{PathClass::NV, nv.links[i][j]};
  return pci_path(t, t.gpus()[i].obj, t.gpus()[j].obj);
}

}  // namespace pe::topo
