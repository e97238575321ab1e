// PMIx traffic between the nodes of a multi-node job, as the front end relays it: a fence is
// complete when every node has contributed (the data of all goes back to every node, both ways
// in pieces of ctrl::kFencePiece, up to ctrl::kMaxFenceBytes in all), and a
// direct-modex request goes to the node of the rank it asks about, its answer back to the asker.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exec/ctrl/messages.hpp"
#include "exec/ctrl/tree.hpp"
#include "exec/frontend/job_map.hpp"

namespace pe {

class ModexRelay {
 public:
  explicit ModexRelay(ctrl::TreeRoot& tree) : tree_(tree) {}
  void on_fence(int node, ctrl::Fence& m);
  void on_request(int node, ctrl::DmodexReq& m);
  void on_response(ctrl::DmodexResp& m);
  // A new generation on the nodes `members` (tree indices), whose ranks live on
  // owner[rank]: what was in flight is void, its spawned namespaces are forgotten.
  void reset(std::vector<int> members, std::vector<int> owner);
  // A spawned job's namespace (MPI_Comm_spawn) whose ranks live on owner[rank].
  void add_namespace(const std::string& nspace, std::vector<int> owner);

 private:
  struct FenceState {
    std::vector<int> nodes;  // its participants' nodes (tree indices), ascending
    std::vector<bool> arrived;
    int count = 0;
    std::vector<std::string> data;  // per node
    size_t bytes = 0;               // of all nodes' pieces so far
  };
  void finish_fence(const std::string& nspace, uint32_t seq, FenceState& st);
  // The nodes of a fence's participants (pmix::participants_key).  Throws wire::WireError.
  std::vector<int> nodes_of(const std::string& key) const;
  const std::vector<int>& owners(const std::string& nspace) const;
  void send_done(const FenceState& st, ctrl::FenceDone m);
  struct Route {
    int from_node;
    uint64_t from_id;
  };
  ctrl::TreeRoot& tree_;
  std::vector<int> members_;                         // the generation's nodes
  std::vector<int> owner_;                           // node of each rank
  std::map<std::string, std::vector<int>> spawned_;  // the same for spawned namespaces
  std::map<std::pair<std::string, uint32_t>, FenceState> fences_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Route> requests_;
};

}  // namespace pe
