// MPI_Comm_spawn and PMIx_Publish/PMIx_Lookup across the nodes of a multi-node job, as the
// front end handles them: a node's spawn request is placed on the generation's nodes
// (plan_spawn, within the slots the processes already there leave) or on hosts of the job's list
// that run no ranks (whose daemons are started first, for spawned processes only), every node is
// told to register the new namespace and start its part (SpawnStart), and once all have answered
// the asking node gets the namespace or the reason, which is also printed in one line.  When a
// node could not start its part (or was lost meanwhile), what started elsewhere is stopped at
// once (SpawnStop) and the spawn fails.  Published values are kept here, where every node can
// look them up.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "exec/ctrl/messages.hpp"
#include "exec/ctrl/tree.hpp"
#include "exec/frontend/modex_relay.hpp"

namespace pe {

class SpawnRelay {
 public:
  // live(node): the processes running on tree node `node`; add_live(node, n) counts n more
  // (or fewer) there; host(node): its name.  node_of(host): the tree node of a host of the
  // job's list that runs no ranks, once its daemon is ready, else -1; start_host(host): have a
  // daemon started there for spawned processes ("" or why not; on_node_ready or on_node_lost
  // follows).
  struct Hooks {
    std::function<size_t(int node)> live;
    std::function<void(int node, long n)> add_live;
    std::function<std::string(int node)> host;
    std::function<int(const std::string& host)> node_of;
    std::function<std::string(const std::string& host)> start_host;
  };
  SpawnRelay(ctrl::TreeRoot& tree, ModexRelay& modex, bool oversubscribe, Hooks hooks);

  // A new generation `gen` on `map`, whose node g is tree node members[g]: earlier spawns and
  // published values are void.
  void reset(const GenerationInfo& gen, const JobMap& map, std::vector<int> members);
  void on_request(int node, ctrl::SpawnReq& m);
  void on_started(int node, ctrl::SpawnStarted& m);
  // A daemon started for spawned processes is ready: the spawns waiting for it go on.
  void on_node_ready(const std::string& host);
  // A node is lost (or its daemon never came up): the spawns that wait for it fail.
  void on_node_lost(int node, const std::string& why);
  // Whether spawned job `spawn` of `generation` was stopped (it could not start everywhere):
  // the exits of its processes are no failure.
  bool stopped(int generation, int spawn) const;
  void on_publish(ctrl::Publish& m);
  void on_lookup(int node, ctrl::Lookup& m);
  void on_unpublish(ctrl::Unpublish& m);

 private:
  struct Pending {
    int from_node = 0;
    uint64_t id = 0;
    int parent_rank = 0;
    SpawnJob job;
    std::vector<std::string> starting;  // hosts whose daemons are being started for it
    std::vector<int> waiting;           // tree nodes that have not answered
    std::map<int, long> planned;        // processes per tree node
    std::string error;
  };
  using PendingIt = std::map<std::string, Pending>::iterator;
  void refuse(int node, uint64_t id, int parent_rank, const std::string& why);
  std::vector<int> used() const;
  int tree_node(const std::string& host) const;
  void launch(PendingIt it);
  void answered(PendingIt it, int node, const std::string& error);
  void finish(PendingIt it);

  ctrl::TreeRoot& tree_;
  ModexRelay& modex_;
  bool oversubscribe_;
  Hooks hooks_;
  GenerationInfo gen_;
  JobMap map_;
  std::vector<int> members_;
  int spawned_ = 0;
  std::map<std::string, Pending> pending_;  // by namespace
  std::set<int> stopped_;                   // spawned jobs of the generation that were stopped
  std::map<std::string, std::string> published_;
};

}  // namespace pe
