// Where every rank runs: ranks -> nodes -> local ranks.  Pure data and pure functions, so the
// mapper is tested without processes.  Ranks are contiguous per node.
#pragma once

#include <string>
#include <vector>

namespace pe {

struct NodeMap {
  std::string host;
  int node_rank = 0;       // GROUP_RANK
  std::vector<int> ranks;  // global ranks on this node, in local-rank order
  int slots = 0;  // the allocation's slots there (0: no limit); MPI_Comm_spawn keeps to them
};

struct RankLocation {
  int node = 0;  // index into JobMap::nodes
  int local_rank = 0;
};

struct JobMap {
  int world_size = 0;
  std::vector<NodeMap> nodes;
  std::vector<RankLocation> ranks;  // indexed by global rank
  bool slurm = false;               // the nodes are a SLURM allocation's (daemons are started
                                    // with srun); front end only, not sent to daemons
  // The allocation's hosts that run none of the ranks, with their slots (ranks empty): where
  // MPI_Comm_spawn's "host"/"add-host" may ask for processes (a daemon is started there on
  // demand).  Front end only, not sent to daemons.
  std::vector<NodeMap> spawn_hosts;
};

// All `np` ranks on one host (this machine: more than its kernel.pid_max is a UsageError).
JobMap map_single_node(const std::string& host, int np);

// The most processes Linux runs on one machine: kernel.pid_max here (`here`), else its largest
// value (PID_MAX_LIMIT, 4194304).
long max_processes(bool here = true);

// Elastic re-forming: the map of the nodes that are left (alive[i] for base.nodes[i]), in their
// order.  Each keeps its number of ranks; ranks and node ranks are numbered again from 0.
JobMap reform_map(const JobMap& base, const std::vector<bool>& alive);
// The same for the nodes base.nodes[i] of `nodes`, in that order.
JobMap reform_map(const JobMap& base, const std::vector<int>& nodes);
// Elastic arrivals: node `slot` of `map` (a new one when it is map.nodes.size()) is now `host`
// with `nranks` ranks; every rank is numbered again, node by node.
void set_node(JobMap& map, size_t slot, const std::string& host, int nranks);

struct Allocation;

struct MapRequest {
  int np = 0;            // 0: one rank per slot (or npernode per node)
  bool by_node = false;  // --map-by node: round-robin over nodes; else fill each node in turn
  int npernode = 0;      // -N: ranks per node (0: as slots allow)
  std::string npernode_option;  // how npernode was given, for messages ("": "-N N")
  bool oversubscribe = false;
};

// Ranks onto the allocation's nodes; only nodes that get ranks are in the map.  Throws
// UsageError when the request does not fit (naming the counts and --oversubscribe).
JobMap map_job(const Allocation& alloc, const MapRequest& req);
// An Open MPI rankfile's map (`name` in errors): each line's rank on its host, which must be one
// of the allocation's (+nK: its K-th node); without a host list (this machine alone) the
// rankfile's hosts are the nodes.  A node's local ranks in rank order.  No slot limits.
struct RankfileLine;
// Without -H, --hostfile or an allocation (this machine alone): the rankfile's hosts, this
// machine under any of its names being one; else `alloc` as it is.
Allocation rankfile_allocation(Allocation alloc, const std::vector<RankfileLine>& lines,
                               const std::string& name, const std::string& hostname);
JobMap map_rankfile(Allocation alloc, const std::vector<RankfileLine>& lines,
                    const std::string& name, const std::string& hostname);
// The hosts of `alloc` that `map` gives no ranks, in order, with their slots (JobMap::spawn_hosts).
std::vector<NodeMap> hosts_without_ranks(const Allocation& alloc, const JobMap& map);

}  // namespace pe
