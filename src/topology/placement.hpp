// Placing the ranks of one node: which GPU(s), domain, NIC(s) and processors each local rank
// gets.  A pure function of the topology analysis and the options.
//
// First way (--map-by slot, node, numa, gpu, domain, without PE=n).
// Order: ranks follow the locality domains (GPUs of one NVLink island / root complex get
// consecutive ranks).  --map-by gpu takes GPUs in index order instead; --map-by numa deals ranks
// round-robin over NUMA nodes.  With more ranks than GPU blocks (GPUs / --gpus-per-rank), GPUs
// are shared: consecutive ranks take the same block (ranks 0,1 on GPU 0, 2,3 on GPU 1, ...),
// except with --map-by numa, which keeps dealing round-robin.
// Binding: default = the cpus nearest the rank's GPU(s) when there are GPUs, none otherwise;
// core = one core per rank among those cpus (its domain's without GPUs), wrapping when there
// are more ranks than cores; numa = its domain's NUMA node; gpu = as default (GPUs required).
// NICs (rail alignment): the NICs nearest the rank's own GPUs by PCIe path (PIX, PXB, PHB, NODE,
// SYS; RDMA before Ethernet); GPU blocks with the same nearest NICs share them out, so that two
// GPUs behind one switch pair with its two NICs one each.  Without GPUs: the domain's NICs.
// Second way, Open MPI's (--map-by core, hwthread, l3cache, socket, ppr:N:OBJECT, or PE=n): each
// rank gets a place among the machine's processor objects first: core, hwthread, l3cache and
// socket deal ranks round-robin over those objects (numa too, with PE=n), ppr:N:OBJECT fills N
// ranks into each object in turn, slot and node fill the machine in order; with PE=n, the k-th
// rank on an object gets its cores k*n to k*n+n-1.  The default binding is the place itself (the
// PE cores, the core, the socket; none for ppr:N:node, or where core or hwthread mapping has
// more ranks than objects, as mpirun); --bind-to narrows a place to one of its cores or
// hwthreads (the next one free; more ranks than those are refused unless :overload-allowed) or
// widens it to the socket, NUMA node or L3 cache around it.  GPUs: the least used GPU block
// near the place (any, when none is near); the domain is the block's, or without GPUs the first
// domain overlapping the place.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "topology/domains.hpp"
#include "topology/placement_choices.hpp"

namespace pe::topo {

// Parse --map-by (MapSpec) and --bind-to (BindSpec) in Open MPI's syntax; throw TopologyError
// naming the option, what was wrong and what may be written.
MapSpec parse_map_spec(const std::string& s);
BindSpec parse_bind_spec(const std::string& s);
// A rankfile's slot=LIST (Open MPI's logical form): items separated by ';', each
// SOCKET:CORES (cores of that socket, counted inside it) or CORES (of the machine); CORES is '*'
// (all) or N and N-M ranges separated by ','; SOCKET is N or '*'.  Hardware threads instead of
// cores with --use-hwthread-cpus.
struct SlotItem {
  int socket = -1;                         // -1: none given (machine-wide), -2: '*'
  std::vector<std::pair<int, int>> cores;  // inclusive ranges; empty: '*'
};
using SlotList = std::vector<SlotItem>;
// Throws TopologyError naming what is wrong in `s`, after `what` and `s` ("slot=1:x: ...").
SlotList parse_slot_list(const std::string& s, const std::string& what = "slot=");
// Its processors one by one, in order, each as a slot list of its own ("1:0-1,3" -> "1:0",
// "1:1", "1:3"); '*' stays whole.
std::vector<std::string> expand_slot_list(const std::string& s);
// mpirun's --cpu-set LIST (a slot list): `t` keeps those processors only.  TopologyError naming a
// socket or core it lacks.
void restrict_to(Topology& t, const std::string& list, bool hwthreads);

// PE=n only with an object wider than a core (what: how the message names the request).
void check_map_spec(const MapSpec& m, const std::string& what);
// "socket", "ppr:2:socket:PE=4": a MapSpec as a user would write it (for messages).
std::string to_string(const MapSpec& m);

// Open MPI's mapping on processor objects: --map-by core, hwthread, l3cache, socket, ppr:N:OBJECT
// or any mapping with PE=n (placed by place_ranks's second way; see the man page).
bool maps_on_processors(MapBy by, int pe);

// How many objects of the kind ppr:N:OBJECT counts this topology has (those with processors;
// node: 1).
int count_objects(const Topology& t, MapBy kind);

struct PlacementOptions {
  int nranks = 1;
  MapBy map_by = MapBy::Default;
  BindTo bind_to = BindTo::Default;
  int gpus_per_rank = 1;
  int ppr = 0;                     // --map-by ppr:N:OBJECT
  MapBy ppr_object = MapBy::Node;
  int pe = 0;                      // --map-by ...:PE=n, --cpus-per-rank n
  bool overload = false;           // --bind-to LEVEL:overload-allowed
  bool hwthread_cpus = false;      // --use-hwthread-cpus: PE=n counts hardware threads
  // --rankfile: each rank's slot=LIST (parse_slot_list), by local rank; the rank's place is
  // those processors, its binding too unless --bind-to none ("": anywhere, unbound).  Empty:
  // no rankfile.
  std::vector<std::string> places{};
  std::string places_from = "--rankfile";  // how errors name them
  // mpirun's --cpu-list LIST (a slot list): every rank bound to LIST, or with `ordered`
  // (--bind-to cpu-list:ordered) local rank k to its k-th processor.  "": none.
  std::string cpu_list{};
  bool cpu_list_ordered = false;
  // --cpu-set (the topology restricted to it): a rank left unbound is bound to the whole set.
  bool confine = false;
};

struct RankPlacement {
  int local_rank = 0;
  std::vector<int> gpus;  // GPU indexes (CUDA/NVML numbering); empty without GPUs
  int domain = 0;
  // NICs: with GPUs, those nearest the rank's own GPUs, shared out among the ranks that find the
  // same ones (rail alignment); without GPUs, its domain's.
  std::vector<std::string> nics;
  std::string nic_path;           // path class from its GPUs to them ("PIX", ...), "" without GPUs
  std::vector<int> os_cpus;       // binding; empty: unbound
  std::string cpuset;             // the same in hwloc list syntax, "" when unbound
  int pu = -1;  // OS index of the first processor of the rank's place (for --rank-by)
};

// Throws TopologyError for impossible requests (gpus-per-rank larger than the GPUs there are,
// --bind-to gpu without GPUs).
std::vector<RankPlacement> place_ranks(const Topology& t, const Analysis& a,
                                       const PlacementOptions& o);

// "GPU 0, domain 0, NIC mlx5_0 (PIX), cpus 0-17,36-53"
std::string describe_placement(const RankPlacement& r);
// One line per rank: "local rank 0: " + describe_placement.
std::string format_placement(const std::vector<RankPlacement>& p);

}  // namespace pe::topo
