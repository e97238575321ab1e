// The workers of a multi-node job: one pytorch_execd per node (started by DaemonLauncher),
// connected back over the authenticated control plane (ctrl/), in a tree (TreeRoot).  This class
// is the front end's end of it: it sends each daemon its NodeJob, starts generations, forwards
// signals and stdin, relays PMIx traffic between nodes (ModexRelay), and reports the daemons'
// output, exits and aborts to the job controller.  A daemon that cannot be started, or whose
// connection closes or times out, is reported as a lost node.  A stranger's connection that
// fails the handshake, or any malformed, oversized or out-of-order frame, is dropped and logged;
// the job goes on.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/ctrl/connection.hpp"
#include "exec/ctrl/heartbeat.hpp"
#include "exec/frontend/daemon_launcher.hpp"
#include "exec/frontend/modex_relay.hpp"
#include "exec/frontend/spawn_relay.hpp"
#include "exec/frontend/workers.hpp"

namespace pe {

class RemoteWorkers : public WorkerSet {
 public:
  using JoinFn = decltype(WorkerSetContext::join);
  // Join mode (cfg.join_mode()): the control plane listens on cfg.rdzv_port with cfg.rdzv_key,
  // only the first nodes' daemons (this host's) are started, and other nodes join by
  // themselves through `join`.
  RemoteWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg,
                const EnvMap& env, const JobMap& map, const std::string& job_id,
                const std::string& host, bool stdin_forwarded,
                std::function<void(const std::string&)> node_ready = {}, JoinFn join = {},
                std::function<void(int)> running = {}, UniqueFd endpoint = {});
  // Closes every connection (the daemons then kill what is left and exit); the launchers are
  // waited for, then killed.
  ~RemoteWorkers() override;

  void prepare(std::function<void()> ready) override;
  std::string master_addr() override;
  int master_port() override;
  bool hosts_store() const override { return true; }  // the daemon of rank 0's node
  void use_map(const JobMap& map) override;
  void add_node(int slot) override;
  void remove_node(int slot, const std::string& why) override;
  void start(const GenerationInfo& gen) override;
  void keep_alive() override { beats_.beat(); }
  void signal_all(int sig) override;
  void notify_failure(int generation, int spawn, int rank, int exit_code, bool aborted) override;
  size_t live() const override;
  void stdin_write(int rank, std::string_view data) override;
  void stdin_close_all() override;
  size_t stdin_backlog() const override;
  std::string host_of_rank(int rank) const override;
  std::string format_map() const override;
  void end_job(int status) override;
  bool reports_running() const override { return true; }
  bool node_ready(int slot) const override { return nodes_.at(static_cast<size_t>(slot)).ready; }

  std::vector<std::string> launch_command(int node) const { return launcher_.launch_command(node); }

 private:
  struct Node {
    std::string host;
    std::string seen;                  // its address as we see it (children of the front end)
    ctrl::ConnLink* direct = nullptr;  // its connection, when it is a child of the front end
    std::vector<std::string> addrs;    // its own addresses
    bool job_sent = false;
    bool ready = false;
    size_t live = 0;
    size_t stdin_inflight = 0;
    int port = 0;         // of the store its daemon hosts for the next MASTER_PORT
    int incarnation = 0;  // how often its place was taken (a launcher's exit is its own only)
    bool spawn_only = false;  // runs no ranks: started for MPI_Comm_spawn's processes
    Event deadline;       // a node added while the job runs has this long to be ready
    std::string leaving;  // why it said it leaves (Leave), before its connection closes
  };
  ctrl::Verdict check_node(const ctrl::Hello& h);
  void on_authenticated(int node, std::unique_ptr<ctrl::Connection> conn);
  void on_ready(int node, ctrl::Ready& m);
  void on_port(int node, ctrl::Port& m);
  void on_joined(int node);
  void on_exit(int node, ctrl::Exit& m);
  int spawn_node(const std::string& host) const;
  void on_start_failed(int node, ctrl::StartFailed& m);
  void on_stdin_drained(int node);
  void node_lost(int node, std::string why);
  void lose_silent(int node, const std::string& why);
  std::string not_reported() const;
  void check_ready();
  void prepared();
  int valid_rank(int rank) const;
  Node& node_of_rank(int rank);
  EnvMap carried_environment() const;

  EventLoop& loop_;
  AgentListener& listener_;
  const LaunchConfig& cfg_;
  const EnvMap& env_;
  const JobMap& map_;
  std::string job_id_;
  std::string secret_;
  bool slurm_ = false;
  bool stdin_forwarded_ = false;
  std::vector<Node> nodes_;             // every node of the job (map_), lost ones too
  std::map<std::string, int> by_host_;  // index into nodes_ by host name
  std::string own_host_;  // join mode: the rendezvous host's machine (its first node)
  // The current generation: its map (a part of map_ when an elastic job lost nodes), the node
  // (index into nodes_) of each of its nodes and of each of its ranks, and whether the daemons
  // still need to be told.
  JobMap gen_;
  GenerationInfo gen_info_;  // the generation started last
  bool started_ = false;
  std::vector<int> members_, owner_;
  bool remap_ = false;
  ctrl::TreeRoot tree_;
  ctrl::Heartbeats beats_;  // with the front end's children in the tree, by node
  ModexRelay modex_;
  SpawnRelay spawn_;
  ctrl::Dispatcher<int> dispatch_;  // frames by the node they came from
  DaemonLauncher launcher_;
  UniqueFd endpoint_;  // join mode: the socket that claimed cfg.rdzv_port (see workers_for)
  std::unique_ptr<ctrl::Acceptor> acceptor_;
  std::vector<std::string> addresses_;  // where daemons can reach us
  Event ready_timer_;  // the first nodes' daemons have this long to be ready
  Event quorum_timer_;  // an elastic job: MIN of them are ready, the last call for the others
  std::function<void()> ready_;
  std::function<void(const std::string&)> node_ready_;
  JoinFn join_;  // join mode only
  std::function<void(int)> running_;
  std::vector<int> unstarted_;  // nodes of the generation started last that have not said so
  double daemon_timeout_ = 60;
  int first_nodes_ = 0;  // nodes_ at prepare(): the first nodes (ready_timer_'s)
  bool prepared_ = false;
};

}  // namespace pe
