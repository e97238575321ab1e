#include "topology/placement.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>

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
std::vector<size_t> block_order(const Analysis& a, const std::vector<Block>& blocks, bool numa) {
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!numa) return order;
  std::vector<std::vector<size_t>> per_numa;
  std::vector<int> numas;
  for (size_t i = 0; i < blocks.size(); ++i) {
    int n = a.domains[static_cast<size_t>(blocks[i].domain)].numa;
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

void bind(const Topology& t, const Analysis& a, BindTo how, bool have_gpus,
          std::vector<RankPlacement>& ranks) {
  if (how == BindTo::None || (how == BindTo::Default && !have_gpus)) return;
  hwloc_topology_t topo = t.raw();
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_bitmap_t one = hwloc_bitmap_alloc();
  std::map<std::string, int> used;  // cores handed out per cpuset
  for (auto& r : ranks) {
    const Domain& d = a.domains[static_cast<size_t>(r.domain)];
    // Near the rank's own GPUs (one NVLink island can span sockets); without GPUs, its domain.
    hwloc_bitmap_zero(set);
    for (int idx : r.gpus)
      for (const auto& g : t.gpus())
        if (g.index == idx) {
          hwloc_bitmap_list_sscanf(one, g.cpuset.c_str());
          hwloc_bitmap_or(set, set, one);
        }
    if (hwloc_bitmap_iszero(set)) hwloc_bitmap_list_sscanf(set, d.cpuset.c_str());
    if (how == BindTo::Numa && d.numa >= 0) {
      hwloc_obj_t node =
          hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(d.numa));
      if (node) hwloc_bitmap_copy(set, node->cpuset);
    } else if (how == BindTo::Core) {
      int ncores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE);
      if (ncores > 0) {
        // As mpirun: two ranks bound to one core is refused, not done quietly.
        int j = used[cpuset_list(set)]++;
        if (j >= ncores) {
          std::string cpus = cpuset_list(set);
          hwloc_bitmap_free(one);
          hwloc_bitmap_free(set);
          throw TopologyError("--bind-to core: more ranks than the " + std::to_string(ncores) +
                              " core(s) near them (processors " + cpus + ") on " + t.source() +
                              ": use --bind-to none or numa, or fewer ranks");
        }
        hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(topo, set, HWLOC_OBJ_CORE,
                                                               static_cast<unsigned>(j));
        hwloc_bitmap_and(set, set, core->cpuset);
      }
    }
    r.cpuset = cpuset_list(set);
    r.os_cpus = cpuset_os_cpus(set);
  }
  hwloc_bitmap_free(one);
  hwloc_bitmap_free(set);
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

// "a, b or c".
template <typename E, size_t N>
std::string list_choices(const E (&choices)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i)
    s += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + to_string(choices[i]);
  return s;
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
  }
  return "?";
}

MapBy parse_map_by(const std::string& s) {
  if (auto m = find_choice(kMapByChoices, s)) return *m;
  throw TopologyError("--map-by: expected " + list_choices(kMapByChoices) + ", got '" + s + "'");
}

BindTo parse_bind_to(const std::string& s) {
  if (auto b = find_choice(kBindToChoices, s)) return *b;
  throw TopologyError("--bind-to: expected " + list_choices(kBindToChoices) + ", got '" + s + "'");
}

std::vector<RankPlacement> place_ranks(const Topology& t, const Analysis& a,
                                       const PlacementOptions& o) {
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
  std::vector<RankPlacement> ranks(static_cast<size_t>(std::max(o.nranks, 0)));
  if (ngpus > 0) {
    auto blocks = gpu_blocks(t, a, o.gpus_per_rank, o.map_by == MapBy::Gpu);
    auto order = block_order(a, blocks, o.map_by == MapBy::Numa);
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
  bind(t, a, o.bind_to, ngpus > 0, ranks);
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
