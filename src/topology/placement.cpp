#include "topology/placement.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

#include "common/strings.hpp"

namespace pe::topo {
namespace {

struct Block {
  std::vector<int> gpus;  // positions in Topology::gpus()
  int domain = 0;
};

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

hwloc_obj_type_t hwloc_type(MapBy kind) {
  switch (kind) {
    case MapBy::Socket:
      return HWLOC_OBJ_PACKAGE;
    case MapBy::Numa:
      return HWLOC_OBJ_NUMANODE;
    case MapBy::L3Cache:
      return HWLOC_OBJ_L3CACHE;
    case MapBy::Core:
      return HWLOC_OBJ_CORE;
    case MapBy::HwThread:
      return HWLOC_OBJ_PU;
    default:
      return HWLOC_OBJ_MACHINE;
  }
}

MapBy kind_of(BindTo b) {
  switch (b) {
    case BindTo::Core:
      return MapBy::Core;
    case BindTo::HwThread:
      return MapBy::HwThread;
    case BindTo::L3Cache:
      return MapBy::L3Cache;
    case BindTo::Socket:
      return MapBy::Socket;
    case BindTo::Numa:
      return MapBy::Numa;
    default:
      return MapBy::Node;
  }
}

// The objects of a kind (node: the machine) with processors inside `within`, in logical order.
// NUMA nodes without processors (a GPU's memory) are not places for ranks.
std::vector<hwloc_obj_t> objects_inside(hwloc_topology_t topo, MapBy kind,
                                        hwloc_const_bitmap_t within) {
  std::vector<hwloc_obj_t> v;
  hwloc_obj_type_t type = hwloc_type(kind);
  int n = hwloc_get_nbobjs_by_type(topo, type);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, static_cast<unsigned>(i));
    if (o && o->cpuset && !hwloc_bitmap_iszero(o->cpuset) &&
        hwloc_bitmap_isincluded(o->cpuset, within))
      v.push_back(o);
  }
  return v;
}

// The object of a kind that holds processor `pu` (the machine when none does).
hwloc_obj_t object_around(hwloc_topology_t topo, MapBy kind, int pu) {
  hwloc_obj_type_t type = hwloc_type(kind);
  int n = hwloc_get_nbobjs_by_type(topo, type);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, static_cast<unsigned>(i));
    if (o && o->cpuset && hwloc_bitmap_isset(o->cpuset, static_cast<unsigned>(pu))) return o;
  }
  return hwloc_get_root_obj(topo);
}

// "socket 1", "core 3", "this machine" (logical indexes, as lstopo shows them).
std::string object_name(hwloc_obj_t o, MapBy kind) {
  if (kind == MapBy::Node) return "the machine";
  return std::string(to_string(kind)) + " " + std::to_string(o->logical_index);
}

// Binding to a level inside a place: `place` narrowed to the next core or hwthread in it, or
// widened to the socket, NUMA node or L3 cache around it (a place wider than one of those: the
// next one inside it in turn).  As mpirun, ranks on one core are an overload only beyond its
// hardware threads: more ranks than the processors there are refused, unless `overload`, then
// shared in turn.  `used` counts the ranks handed out per place and per core; `near`: how a
// refusal names the place ("near them", "of socket 0").
void narrow(const Topology& t, hwloc_bitmap_t place, BindTo level, bool overload,
            std::map<std::string, int>& used, const std::string& near) {
  hwloc_topology_t topo = t.raw();
  const MapBy kind = kind_of(level);
  if (hwloc_bitmap_iszero(place) || kind == MapBy::Node) return;
  const std::string key = cpuset_list(place);
  auto refuse = [&](size_t objects, const std::string& cpus) {
    throw TopologyError(std::string("--bind-to ") + to_string(level) + ": more ranks than the " +
                        std::to_string(objects) + " " + to_string(kind) + "(s) " + near +
                        " hold, one per processor (processors " + cpus + ") on " + t.source() +
                        ": use --bind-to " + to_string(level) +
                        ":overload-allowed, none or numa, or fewer ranks");
  };
  if (level == BindTo::Core || level == BindTo::HwThread) {
    auto inside = objects_inside(topo, kind, place);
    if (inside.empty()) {  // a place smaller than a core: the core around it
      hwloc_obj_t around = object_around(topo, kind, hwloc_bitmap_first(place));
      std::string cpus = cpuset_list(around->cpuset);
      if (used["core " + cpus]++ >= hwloc_bitmap_weight(around->cpuset) && !overload)
        refuse(1, cpus);
      hwloc_bitmap_copy(place, around->cpuset);
      return;
    }
    size_t j = static_cast<size_t>(used[key]++);
    hwloc_obj_t obj = inside[j % inside.size()];
    if (used["core " + cpuset_list(obj->cpuset)]++ >= hwloc_bitmap_weight(obj->cpuset) && !overload)
      refuse(inside.size(), key);
    hwloc_bitmap_copy(place, obj->cpuset);
    return;
  }
  hwloc_obj_t around = object_around(topo, kind, hwloc_bitmap_first(place));
  if (!hwloc_bitmap_isincluded(place, around->cpuset)) {
    auto inside = objects_inside(topo, kind, place);
    if (!inside.empty()) around = inside[static_cast<size_t>(used[key]++) % inside.size()];
  }
  hwloc_bitmap_copy(place, around->cpuset);
}

