// pytorch_execd: the node daemon of a multi-node job.  It connects to the front end,
// authenticates with the job's secret, receives the job description, and then runs its node's
// workers through a NodeAgent with a PMIx server: it starts generations, signals, feeds stdin,
// and reports output, exits and aborts.  PMIx fences and direct-modex requests of its clients
// travel over the same connection.  When the connection closes, for whatever reason, it kills its
// workers and exits: nothing is left on the node.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "common/torch_store.hpp"
#include "exec/ctrl/connection.hpp"
#include "exec/ctrl/heartbeat.hpp"
#include "exec/frontend/stdio.hpp"
#include "exec/node/node_agent.hpp"
#include "exec/node/node_runner.hpp"
#include "pmix_rdzv/modex_router.hpp"

namespace pe {

struct DaemonOptions {
  std::vector<std::pair<std::string, int>> connect;  // front-end addresses, tried at once
  std::string node;                                  // this node's name in the job map
  std::string secret;                                // raw bytes
  double connect_timeout = 60.0;  // to reach the front end, and for the handshake
  ctrl::HeartbeatSettings heartbeat;  // with the parent and the children in the tree
  // Join mode: this daemon is a pytorch_exec that joins by itself (--rdzv-endpoint) rather
  // than one the front end started.  It retries until `timeout` (the host may start later),
  // brings `slots` ranks, prints its own workers' output, leaves the job on SIGINT/SIGTERM, and
  // exits with the job's status (JobEnd), or 1 with a line when it loses the host.
  struct Join {
    int slots = 0;  // > 0: join mode
    int node_rank = -1;
    double timeout = 600;
    std::string endpoint;  // HOST:PORT, for messages
    OutputOptions output;  // this node's --tag-output, --timestamp-output, --output-filename
    double kill_grace = 5;  // leaving: seconds the workers get after the signal (--kill-grace)
    double time_limit = 0;    // --timeout: joining ends there (exit 124); 0: none
    std::string time_limit_from;  // "--timeout" or "MPIEXEC_TIMEOUT"
    bool stdout_tty = false;  // this node's terminal shows its ranks' stdout (NodeJob's)
    int tty_rows = 0, tty_cols = 0;
  } join;
};

class Daemon : public AgentListener, public pmix::ModexRouter {
 public:
  explicit Daemon(DaemonOptions opts);
  ~Daemon() override;
  // Runs until the front end goes away; returns the daemon's exit status.
  int run();

 private:
  void handshake(const std::vector<std::pair<std::string, int>>& targets);
  void on_frame(wire::Frame& f);
  void on_redirect(ctrl::Redirect& m);
  void start_relay();
  void on_child(int node, std::unique_ptr<ctrl::Connection> conn);
  void on_job(ctrl::Job& m);
  void on_start(ctrl::Start& m);
  void on_stdin(ctrl::Stdin& m);
  void on_remap(ctrl::Remap& m);
  void on_dmodex_request(ctrl::DmodexReq& m);
  void on_fence_done(ctrl::FenceDone& m);
  template <class M>
  void on_reply(std::map<M, pmix::ModexDone>& waiting, const M& key, int status, std::string data,
                const char* what);
  void on_closed(const std::string& why);
  void join_handshake();
  void on_leave(int sig);
  void start_heartbeats();
  void on_silent(int id);
  double upstream_timeout() const;
  // A store (torch_store.hpp) on a port outside the ephemeral range, for the next generation's
  // MASTER_PORT should rank 0 run here; its port is what Ready and Port report.
  int next_store_port();
  // AgentListener
  void on_output(int generation, int rank, Stream s, std::string_view lines) override;
  void on_spawned_output(int generation, int spawn, int rank, Stream s,
                         std::string_view lines) override;
  void send_output(ctrl::Output m, std::string_view lines);
  void check_upstream();
  void hold_output(bool held);
  void on_spawn_start(ctrl::SpawnStart& m);
  void send_spawn(pmix::SpawnRequest req, pmix::SpawnDone done);
  void answer_spawn(uint64_t id, const std::string& error, const std::string& nspace);
  void on_exit(const WorkerExit& e) override;
  void on_stdin_drained() override;
  void on_abort(int generation, int rank, pid_t pid, int status, const std::string& msg) override;
  // ModexRouter
  void fence(const std::string& nspace, bool collect, std::string data,
             pmix::ModexDone done) override;
  void direct_modex(const std::string& nspace, int rank, pmix::ModexDone done) override;
  void publish(pmix::Published kv) override;
  void lookup(std::vector<std::string> keys, pmix::LookupDone done) override;
  void unpublish(std::vector<std::string> keys) override;

  DaemonOptions opts_;
  EventLoop loop_;
  std::unique_ptr<ctrl::Connection> conn_;  // to the front end or, in a tree, to our parent
  int conn_epoch_ = 0;                      // which connection a posted close notice is about
  bool redirected_ = false;
  ctrl::Dispatcher<> before_job_, dispatch_;
  // Relaying for our children in the control-plane tree.
  std::unique_ptr<ctrl::TreeRelay> relay_;
  std::unique_ptr<ctrl::Acceptor> acceptor_;
  std::vector<Event> signal_events_;
  std::unique_ptr<ctrl::Heartbeats> beats_;  // link -1: upstream; others: children by node
  NodeJob job_;
  bool have_job_ = false;
  bool idle_ = false;  // a spare: not in the current generation
  bool spawn_only_ = false;  // a node without ranks, for MPI_Comm_spawn's processes
  JobMap idle_map_;          // the generation's map, while idle
  std::unique_ptr<NodeRunner> runner_;
  // The store of the running generation when its MASTER_PORT is ours, and the one reported for
  // the next.
  std::unique_ptr<TorchStore> store_, next_store_;
  NodeAgent* agent_ = nullptr;  // runner_'s, once it is open
  // The upstream queue is full: the ranks' output and the children's links are not read.
  bool output_paused_ = false;
  int status_ = 0;
  int job_status_ = -1;  // from JobEnd (join mode): the job is over
  std::string let_go_;   // from Leave: why the front end lets this node go (its close is due)
  std::unique_ptr<OutputSink> join_sink_;  // join mode: our workers' output, printed here
  int join_sink_ranks_ = 0;
  bool leaving_ = false;  // join mode: a signal came; the workers have kill_grace to exit
  Event leave_timer_;
  // Fences and direct-modex requests waiting for the front end.
  std::map<std::string, uint32_t> fence_seq_;  // per namespace
  std::map<std::pair<std::string, uint32_t>, pmix::ModexDone> fences_;
  std::map<std::pair<std::string, uint32_t>, std::string> fence_pieces_;  // received so far
  uint64_t next_dmodex_ = 1;
  std::map<uint64_t, pmix::ModexDone> dmodex_;
  // Spawn requests and lookups waiting for the front end.
  uint64_t next_request_ = 1;
  struct PendingSpawn {
    pmix::SpawnDone done;
    Event timeout;
  };
  std::map<uint64_t, std::unique_ptr<PendingSpawn>> spawns_;
  std::map<uint64_t, pmix::LookupDone> lookups_;
};

}  // namespace pe
