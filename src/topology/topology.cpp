#include "topology/topology.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"
#include "topology/hwloc_init.hpp"
#include "topology/topology_cache.hpp"

namespace pe::topo {
namespace {

constexpr unsigned kVendorNvidia = 0x10de;

PciAddress pci_of(hwloc_obj_t o) {
  const auto& a = o->attr->pcidev;
  return PciAddress{a.domain, a.bus, a.dev, a.func};
}

hwloc_obj_t host_bridge_of(hwloc_obj_t o) {
  for (hwloc_obj_t p = o->parent; p; p = p->parent)
    if (p->type == HWLOC_OBJ_BRIDGE && p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST)
      return p;
  return nullptr;
}

int nearest_numa(hwloc_topology_t t, hwloc_obj_t o) {
  hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, o);
  if (!a || !a->nodeset || hwloc_bitmap_iszero(a->nodeset)) return -1;
  hwloc_obj_t n =
      hwloc_get_numanode_obj_by_os_index(t, static_cast<unsigned>(hwloc_bitmap_first(a->nodeset)));
  return n ? static_cast<int>(n->logical_index) : -1;
}

std::string cpuset_of(hwloc_topology_t t, hwloc_obj_t o) {
  hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, o);
  return a ? cpuset_list(a->cpuset) : "";
}

// "cuda3" -> 3 for prefix "cuda"; -1 otherwise.
int numbered(const char* name, const char* prefix) {
  size_t n = std::strlen(prefix);
  if (!name || std::strncmp(name, prefix, n) != 0 || !name[n]) return -1;
  char* end = nullptr;
  long v = std::strtol(name + n, &end, 10);
  return *end == '\0' ? static_cast<int>(v) : -1;
}

template <typename F>
void for_each_osdev(hwloc_obj_t pci, F f) {
  for (hwloc_obj_t c = pci->io_first_child; c; c = c->next_sibling)
    if (c->type == HWLOC_OBJ_OS_DEVICE) f(c);
}

}  // namespace

std::string cpuset_list(hwloc_const_bitmap_t set) {
  if (!set) return "";
  char* s = nullptr;
  hwloc_bitmap_list_asprintf(&s, set);
  std::string r = s ? s : "";
  std::free(s);
  return r;
}

std::vector<int> cpuset_os_cpus(hwloc_const_bitmap_t set) {
  std::vector<int> v;
  if (!set) return v;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, set) { v.push_back(static_cast<int>(i)); }
  hwloc_bitmap_foreach_end();
  return v;
}

std::string PciAddress::str() const {
  char b[32];
  std::snprintf(b, sizeof b, "%04x:%02x:%02x.%x", domain, bus, dev, func);
  return b;
}

Topology::~Topology() {
  if (topo_) hwloc_topology_destroy(topo_);
}

int Topology::numa_count() const { return hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_NUMANODE); }
int Topology::core_count() const { return hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_CORE); }
int Topology::pu_count() const { return hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_PU); }

void Topology::locate(hwloc_obj_t pci, PciDevice& where) const {
  where.pci = pci_of(pci);
  hwloc_obj_t hb = host_bridge_of(pci);
  for (const auto& rc : rcs_)
    if (rc.obj == hb) where.root_complex = rc.index;
  where.numa = nearest_numa(topo_, pci);
  where.cpuset = cpuset_of(topo_, pci);
  where.obj = pci;
}

void Topology::restrict_cpus(hwloc_const_bitmap_t set) {
  if (!hwloc_bitmap_intersects(set, hwloc_topology_get_topology_cpuset(topo_)))
    throw TopologyError("none of the processors " + cpuset_list(set) + " is on " + source_);
  if (hwloc_topology_restrict(topo_, set,
                              HWLOC_RESTRICT_FLAG_REMOVE_CPULESS | HWLOC_RESTRICT_FLAG_ADAPT_IO |
                                  HWLOC_RESTRICT_FLAG_ADAPT_MISC) != 0)
    throw TopologyError("cannot restrict " + source_ + " to processors " + cpuset_list(set) + ": " +
                        std::strerror(errno));
  gpus_.clear();
  nics_.clear();
  rcs_.clear();
  discover();
}

