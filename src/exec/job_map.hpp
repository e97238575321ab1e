// Where every rank runs: ranks -> nodes -> local ranks.  Pure data and pure functions, so the
// mapper is tested without processes.  Ranks are contiguous per node.
#pragma once

#include <string>
#include <vector>

namespace pe {

struct NodeMap {
  std::string host;
  int node_rank = 0;          // GROUP_RANK
  std::vector<int> ranks;     // global ranks on this node, in local-rank order
};

struct RankLocation {
  int node = 0;               // index into JobMap::nodes
  int local_rank = 0;
};

struct JobMap {
  int world_size = 0;
  std::vector<NodeMap> nodes;
  std::vector<RankLocation> ranks;  // indexed by global rank
};

// All `np` ranks on one host.
JobMap map_single_node(const std::string& host, int np);

}  // namespace pe