// GPU blocks of k GPUs, in domain order (or GPU index order for --map-by gpu).
std::vector<Block> gpu_blocks(const Topology& t, const Analysis& a, int k, bool by_index) {
  std::vector<std::pair<int, int>> seq;  // (gpu position, domain)
  for (const auto& d : a.domains)
    for (int g : d.gpus) seq.emplace_back(g, d.index);
  if (by_index)
    std::sort(seq.begin(), seq.end(), [&t](auto x, auto y) {
      return t.gpus()[static_cast<size_t>(x.first)].index <
             t.gpus()[static_cast<size_t>(y.first)].index;
    });
  std::vector<Block> blocks;
  for (size_t i = 0; i + static_cast<size_t>(k) <= seq.size(); i += static_cast<size_t>(k)) {
    Block b;
    b.domain = seq[i].second;
    for (size_t j = i; j < i + static_cast<size_t>(k); ++j) b.gpus.push_back(seq[j].first);
    blocks.push_back(b);
  }
  return blocks;
}

// Order in which blocks are taken: as listed, or NUMA-interleaved for --map-by numa.
std::vector<size_t> block_order(const Topology& t, const Analysis& a,
                                const std::vector<Block>& blocks, bool numa) {
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!numa) return order;
  std::vector<std::vector<size_t>> per_numa;
  std::vector<int> numas;
  for (size_t i = 0; i < blocks.size(); ++i) {
    // The NUMA node of the block's first GPU (an NVLink island may span several), else its
    // domain's.
    int n = t.gpus()[static_cast<size_t>(blocks[i].gpus.front())].numa;
    if (n < 0) n = a.domains[static_cast<size_t>(blocks[i].domain)].numa;
    auto it = std::find(numas.begin(), numas.end(), n);
    if (it == numas.end()) {
      numas.push_back(n);
      per_numa.emplace_back();
      it = numas.end() - 1;
    }
    per_numa[static_cast<size_t>(it - numas.begin())].push_back(i);
  }
  order.clear();
  for (size_t round = 0; order.size() < blocks.size(); ++round)
    for (auto& v : per_numa)
      if (round < v.size()) order.push_back(v[round]);
  return order;
}

