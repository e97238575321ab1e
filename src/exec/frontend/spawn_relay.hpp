// MPI_Comm_spawn and PMIx_Publish/PMIx_Lookup across the nodes of a multi-node job, as the
// front end handles them: a node's spawn request is placed on the generation's nodes
// (plan_spawn, within the slots the processes already there leave), every node is told to
// register the new namespace and start its part (SpawnStart), and once all have answered the
// asking node gets the namespace or the reason, which is also printed in one line.  Published
// values are kept here, where every node can look them up.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "exec/ctrl/messages.hpp"
#include "exec/ctrl/tree.hpp"
#include "exec/frontend/modex_relay.hpp"

namespace pe {

class SpawnRelay {
 public:
  // live(node): the processes running on tree node `node`; add_live(node, n) counts n more
  // (or fewer) there; host(node): its name.
  struct Hooks {
    std::function<size_t(int node)> live;
    std::function<void(int node, long n)> add_live;
    std::function<std::string(int node)> host;
  };
  SpawnRelay(ctrl::TreeRoot& tree, ModexRelay& modex, bool oversubscribe, Hooks hooks);

  // A new generation `gen` on `map`, whose node g is tree node members[g]: earlier spawns and
  // published values are void.
  void reset(const GenerationInfo& gen, const JobMap& map, std::vector<int> members);
  void on_request(int node, ctrl::SpawnReq& m);
  void on_started(int node, ctrl::SpawnStarted& m);
  void on_publish(ctrl::Publish& m);
  void on_lookup(int node, ctrl::Lookup& m);
  void on_unpublish(ctrl::Unpublish& m);

 private:
  struct Pending {
    int from_node = 0;
    uint64_t id = 0;
    int parent_rank = 0;
    std::vector<int> waiting;     // tree nodes that have not answered
    std::map<int, long> planned;  // processes per tree node
    std::string error;
  };
  void refuse(int node, uint64_t id, int parent_rank, const std::string& why);

  ctrl::TreeRoot& tree_;
  ModexRelay& modex_;
  bool oversubscribe_;
  Hooks hooks_;
  GenerationInfo gen_;
  JobMap map_;
  std::vector<int> members_;
  int spawned_ = 0;
  std::map<std::string, Pending> pending_;  // by namespace
  std::map<std::string, std::string> published_;
};

}  // namespace pe
