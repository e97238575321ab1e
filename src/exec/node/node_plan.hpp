// The topology side of a launch on one node: load the machine (or, for a dry run, an XML file),
// analyse it, and place the node's ranks according to --map-by, --rank-by, --bind-to and
// --gpus-per-rank.  Used in-process on one machine, and by each node's agent later.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "exec/frontend/job_map.hpp"
#include "exec/frontend/launch_config.hpp"
#include "exec/node/node_job.hpp"
#include "exec/node/worker_env.hpp"
#include "topology/placement.hpp"

namespace pe {

PlacementRequest placement_of(const LaunchConfig& cfg);
// The same for node `node` of `map`, with its ranks' --rankfile places.
PlacementRequest placement_for(const LaunchConfig& cfg, const JobMap& map, int node);

struct NodePlan {
  std::unique_ptr<topo::Topology> topology;
  topo::Analysis analysis;
  std::vector<topo::RankPlacement> ranks;  // by local rank
};

// Throws UsageError for a bad topology file or an impossible request (one sentence).
NodePlan plan_node(const PlacementRequest& req, int nlocal);
// Places `nlocal` ranks on the plan's topology anew (the node's rank count changed).  Throws
// UsageError for an impossible request.
void place_again(NodePlan& p, const PlacementRequest& req, int nlocal);

// Stable renumbering of placed ranks for --rank-by (slot/node: placement order; core, hwthread,
// l3cache, socket: by the object around each rank's place).
void apply_rank_by(topo::RankBy rank_by, const topo::Topology& t,
                   std::vector<topo::RankPlacement>& ranks);

RankLocality locality_of(const topo::RankPlacement& p);

// The --display-map / --dry-run printout; plans[i] (may be null: placement unknown there) is
// node i's.
std::string format_job_map(const JobMap& map, const std::vector<const NodePlan*>& plans);
// Its last part: the GPU levels the job would build (topo::plan_gpu_levels); "" when a node's
// placement is unknown or no node has GPUs.
std::string format_gpu_levels(const JobMap& map, const std::vector<const NodePlan*>& plans);

}  // namespace pe