// An hwloc bitmap owned here (freed on every path, errors included).
class Bitmap {
 public:
  Bitmap() : b_(hwloc_bitmap_alloc()) {}
  ~Bitmap() { hwloc_bitmap_free(b_); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  Bitmap(Bitmap&& o) noexcept : b_(o.b_) { o.b_ = nullptr; }
  hwloc_bitmap_t get() const { return b_; }

 private:
  hwloc_bitmap_t b_;
};

// The union of the cpusets near these GPUs (Topology::gpus() indexes).
void near_gpus(const Topology& t, const std::vector<int>& gpus, hwloc_bitmap_t out) {
  Bitmap one;
  hwloc_bitmap_zero(out);
  for (int idx : gpus)
    for (const auto& g : t.gpus())
      if (g.index == idx) {
        hwloc_bitmap_list_sscanf(one.get(), g.cpuset.c_str());
        hwloc_bitmap_or(out, out, one.get());
      }
}

void bind(const Topology& t, const Analysis& a, BindTo how, bool overload, bool have_gpus,
          std::vector<RankPlacement>& ranks) {
  Bitmap set;
  std::map<std::string, int> used;  // cores handed out per cpuset
  for (auto& r : ranks) {
    const Domain& d = a.domains[static_cast<size_t>(r.domain)];
    // Near the rank's own GPUs (one NVLink island can span sockets); without GPUs, its domain.
    near_gpus(t, r.gpus, set.get());
    if (hwloc_bitmap_iszero(set.get())) hwloc_bitmap_list_sscanf(set.get(), d.cpuset.c_str());
    r.pu = hwloc_bitmap_first(set.get());
    if (how == BindTo::None || (how == BindTo::Default && !have_gpus)) continue;
    if (how != BindTo::Gpu && how != BindTo::Default) {
      // As mpirun: two ranks bound to one core is refused, not done quietly.
      narrow(t, set.get(), how, overload, used, "near them");
    }
    r.cpuset = cpuset_list(set.get());
    r.os_cpus = cpuset_os_cpus(set.get());
    r.pu = hwloc_bitmap_first(set.get());
  }
}

// A number below 2^20 (the slot list holds digits and separators only), else nothing.
std::optional<int> slot_number(const std::string& s) {
  auto v = parse_int(s, 0, (1 << 20) - 1);
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}

// The processors of a rankfile's slot list here, added to `out` (TopologyError naming a socket,
// core or hardware thread this machine lacks).
void slot_place(const Topology& t, const std::string& spec, bool hwthreads, hwloc_bitmap_t out,
                const std::string& what) {
  hwloc_topology_t topo = t.raw();
  hwloc_const_bitmap_t all = hwloc_topology_get_topology_cpuset(topo);
  auto sockets = objects_inside(topo, MapBy::Socket, all);
  const std::string unit = hwthreads ? "hardware thread" : "core";
  for (const SlotItem& it : parse_slot_list(spec, what)) {
    std::vector<std::pair<hwloc_const_bitmap_t, std::string>> within;  // where units are counted
    if (it.socket == -1) within.emplace_back(all, t.source());
    if (it.socket == -2)
      for (size_t k = 0; k < sockets.size(); ++k)
        within.emplace_back(sockets[k]->cpuset,
                            "socket " + std::to_string(k) + " of " + t.source());
    if (it.socket >= 0) {
      if (static_cast<size_t>(it.socket) >= sockets.size())
        throw TopologyError(what + spec + ": " + t.source() + " has " +
                            std::to_string(sockets.size()) +
                            " socket(s), numbered from 0; no socket " + std::to_string(it.socket));
      within.emplace_back(sockets[static_cast<size_t>(it.socket)]->cpuset,
                          "socket " + std::to_string(it.socket) + " of " + t.source());
    }
    for (const auto& [set, name] : within) {
      if (it.cores.empty()) {
        hwloc_bitmap_or(out, out, set);
        continue;
      }
      auto units = objects_inside(topo, hwthreads ? MapBy::HwThread : MapBy::Core, set);
      for (const auto& [lo, hi] : it.cores) {
        if (static_cast<size_t>(hi) >= units.size())
          throw TopologyError(what + spec + ": " + name + " has " + std::to_string(units.size()) +
                              " " + unit + "s, numbered from 0; no " + unit + " " +
                              std::to_string(hi));
        for (int c = lo; c <= hi; ++c)
          hwloc_bitmap_or(out, out, units[static_cast<size_t>(c)]->cpuset);
      }
    }
  }
}

// The second way (see placement.hpp): places among processor objects (or a rankfile's), then
// GPUs near them, then binding.
void place_on_processors(const Topology& t, const Analysis& a, const PlacementOptions& o,
                         std::vector<RankPlacement>& ranks) {
  hwloc_topology_t topo = t.raw();
  const MapSpec spec{o.map_by, o.ppr, o.ppr_object, o.pe, std::nullopt};
  const bool rankfile = !o.places.empty();
  const MapBy kind =
      o.map_by == MapBy::Ppr ? o.ppr_object
      : rankfile || o.map_by == MapBy::Slot || o.map_by == MapBy::Node || o.map_by == MapBy::Default
          ? MapBy::Node
          : o.map_by;
  auto objs = kind == MapBy::Node
                  ? std::vector<hwloc_obj_t>{}
                  : objects_inside(topo, kind, hwloc_topology_get_topology_cpuset(topo));
  if (objs.empty()) objs.push_back(hwloc_get_root_obj(topo));  // (no such objects: the machine)
  const size_t n = ranks.size(), m = objs.size();
  if (rankfile && o.places.size() != n)
    throw TopologyError("the rankfile places " + std::to_string(o.places.size()) +
                        " rank(s) here, not " + std::to_string(n));
  // Each rank's object and its turn there (with a rankfile: the machine, the rank's own place).
  std::vector<size_t> at(n), turn(n), on(m, 0);
  for (size_t i = 0; i < n && !rankfile; ++i) {
    if (o.map_by == MapBy::Ppr) {
      at[i] = i / static_cast<size_t>(o.ppr);
      turn[i] = i % static_cast<size_t>(o.ppr);
      if (at[i] >= m)
        throw TopologyError(
            "--map-by " + to_string(spec) + ": " + std::to_string(n) + " ranks need " +
            std::to_string((n + static_cast<size_t>(o.ppr) - 1) / static_cast<size_t>(o.ppr)) +
            " " + to_string(kind) + "s; " + t.source() + " has " + std::to_string(m));
    } else {
      at[i] = i % m;
      turn[i] = i / m;
    }
    ++on[at[i]];
  }
  std::vector<Bitmap> place(n);
  const std::string unit = o.hwthread_cpus ? "hwthread" : "core";  // of PE=n
  bool crowded = false;  // more than one rank on a core or hwthread object: mpirun binds none
  for (size_t i = 0; i < n; ++i) {
    hwloc_obj_t obj = objs[at[i]];
    hwloc_bitmap_t p = place[i].get();
    if (rankfile) {
      if (o.places[i].empty())
        hwloc_bitmap_copy(p, obj->cpuset);  // anywhere (unbound)
      else
        try {
          slot_place(t, o.places[i], o.hwthread_cpus, p,
                     o.places_from == "--rankfile" ? "slot=" : o.places_from + " ");
        } catch (const TopologyError& e) {
          if (o.places_from != "--rankfile") throw;  // the same list for every rank
          throw TopologyError("--rankfile, local rank " + std::to_string(i) +
                              " of this node: " + e.what());
        }
    } else if (o.pe > 0) {
      auto cores =
          objects_inside(topo, o.hwthread_cpus ? MapBy::HwThread : MapBy::Core, obj->cpuset);
      if (cores.empty()) cores.push_back(obj);
      size_t first = turn[i] * static_cast<size_t>(o.pe);
      // (:overload-allowed: the ranks share the cores in turn)
      if (on[at[i]] * static_cast<size_t>(o.pe) > cores.size() && !o.overload)
        throw TopologyError("--map-by " + to_string(spec) + ": " + std::to_string(on[at[i]]) +
                            (on[at[i]] == 1 ? " rank of " : " ranks of ") + std::to_string(o.pe) +
                            " " + unit + "s need " +
                            std::to_string(on[at[i]] * static_cast<size_t>(o.pe)) + " on " +
                            object_name(obj, kind) + ", which has " + std::to_string(cores.size()) +
                            " (processors " + cpuset_list(obj->cpuset) + ") on " + t.source() +
                            ": use fewer ranks or a smaller PE");
      for (size_t c = first; c < first + static_cast<size_t>(o.pe); ++c)
        hwloc_bitmap_or(p, p, cores[c % cores.size()]->cpuset);
    } else {
      hwloc_bitmap_copy(p, obj->cpuset);
      crowded = crowded || ((kind == MapBy::Core || kind == MapBy::HwThread) && turn[i] > 0);
    }
    ranks[i].pu = hwloc_bitmap_first(p);
  }
  // GPUs: among the blocks near the place's socket (all, when none is, or when the place spans
  // sockets), the least used; of those, the nearest: near the place itself, then its NUMA node.
  // So that ranks share the GPUs of their socket evenly before any goes further.
  const int ngpus = static_cast<int>(t.gpus().size());
  auto blocks = ngpus > 0 ? gpu_blocks(t, a, o.gpus_per_rank, false) : std::vector<Block>{};
  std::vector<int> use(blocks.size(), 0);
  std::vector<Bitmap> block_near(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    std::vector<int> idx;
    for (int g : blocks[b].gpus) idx.push_back(t.gpus()[static_cast<size_t>(g)].index);
    near_gpus(t, idx, block_near[b].get());
  }
  Bitmap dom;
  for (size_t i = 0; i < n; ++i) {
    hwloc_bitmap_t p = place[i].get();
    if (!blocks.empty()) {
      const int pu = hwloc_bitmap_first(p);
      hwloc_const_bitmap_t socket = object_around(topo, MapBy::Socket, pu)->cpuset;
      hwloc_const_bitmap_t numa = object_around(topo, MapBy::Numa, pu)->cpuset;
      bool any = false;
      if (hwloc_bitmap_isincluded(p, socket))
        for (const auto& nb : block_near) any = any || hwloc_bitmap_intersects(nb.get(), socket);
      int best = -1;
      std::pair<int, int> best_key;
      for (size_t b = 0; b < blocks.size(); ++b) {
        hwloc_const_bitmap_t nb = block_near[b].get();
        if (any && !hwloc_bitmap_intersects(nb, socket)) continue;
        int dist = hwloc_bitmap_intersects(nb, p) ? 0 : hwloc_bitmap_intersects(nb, numa) ? 1 : 2;
        std::pair<int, int> key{use[b], dist};
        if (best < 0 || key < best_key) best = static_cast<int>(b), best_key = key;
      }
      ++use[static_cast<size_t>(best)];
      const Block& blk = blocks[static_cast<size_t>(best)];
      ranks[i].domain = blk.domain;
      for (int g : blk.gpus) ranks[i].gpus.push_back(t.gpus()[static_cast<size_t>(g)].index);
    } else {
      ranks[i].domain = 0;
      for (const auto& d : a.domains) {
        hwloc_bitmap_list_sscanf(dom.get(), d.cpuset.c_str());
        if (hwloc_bitmap_intersects(dom.get(), p)) {
          ranks[i].domain = d.index;
          break;
        }
      }
    }
  }
  // Binding.  With PE=n, core and hwthread keep the rank's PE cores (mpirun's PE binds them).
  BindTo level = o.bind_to;
  const bool chosen = level != BindTo::Default;
  if (o.pe > 0 && chosen && level != BindTo::Core && level != BindTo::HwThread &&
      level != BindTo::None)
    throw TopologyError("--map-by " + to_string(spec) + " binds each rank to its " +
                        std::to_string(o.pe) + " " + unit + "(s): --bind-to " + to_string(level) +
                        " contradicts it (core, hwthread or none go with it)");
  if (!chosen)
    level = o.pe > 0 || rankfile      ? BindTo::Default
            : crowded                 ? BindTo::None
            : kind == MapBy::Core     ? BindTo::Core
            : kind == MapBy::HwThread ? BindTo::HwThread
            : kind == MapBy::L3Cache  ? BindTo::L3Cache
            : kind == MapBy::Socket   ? BindTo::Socket
            : kind == MapBy::Numa     ? BindTo::Numa
                                      : BindTo::None;
  std::map<std::string, int> used;
  for (size_t i = 0; i < n && level != BindTo::None; ++i) {
    if (rankfile && o.places[i].empty()) continue;  // no slot= given: unbound
    hwloc_bitmap_t p = place[i].get();
    if (level == BindTo::Gpu) {
      near_gpus(t, ranks[i].gpus, p);
    } else if (level != BindTo::Default &&
               !(o.pe > 0 && (level == BindTo::Core || level == BindTo::HwThread))) {
      narrow(t, p, level, o.overload || !chosen, used, "of " + object_name(objs[at[i]], kind));
    }
    ranks[i].cpuset = cpuset_list(p);
    ranks[i].os_cpus = cpuset_os_cpus(p);
    ranks[i].pu = hwloc_bitmap_first(p);
  }
}

// Rail alignment: a rank with GPUs gets the NICs nearest its own GPUs (nearest_nics).  The GPU
// blocks that find the same nearest NICs share them out in order (with m blocks and n NICs:
// block k gets NIC k mod n when m >= n, else NICs k, k+m, ...); ranks on one block get the same
// NICs.  A rank without GPUs gets its domain's NICs.
void assign_nics(const Topology& t, const Analysis& a, std::vector<RankPlacement>& ranks) {
  std::map<std::vector<int>, std::vector<std::vector<int>>> sharing;  // nearest NICs -> blocks
  std::map<std::vector<int>, std::vector<int>> chosen;                // block -> its NICs
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Domain& d = a.domains[static_cast<size_t>(ranks[i].domain)];
    if (ranks[i].gpus.empty()) {
      for (int n : d.nics) ranks[i].nics.push_back(t.nics()[static_cast<size_t>(n)].name);
      continue;
    }
    std::vector<hwloc_obj_t> objs;
    for (int idx : ranks[i].gpus)
      for (const auto& g : t.gpus())
        if (g.index == idx) objs.push_back(g.obj);
    NearestNics near = nearest_nics(t, objs);
    ranks[i].nic_path = near.path;
    if (near.nics.empty()) continue;
    auto& blocks = sharing[near.nics];
    if (std::find(blocks.begin(), blocks.end(), ranks[i].gpus) == blocks.end())
      blocks.push_back(ranks[i].gpus);
  }
  for (const auto& [nics, blocks] : sharing) {
    const size_t n = nics.size(), m = blocks.size();
    for (size_t k = 0; k < m; ++k)
      for (size_t j = m >= n ? k % n : k; j < n; j += m >= n ? n : m)
        chosen[blocks[k]].push_back(nics[j]);
  }
  for (size_t i = 0; i < ranks.size(); ++i)
    if (!ranks[i].gpus.empty())
      for (int n : chosen[ranks[i].gpus])
        ranks[i].nics.push_back(t.nics()[static_cast<size_t>(n)].name);
}

}  // namespace

