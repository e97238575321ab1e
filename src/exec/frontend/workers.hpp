// The workers of a job as the job controller sees them.  LocalWorkers runs them on this machine
// through a node agent inside pytorch_exec; RemoteWorkers (remote_workers.hpp) runs them on the
// nodes of an allocation through one pytorch_execd per node.  Both report to an AgentListener.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/event_loop.hpp"
#include "common/torch_store.hpp"
#include "common/unique_fd.hpp"
#include "exec/ctrl/messages.hpp"
#include "exec/frontend/job_map.hpp"
#include "exec/frontend/launch_config.hpp"
#include "exec/node/node_agent.hpp"
#include "exec/node/node_runner.hpp"
#include "exec/node/worker_env.hpp"
#include "pmix_rdzv/modex_router.hpp"

namespace pe {

class WorkerSet {
 public:
  virtual ~WorkerSet() = default;
  // Gets ready to start generations (starts daemons, waits for them); calls ready() once that
  // is done.  Trouble is reported to the listener (on_node_lost).  An elastic job's may call it
  // with some of the first nodes still starting (node_ready() says which are not): they are
  // reported through WorkerSetContext::node_ready later, as arrivals are.
  virtual void prepare(std::function<void()> ready) = 0;
  // Whether the daemon of node `slot` is ready (after prepare()'s ready()).
  virtual bool node_ready(int /*slot*/) const { return true; }
  // MASTER_ADDR and a MASTER_PORT on rank 0's host, for the next generation.
  virtual std::string master_addr() = 0;
  virtual int master_port() = 0;
  // Whether pytorch_exec serves torch's TCPStore on MASTER_PORT (torch_store.hpp), as
  // torchrun's agent does: the workers are told so (TORCHELASTIC_USE_AGENT_STORE).
  virtual bool hosts_store() const { return false; }
  // Elastic re-forming: the next generations run on `map`, a part of the job's nodes in their
  // order (reform_map).  Before master_addr() and start().
  virtual void use_map(const JobMap& map) = 0;
  // Elastic arrivals: node `slot` of the job's map (a new one, or a lost node's place) is to be
  // started; its readiness is reported through WorkerSetContext::node_ready, its loss as any
  // other.  Throws Error when this set cannot take nodes.
  virtual void add_node(int slot);
  // Elastic departures: node `slot` leaves the job (its host no longer listed): its connection
  // is closed (its daemon stops its workers and exits) and it is reported lost with `why`.
  virtual void remove_node(int slot, const std::string& why);
  // Starts every worker of a generation.  Throws Error when they cannot be started.
  virtual void start(const GenerationInfo& gen) = 0;
  // The front end's loop is held up (its terminal does not take output): daemons must keep
  // hearing from it.
  virtual void keep_alive() {}
  virtual void signal_all(int sig) = 0;
  // A rank of `generation` (of its spawned job `spawn`, when not 0) failed: every node tells its
  // processes, spawned ones too, through a PMIx event (NodeAgent::notify_failure).
  virtual void notify_failure(int generation, int spawn, int rank, int exit_code,
                              bool aborted) = 0;
  virtual size_t live() const = 0;
  virtual void stdin_write(int rank, std::string_view data) = 0;
  virtual void stdin_close_all() = 0;
  virtual size_t stdin_backlog() const = 0;
  // The host of a node, for messages.
  virtual std::string host_of_rank(int rank) const = 0;
  // --display-map
  virtual std::string format_map() const = 0;
  // The job is over with pytorch_exec's exit `status`: nodes that joined by themselves (join
  // mode) are told, so that they exit with it.  Before the set is destroyed.
  virtual void end_job(int /*status*/) {}
  // Whether the set reports through WorkerSetContext::running that every worker of a started
  // generation runs; otherwise they do when start() returns.
  virtual bool reports_running() const { return false; }
};

// What a job controller gives the maker of its WorkerSet.
struct WorkerSetContext {
  EventLoop& loop;
  AgentListener& listener;  // the controller
  const LaunchConfig& cfg;
  const EnvMap& env;
  const JobMap& map;
  const std::string& job_id;
  StdinHow stdin_how;
  // A node added while the job runs (add_node) is ready.
  std::function<void(const std::string& host)> node_ready;
  // Join mode: a node that started by itself (pytorch_exec --rdzv-endpoint) asks to join with
  // `slots` ranks (`node_rank`: its fixed place, or -1).  An empty verdict admits it, and
  // add_node() of its slot follows before the call returns; else it is refused with the reason.
  std::function<ctrl::Verdict(const std::string& host, int slots, int node_rank)> join;
  // Every worker of `generation` was started (every node of it said so), when
  // reports_running().
  std::function<void(int generation)> running;
};

// How a job controller gets its workers: `local` (everything on this machine: standard input
// can be handed over directly) and the maker.  Unit tests pass a fake.
struct WorkerSetSource {
  bool local = true;
  std::function<std::unique_ptr<WorkerSet>(const WorkerSetContext&)> make;
};

// A map of one node, this machine, runs in-process (LocalWorkers) unless the job is to `grow`
// or its host list has other hosts (for MPI_Comm_spawn); any other through pytorch_execd daemons
// (RemoteWorkers).
// Join mode: `endpoint`, when valid, is the socket that already listens on the rendezvous port
// (so that no other pytorch_exec on this machine can take it meanwhile).
WorkerSetSource workers_for(const JobMap& map, const std::string& host, bool grow = false,
                            UniqueFd endpoint = {});

// The workers on this machine, through a node agent with a PMIx server (single-node jobs).
class LocalWorkers : public WorkerSet {
 public:
  LocalWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg, const EnvMap& env,
               const JobMap& map, const std::string& job_id, StdinHow stdin_how);
  ~LocalWorkers() override;

  void prepare(std::function<void()> ready) override { ready(); }
  std::string master_addr() override { return "127.0.0.1"; }
  // A store of its own for each generation, bound before its port is given out.
  int master_port() override;
  bool hosts_store() const override { return true; }
  void use_map(const JobMap&) override {}  // one node: nothing to re-form
  void start(const GenerationInfo& gen) override;
  void signal_all(int sig) override { agent().signal_all(sig); }
  void notify_failure(int generation, int spawn, int rank, int exit_code, bool aborted) override {
    agent().notify_failure(generation, spawn, rank, exit_code, aborted);
  }
  size_t live() const override { return runner_.live(); }
  void stdin_write(int rank, std::string_view data) override { agent().stdin_write(rank, data); }
  void stdin_close_all() override { agent().stdin_close_all(); }
  size_t stdin_backlog() const override;
  std::string host_of_rank(int rank) const override;
  std::string format_map() const override;

  NodeAgent& agent() { return *runner_.agent(); }
  const NodePlan& plan() const { return runner_.plan(); }

 private:
  EventLoop& loop_;
  const LaunchConfig& cfg_;
  std::unique_ptr<TorchStore> store_;
  pmix::LocalModexRouter modex_;
  NodeRunner runner_;
};

}  // namespace pe
