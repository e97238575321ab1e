#include "exec/job_map.hpp"

namespace pe {

JobMap map_single_node(const std::string& host, int np) {
  JobMap m;
  m.world_size = np;
  NodeMap node;
  node.host = host;
  for (int r = 0; r < np; ++r) {
    node.ranks.push_back(r);
    m.ranks.push_back(RankLocation{0, r});
  }
  m.nodes.push_back(std::move(node));
  return m;
}

}  // namespace pe
