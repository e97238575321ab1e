// The workers of a job as the job controller sees them.  LocalWorkers runs them on this machine
// through a node agent inside pytorch_exec; RemoteWorkers (remote_workers.hpp) runs them on the
// nodes of an allocation through one pytorch_execd per node.  Both report to an AgentListener.
//
// Also the per-node pieces both need: the specs of one node's workers and its PMIx namespace.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/job_map.hpp"
#include "exec/launch_config.hpp"
#include "exec/node_agent.hpp"
#include "exec/node_plan.hpp"
#include "exec/worker_env.hpp"
#include "pmix_rdzv/modex_router.hpp"

namespace pe {

// How the workers' standard input is provided.
enum class StdinHow { DevNull, Forward, Direct };

class WorkerSet {
 public:
  virtual ~WorkerSet() = default;
  // Gets ready to start generations (starts daemons, waits for them); calls ready() once that
  // is done.  Trouble is reported to the listener (on_node_lost).
  virtual void prepare(std::function<void()> ready) = 0;
  // MASTER_ADDR and a MASTER_PORT free on rank 0's host, for the next generation.
  virtual std::string master_addr() = 0;
  virtual int master_port() = 0;
  // Starts every worker of a generation.  Throws Error when they cannot be started.
  virtual void start(const GenerationInfo& gen) = 0;
  virtual void signal_all(int sig) = 0;
  virtual size_t live() const = 0;
  virtual void stdin_write(int rank, std::string_view data) = 0;
  virtual void stdin_close_all() = 0;
  virtual size_t stdin_backlog() const = 0;
  // The host of a node, for messages.
  virtual std::string host_of_rank(int rank) const = 0;
  // --display-map
  virtual std::string format_map() const = 0;
};

// "pytorch_exec.<job>.<generation>"
std::string namespace_name(const std::string& job_id, int generation);

// What one node's PMIx server registers for a generation.
pmix::NamespaceInfo namespace_for(const JobMap& map, int node, const GenerationInfo& gen);

// The workers of node `node` for generation `gen`: program, arguments, environment, binding and
// standard input.
std::vector<WorkerSpec> node_worker_specs(const LaunchConfig& cfg, const EnvMap& env,
                                          const JobMap& map, int node, const NodePlan& plan,
                                          const GenerationInfo& gen, StdinHow stdin_how);

// The --report-bindings lines of one node, one per rank.
std::string binding_report(const JobMap& map, int node, const NodePlan& plan, int generation);

// True when more ranks run on this machine than it has processors.
bool oversubscribed_here(size_t local_ranks);

// The workers on this machine, through a node agent with a PMIx server (single-node jobs).
class LocalWorkers : public WorkerSet {
 public:
  LocalWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg, const EnvMap& env,
               const JobMap& map, const std::string& job_id, StdinHow stdin_how);
  ~LocalWorkers() override;

  void prepare(std::function<void()> ready) override { ready(); }
  std::string master_addr() override { return "127.0.0.1"; }
  int master_port() override;
  void start(const GenerationInfo& gen) override;
  void signal_all(int sig) override { agent_->signal_all(sig); }
  size_t live() const override { return agent_->live(); }
  void stdin_write(int rank, std::string_view data) override { agent_->stdin_write(rank, data); }
  void stdin_close_all() override { agent_->stdin_close_all(); }
  size_t stdin_backlog() const override { return agent_->stdin_backlog(); }
  std::string host_of_rank(int rank) const override;
  std::string format_map() const override;

  const NodePlan& plan() const { return plan_; }

 private:
  const LaunchConfig& cfg_;
  const EnvMap& env_;
  const JobMap& map_;
  StdinHow stdin_how_;
  pmix::LocalModexRouter modex_;
  NodePlan plan_;                    // before agent_: the agent borrows its topology
  std::unique_ptr<NodeAgent> agent_;
};

}  // namespace pe