const char* to_string(MapBy m) {
  switch (m) {
    case MapBy::Default:
      return "default";
    case MapBy::Slot:
      return "slot";
    case MapBy::Node:
      return "node";
    case MapBy::Numa:
      return "numa";
    case MapBy::Gpu:
      return "gpu";
    case MapBy::Domain:
      return "domain";
    case MapBy::Core:
      return "core";
    case MapBy::HwThread:
      return "hwthread";
    case MapBy::L3Cache:
      return "l3cache";
    case MapBy::Socket:
      return "socket";
    case MapBy::Ppr:
      return "ppr";
  }
  return "?";
}

const char* to_string(RankBy r) {
  switch (r) {
    case RankBy::Slot:
      return "slot";
    case RankBy::Node:
      return "node";
    case RankBy::Numa:
      return "numa";
    case RankBy::Gpu:
      return "gpu";
    case RankBy::Domain:
      return "domain";
    case RankBy::Core:
      return "core";
    case RankBy::HwThread:
      return "hwthread";
    case RankBy::L3Cache:
      return "l3cache";
    case RankBy::Socket:
      return "socket";
  }
  return "?";
}

const char* to_string(BindTo b) {
  switch (b) {
    case BindTo::Default:
      return "default";
    case BindTo::None:
      return "none";
    case BindTo::Core:
      return "core";
    case BindTo::Numa:
      return "numa";
    case BindTo::Gpu:
      return "gpu";
    case BindTo::HwThread:
      return "hwthread";
    case BindTo::L3Cache:
      return "l3cache";
    case BindTo::Socket:
      return "socket";
  }
  return "?";
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

// The modifiers of --map-by: the parts from `from` on, each split at ',' too (Open MPI 4's
// socket:PE=2,oversubscribe).
std::vector<std::string> split_modifiers(const std::vector<std::string>& parts, size_t from) {
  std::vector<std::string> mods;
  for (size_t i = from; i < parts.size(); ++i) {
    mods.emplace_back();
    for (char c : parts[i])
      if (c == ',')
        mods.emplace_back();
      else
        mods.back() += c;
  }
  return mods;
}

// A positive count (1 ... 4096) or nothing.
std::optional<int> small_count(const std::string& s) {
  if (s.empty() || s.size() > 4 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  int v = std::stoi(s);
  if (v < 1 || v > 4096) return std::nullopt;
  return v;
}

}  // namespace

MapSpec parse_map_spec(const std::string& s) {
  auto parts = split(s, ':');
  MapSpec m;
  size_t mods = 1;
  const std::string objects =
      "slot, node, numa, gpu, domain, core, hwthread, l3cache, socket, "
      "package or ppr:N:OBJECT";
  if (lower(parts[0]) == "ppr") {
    auto n = parts.size() > 1 ? small_count(parts[1]) : std::nullopt;
    auto obj = parts.size() > 2 ? find_choice(kPprObjects, parts[2]) : std::nullopt;
    if (!n && obj && !parts[1].empty() &&
        parts[1].find_first_not_of("0123456789") == std::string::npos)
      throw TopologyError("--map-by " + s + ": N is 1 to 4096 ranks per " + parts[2]);
    if (!n || !obj)
      throw TopologyError(
          "--map-by: expected ppr:N:OBJECT, N ranks per node, socket, numa, "
          "l3cache, core or hwthread, got '" +
          s + "'");
    m.by = MapBy::Ppr, m.ppr = *n, m.ppr_object = *obj;
    mods = 3;
  } else if (auto by = find_choice(kMapByChoices, parts[0])) {
    m.by = *by;
  } else {
    throw TopologyError("--map-by: expected one of " + objects + ", got '" + s + "'");
  }
  for (const std::string& given : split_modifiers(parts, mods)) {
    std::string mod = lower(given);
    if (mod.rfind("pe=", 0) == 0) {
      auto pe = small_count(mod.substr(3));
      if (!pe)
        throw TopologyError("--map-by: PE= takes a number of cores from 1 to 4096, got '" + s +
                            "'");
      if (m.pe > 0) throw TopologyError("--map-by: PE= is given twice in '" + s + "'");
      m.pe = *pe;
    } else if (mod == "nolocal") {
      m.nolocal = true;
    } else if (mod == "oversubscribe" || mod == "nooversubscribe") {
      if (m.oversubscribe && *m.oversubscribe != (mod == "oversubscribe"))
        throw TopologyError(
            "--map-by: oversubscribe and nooversubscribe contradict each other "
            "in '" +
            s + "'");
      m.oversubscribe = mod == "oversubscribe";
    } else {
      throw TopologyError("--map-by: unknown modifier '" + given + "' in '" + s +
                          "' (PE=n, oversubscribe, nooversubscribe and nolocal are known)");
    }
  }
  check_map_spec(m, "--map-by " + s);
  return m;
}

void check_map_spec(const MapSpec& m, const std::string& what) {
  if (m.pe == 0) return;
  MapBy obj = m.by == MapBy::Ppr ? m.ppr_object : m.by;
  // (PE=1 on a core or hwthread is that object itself: mpirun takes it)
  if (((obj == MapBy::Core || obj == MapBy::HwThread) && m.pe > 1) || obj == MapBy::Gpu ||
      obj == MapBy::Domain)
    throw TopologyError(what +
                        ": PE=n gives each rank n cores of a wider object: slot, node, "
                        "numa, l3cache, socket or ppr:N:node|socket|numa|l3cache");
}

BindSpec parse_bind_spec(const std::string& s) {
  auto parts = split(s, ':');
  BindSpec b;
  auto to = find_choice(kBindToChoices, parts[0]);
  if (!to) {
    std::string list;
    for (BindTo e : kBindToChoices) list += std::string(to_string(e)) + ", ";
    throw TopologyError("--bind-to: expected one of " + list.substr(0, list.size() - 2) +
                        " or package, got '" + s + "'");
  }
  b.to = *to;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string q = lower(parts[i]);
    if (q == "overload-allowed")
      b.overload = true;
    else if (q != "if-supported")
      throw TopologyError("--bind-to: unknown qualifier '" + parts[i] + "' in '" + s +
                          "' (overload-allowed and if-supported are known)");
  }
  return b;
}