void Topology::discover() {
  for (hwloc_obj_t b = nullptr; (b = hwloc_get_next_bridge(topo_, b));) {
    if (b->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_HOST) continue;
    RootComplex rc;
    rc.index = static_cast<int>(rcs_.size());
    rc.pci.domain = b->attr->bridge.downstream.pci.domain;
    rc.pci.bus = b->attr->bridge.downstream.pci.secondary_bus;
    rc.numa = nearest_numa(topo_, b);
    rc.cpuset = cpuset_of(topo_, b);
    rc.obj = b;
    rcs_.push_back(rc);
  }

  for (hwloc_obj_t d = nullptr; (d = hwloc_get_next_pcidev(topo_, d));) {
    const auto& pa = d->attr->pcidev;
    unsigned cls = pa.class_id;
    int cuda = -1, nvml = -1;
    std::string model, ofed;
    std::vector<std::string> netdevs;
    for_each_osdev(d, [&](hwloc_obj_t os) {
      if (numbered(os->name, "cuda") >= 0) cuda = numbered(os->name, "cuda");
      if (numbered(os->name, "nvml") >= 0) nvml = numbered(os->name, "nvml");
      if (const char* m = hwloc_obj_get_info_by_name(os, "GPUModel")) model = m;
      if (os->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) ofed = os->name;
      if (os->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) netdevs.push_back(os->name);
    });
    bool nvidia_gpu_class = pa.vendor_id == kVendorNvidia && (cls == 0x0300 || cls == 0x0302);
    if (cuda >= 0 || nvml >= 0 || nvidia_gpu_class) {
      Gpu g;
      g.index = cuda >= 0 ? cuda : nvml;
      g.name = cuda >= 0   ? "cuda" + std::to_string(cuda)
               : nvml >= 0 ? "nvml" + std::to_string(nvml)
                           : pci_of(d).str();
      if (model.empty())
        if (const char* m = hwloc_obj_get_info_by_name(d, "PCIDevice")) model = m;
      g.model = model;
      locate(d, g);
      gpus_.push_back(g);
      continue;
    }
    bool nic_class = cls == 0x0200 || cls == 0x0207 || cls == 0x0280;
    if (!ofed.empty() || !netdevs.empty() || nic_class) {
      Nic n;
      n.name = !ofed.empty() ? ofed : !netdevs.empty() ? netdevs.front() : pci_of(d).str();
      n.netdevs = netdevs;
      locate(d, n);
      nics_.push_back(n);
    }
  }
  // NVIDIA display/3D PCI devices count only on a machine where hwloc saw no CUDA/NVML device
  // at all (no driver, or an export without them); otherwise they are not usable GPUs.
  bool any_named =
      std::any_of(gpus_.begin(), gpus_.end(), [](const Gpu& g) { return g.index >= 0; });
  if (any_named)
    gpus_.erase(
        std::remove_if(gpus_.begin(), gpus_.end(), [](const Gpu& g) { return g.index < 0; }),
        gpus_.end());
  int next = 0;
  for (const auto& g : gpus_) next = std::max(next, g.index + 1);
  for (auto& g : gpus_)
    if (g.index < 0) g.index = next++;
  std::stable_sort(gpus_.begin(), gpus_.end(),
                   [](const Gpu& a, const Gpu& b) { return a.index < b.index; });
  logger("topo")->debug("{}: {} GPUs, {} NICs, {} root complexes, {} NUMA nodes", source_,
                        gpus_.size(), nics_.size(), rcs_.size(), numa_count());
}

namespace {

// This machine through the topology cache (topology_cache.hpp): the file's XML, or else the
// machine discovered (once) and written there; loaded as this system with its allowed resources.
// False (and `topo` fresh again) when there is no cache or the XML does not load.
bool load_cached(hwloc_topology_t& topo) {
  const std::string cache = topology_cache_file();
  if (cache.empty()) return false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string xml = attempt == 0 ? read_topology_cache(cache) : std::string();
    if (xml.empty()) {
      xml = discover_topology_xml();
      if (xml.empty()) return false;
      write_topology_cache(cache, xml);
      attempt = 1;  // (a fresh discovery that does not load is not tried again)
    }
    if (hwloc_topology_set_xmlbuffer(topo, xml.data(), static_cast<int>(xml.size()) + 1) == 0 &&
        hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM |
                                           HWLOC_TOPOLOGY_FLAG_THISSYSTEM_ALLOWED_RESOURCES) == 0 &&
        hwloc_topology_load(topo) == 0)
      return true;
    logger("topo")->info("the topology cache {} does not load: discovering the machine", cache);
    hwloc_topology_destroy(topo);
    topo = nullptr;
    if (init_hwloc_topology(&topo) != 0) throw TopologyError("hwloc_topology_init failed");
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
  }
  return false;
}

}  // namespace

std::unique_ptr<Topology> load_topology(const LoadOptions& opts) {
  const std::string& file = opts.xml_file;
  std::unique_ptr<Topology> t(new Topology());
  if (init_hwloc_topology(&t->topo_) != 0) throw TopologyError("hwloc_topology_init failed");
  hwloc_topology_set_io_types_filter(t->topo_, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (!file.empty()) {
    struct stat st;
    if (::stat(file.c_str(), &st) != 0)
      throw TopologyError("topology file '" + file + "': " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw TopologyError("topology file '" + file + "' is not a file");
    if (hwloc_topology_set_xml(t->topo_, file.c_str()) != 0)
      throw TopologyError("topology file '" + file + "' is not a valid hwloc XML file");
    t->source_ = file;
  } else {
    t->source_ = "this machine";
    if (load_cached(t->topo_)) {
      t->discover();
      return t;
    }
  }
  if (hwloc_topology_load(t->topo_) != 0)
    throw TopologyError("cannot load the topology of " + t->source_ + ": " + std::strerror(errno));
  t->discover();
  return t;
}

}  // namespace pe::topo
