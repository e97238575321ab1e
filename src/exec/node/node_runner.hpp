// NodeRunner: one node's part of a job, the same code for a single-node job (inside
// pytorch_exec) and for every pytorch_execd of a multi-node job.  It places the node's ranks
// (NodePlan), hosts the node agent with its PMIx server, and starts each generation: the
// workers' specs and environment, the PMIx namespace, the --report-bindings lines, and what
// depends on the node itself (more ranks than processors: MPI waits yield, PMIx says so).
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/node/node_agent.hpp"
#include "exec/node/node_job.hpp"
#include "exec/node/node_plan.hpp"
#include "exec/node/spawn_plan.hpp"
#include "pmix_rdzv/modex_router.hpp"

namespace pe {

// "pytorch_exec.<job>.<generation>"
std::string namespace_name(const std::string& job_id, int generation);

// What one node's PMIx server registers for a generation.
pmix::NamespaceInfo namespace_for(const JobMap& map, int node, const GenerationInfo& gen);

// True when `local_ranks` is more than this machine's processors.
bool oversubscribed_here(size_t local_ranks);

// The node's workers for generation `gen`: program, arguments, environment (from `base`),
// binding and standard input.
std::vector<WorkerSpec> node_worker_specs(const NodeJob& job, const EnvMap& base,
                                          const NodePlan& plan, const GenerationInfo& gen);

// The --report-bindings lines of one node, one per rank.
std::string binding_report(const JobMap& map, int node, const NodePlan& plan, int generation);

class NodeRunner {
 public:
  // Places the node's ranks.  Throws UsageError for a bad topology file or an impossible request.
  explicit NodeRunner(NodeJob job);
  ~NodeRunner();

  // Starts the node agent and its PMIx server (namespace `server_nspace`).  `env` is what the
  // workers' environments start from.  Throws Error when the PMIx server cannot start.
  void open(EventLoop& loop, AgentListener& listener, pmix::ModexRouter* router,
            const std::string& server_nspace, EnvMap env);
  // Elastic re-forming: from the next generation on, the job's map is `map`, where this node
  // is node `node`; another number of ranks for it (its host listed with other slots) is
  // placed anew.  Throws UsageError when they cannot be placed (--bind-to core on too few).
  void remap(JobMap map, int node);
  // Starts every worker of the node for `gen`.  Throws Error when they cannot all be started
  // (those that were are reported as usual).
  void start(GenerationInfo gen);

  // A node that runs none of `gen`'s ranks (a node for spawned processes only), whose map is
  // `map`: its PMIx server knows the generation's namespace, and processes spawned here belong
  // to `gen`.  Throws Error.
  void start_idle(GenerationInfo gen, const JobMap& map);

  // MPI_Comm_spawn.  A single-node job places and starts the processes here (the default once
  // open); a daemon of a multi-node job passes `forward`, which carries the request to the front
  // end, after the programs are resolved here (resolve_spawn).
  void spawn_via(std::function<void(pmix::SpawnRequest, pmix::SpawnDone)> forward);
  // The programs of a request as this node finds them (its PATH, the job's directory).  Throws
  // SpawnError.
  void resolve_spawn(pmix::SpawnRequest& req) const;
  // Starts this node's processes of a spawned job of the running generation; every node of the
  // generation registers its namespace.  Throws Error, or SpawnError when a program is not
  // there (before any process starts).
  void start_spawned(const SpawnJob& sj);

  const NodeJob& job() const { return job_; }
  const NodePlan& plan() const { return plan_; }
  NodeAgent* agent() { return agent_.get(); }
  const NodeAgent* agent() const { return agent_.get(); }
  size_t live() const { return agent_ ? agent_->live() : 0; }

 private:
  void spawn_here(pmix::SpawnRequest req, pmix::SpawnDone done);

  NodeJob job_;
  EnvMap env_;
  GenerationInfo gen_;  // the running generation
  int spawned_ = 0;     // its spawned jobs
  NodePlan plan_;       // before agent_: the agent borrows its topology
  std::unique_ptr<NodeAgent> agent_;
};

}  // namespace pe