std::string to_string(const MapSpec& m) {
  std::string s = m.by == MapBy::Ppr
                      ? "ppr:" + std::to_string(m.ppr) + ":" + to_string(m.ppr_object)
                      : std::string(to_string(m.by));
  if (m.pe > 0) s += ":PE=" + std::to_string(m.pe);
  return s;
}

std::vector<std::string> expand_slot_list(const std::string& s) {
  std::vector<std::string> out;
  for (const SlotItem& it : parse_slot_list(s)) {
    std::string socket = it.socket == -1   ? ""
                         : it.socket == -2 ? "*:"
                                           : std::to_string(it.socket) + ":";
    if (it.cores.empty()) out.push_back(socket + "*");
    for (const auto& [lo, hi] : it.cores)
      for (int c = lo; c <= hi; ++c) out.push_back(socket + std::to_string(c));
  }
  return out;
}

void restrict_to(Topology& t, const std::string& list, bool hwthreads) {
  Bitmap set;
  slot_place(t, list, hwthreads, set.get(), "--cpu-set ");
  t.restrict_cpus(set.get());
}

SlotList parse_slot_list(const std::string& s, const std::string& what) {
  auto bad = [&](const std::string& why) {
    std::string shown = s.substr(0, 200);  // one line: control characters as '?'
    for (char& ch : shown)
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
    return TopologyError(what + shown + (s.size() > 200 ? "..." : "") + ": " + why +
                         " (Open MPI's form: SOCKET:CORES or CORES, CORES as * or N,N-M, items "
                         "separated by ';')");
  };
  if (s.empty()) throw bad("the list is empty");
  if (s.find_first_not_of("0123456789,-:;*") != std::string::npos)
    throw bad("only digits, ',', '-', ':', ';' and '*' may appear");
  SlotList out;
  for (const auto& item : split(s, ';')) {
    SlotItem it;
    std::string cores = item;
    auto colon = item.find(':');
    if (colon != std::string::npos) {
      std::string socket = item.substr(0, colon);
      cores = item.substr(colon + 1);
      if (socket == "*")
        it.socket = -2;
      else if (auto k = slot_number(socket))
        it.socket = *k;
      else
        throw bad("'" + socket + "' is not a socket number");
      if (cores.find(':') != std::string::npos) throw bad("'" + item + "' has more than one ':'");
    }
    if (cores != "*")
      for (const auto& r : split(cores, ',')) {
        auto dash = r.find('-');
        auto lo = slot_number(r.substr(0, dash));
        auto hi = dash == std::string::npos ? lo : slot_number(r.substr(dash + 1));
        if (!lo || !hi || *hi < *lo) throw bad("'" + r + "' is not a number or a range N-M");
        it.cores.emplace_back(*lo, *hi);
      }
    out.push_back(std::move(it));
  }
  return out;
}

bool maps_on_processors(MapBy by, int pe) {
  return pe > 0 || by == MapBy::Core || by == MapBy::HwThread || by == MapBy::L3Cache ||
         by == MapBy::Socket || by == MapBy::Ppr;
}

int count_objects(const Topology& t, MapBy kind) {
  if (kind == MapBy::Node) return 1;
  auto v = objects_inside(t.raw(), kind, hwloc_topology_get_topology_cpuset(t.raw()));
  return std::max<int>(1, static_cast<int>(v.size()));
}

std::vector<RankPlacement> place_ranks(const Topology& t, const Analysis& a,
                                       const PlacementOptions& o) {
  if (o.confine) {
    PlacementOptions inside = o;
    inside.confine = false;
    auto ranks = place_ranks(t, a, inside);
    hwloc_const_bitmap_t all = hwloc_topology_get_topology_cpuset(t.raw());
    for (auto& r : ranks)
      if (r.os_cpus.empty() && o.bind_to != BindTo::None) {
        r.cpuset = cpuset_list(all);
        r.os_cpus = cpuset_os_cpus(all);
      }
    return ranks;
  }
  const int ngpus = static_cast<int>(t.gpus().size());
  if (o.gpus_per_rank < 1) throw TopologyError("--gpus-per-rank must be at least 1");
  if (ngpus > 0 && o.gpus_per_rank > ngpus)
    throw TopologyError("--gpus-per-rank " + std::to_string(o.gpus_per_rank) + ": " + t.source() +
                        " has only " + std::to_string(ngpus) + " GPUs");
  if (o.bind_to == BindTo::Gpu && ngpus == 0)
    throw TopologyError("--bind-to gpu: " + t.source() + " has no GPUs");
  if (o.map_by == MapBy::Gpu && ngpus == 0)
    throw TopologyError("--map-by gpu: " + t.source() + " has no GPUs");
  if (o.gpus_per_rank > 1 && ngpus == 0)
    throw TopologyError("--gpus-per-rank " + std::to_string(o.gpus_per_rank) + ": " + t.source() +
                        " has no GPUs");
  if (o.map_by == MapBy::Ppr && o.ppr < 1)
    throw TopologyError("--map-by ppr: N must be at least 1");
  if (!o.cpu_list.empty()) {  // --cpu-list: places, as a rankfile's
    PlacementOptions p = o;
    p.cpu_list.clear();
    p.places_from = "--cpu-list";
    std::vector<std::string> each =
        o.cpu_list_ordered ? expand_slot_list(o.cpu_list) : std::vector<std::string>{o.cpu_list};
    for (int k = 0; k < o.nranks; ++k) {
      if (o.cpu_list_ordered && static_cast<size_t>(k) >= each.size())
        throw TopologyError("--cpu-list " + o.cpu_list + " with --bind-to cpu-list:ordered: " +
                            std::to_string(o.nranks) + " ranks here, " +
                            std::to_string(each.size()) + " processors in the list");
      p.places.push_back(each[o.cpu_list_ordered ? static_cast<size_t>(k) : 0]);
    }
    return place_ranks(t, a, p);
  }
  std::vector<RankPlacement> ranks(static_cast<size_t>(std::max(o.nranks, 0)));
  if (!o.places.empty() || maps_on_processors(o.map_by, o.pe)) {
    place_on_processors(t, a, o, ranks);
    for (size_t i = 0; i < ranks.size(); ++i) ranks[i].local_rank = static_cast<int>(i);
    assign_nics(t, a, ranks);
    return ranks;
  }
  if (ngpus > 0) {
    auto blocks = gpu_blocks(t, a, o.gpus_per_rank, o.map_by == MapBy::Gpu);
    auto order = block_order(t, a, blocks, o.map_by == MapBy::Numa);
    // More ranks than blocks: consecutive ranks share a block (ranks 0,1 on GPU 0, ...), so
    // neighbouring ranks stay close; --map-by numa deals them round-robin instead.
    const bool dealt = o.map_by == MapBy::Numa;
    for (size_t i = 0; i < ranks.size(); ++i) {
      size_t k = dealt || ranks.size() <= order.size() ? i % order.size()
                                                       : i * order.size() / ranks.size();
      const Block& b = blocks[order[k]];
      ranks[i].domain = b.domain;
      for (int g : b.gpus) ranks[i].gpus.push_back(t.gpus()[static_cast<size_t>(g)].index);
    }
  } else if (o.map_by == MapBy::Numa) {
    for (size_t i = 0; i < ranks.size(); ++i)
      ranks[i].domain = static_cast<int>(i % a.domains.size());
  } else {
    // Consecutive ranks to a domain, each domain's share as its share of the cores (domains
    // alike: as many each), so that binding to cores fits wherever there are enough.
    std::vector<size_t> upto;  // cores of domains 0..d
    for (const auto& d : a.domains) {
      hwloc_bitmap_t set = hwloc_bitmap_alloc();
      hwloc_bitmap_list_sscanf(set, d.cpuset.c_str());
      int n = hwloc_get_nbobjs_inside_cpuset_by_type(t.raw(), set, HWLOC_OBJ_CORE);
      hwloc_bitmap_free(set);
      upto.push_back((upto.empty() ? 0 : upto.back()) + static_cast<size_t>(std::max(n, 1)));
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      size_t core = i * upto.back() / ranks.size();  // the rank's place among the cores
      ranks[i].domain =
          static_cast<int>(std::upper_bound(upto.begin(), upto.end(), core) - upto.begin());
    }
  }
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i].local_rank = static_cast<int>(i);
  assign_nics(t, a, ranks);
  // --map-by numa without GPUs binds to the NUMA node, as the other objects bind to theirs.
  const bool numa = o.bind_to == BindTo::Default && ngpus == 0 && o.map_by == MapBy::Numa;
  bind(t, a, numa ? BindTo::Numa : o.bind_to, o.overload, ngpus > 0, ranks);
  return ranks;
}

std::string describe_placement(const RankPlacement& r) {
  std::ostringstream os;
  os << "GPU " << (r.gpus.empty() ? "none" : join_ints(r.gpus)) << ", domain " << r.domain
     << ", NIC ";
  if (r.nics.empty()) os << "none";
  for (size_t i = 0; i < r.nics.size(); ++i) os << (i ? "," : "") << r.nics[i];
  if (!r.nic_path.empty() && !r.nics.empty()) os << " (" << r.nic_path << ")";
  os << ", cpus " << (r.cpuset.empty() ? "unbound" : r.cpuset);
  return os.str();
}

std::string format_placement(const std::vector<RankPlacement>& p) {
  std::ostringstream os;
  for (const auto& r : p)
    os << "local rank " << r.local_rank << ": " << describe_placement(r) << "\n";
  return os.str();
}

}  // namespace pe::topo
