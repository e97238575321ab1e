// The node agent: starts the workers of one node, watches them (SIGCHLD, no polling), reads
// their stdout/stderr in whole lines (a partial one after kPartialHold), feeds their stdin, and signals or kills their process
// groups on command.  In single-node mode it runs inside pytorch_exec; pytorch_execd hosts it
// on every node of a multi-node job.
//
// Threading: everything runs on the event-loop thread; listener callbacks are made from there.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/event_loop.hpp"
#include "common/line_buffer.hpp"
#include "exec/frontend/stdio.hpp"
#include "exec/node/child_process.hpp"
#include "exec/node/orphan_guard.hpp"
#include "exec/node/worker_exit.hpp"
#include "pmix_rdzv/pmix_server.hpp"

struct hwloc_topology;  // hwloc.h: hwloc_topology_t

namespace pe {

// How long a partial line (no newline yet) waits for its rest, from its first bytes, before what
// there is of it is passed on as it is (a progress bar that rewrites its line with \r shows).
constexpr double kPartialHold = 0.1;

struct WorkerSpec {
  int rank = 0;
  SpawnSpec spawn;
};

class AgentListener {
 public:
  virtual ~AgentListener() = default;
  // Whole lines ending in '\n'; or a partial line, as it is, kPartialHold seconds after its
  // first bytes came if its rest has not, or when the rank has exited.
  virtual void on_output(int generation, int rank, Stream s, std::string_view lines) = 0;
  // After the worker's output has been drained.
  virtual void on_exit(const WorkerExit& e) = 0;
  // The stdin backlog fell to zero.
  virtual void on_stdin_drained() {}
  // Whole lines of a process started by MPI_Comm_spawn: rank `rank` of the generation's spawned
  // job `spawn` (1, 2, ...).  Its exit comes to on_exit with WorkerExit::spawn set.
  virtual void on_spawned_output(int generation, int spawn, int rank, Stream s,
                                 std::string_view lines) {
    (void)generation, (void)spawn, (void)rank, (void)s, (void)lines;
  }
  // A worker called PMIx_Abort (MPI_Abort).
  virtual void on_abort(int generation, int rank, pid_t pid, int status,
                        const std::string& msg) = 0;
  // Multi-node jobs: a node's daemon could not be started, or it (or its node) went away.
  virtual void on_node_lost(const std::string& host, const std::string& why) {
    (void)host, (void)why;
  }
  // Multi-node jobs: a relay of the control tree went away, and with it the nodes below it
  // (`below`, whose daemons exit when their parent goes): one event for all of them.
  virtual void on_nodes_lost(const std::string& host, const std::string& why,
                             const std::vector<std::string>& below) {
    on_node_lost(host, why);
    for (const auto& h : below) on_node_lost(h, "lost with the relay " + host + " above it");
  }
  // Multi-node jobs: MPI_Comm_spawn wants processes on `host`, a host of the job's list that runs
  // none of its ranks: the front end has a daemon started there, for spawned processes only.
  // "" (on_node_lost or a ready daemon follows) or why it cannot.
  virtual std::string on_spawn_host(const std::string& host) {
    return "cannot start a daemon on " + host;
  }
  // Multi-node jobs: a node for spawned processes only (on_spawn_host) was lost, or could not be
  // started, before any of its processes ran: the spawns waiting for it fail, nothing else.
  virtual void on_spawn_host_lost(const std::string& host, const std::string& why) {
    on_node_lost(host, why);
  }
  // Multi-node jobs: a node's daemon could not start its workers (the node itself is fine).
  virtual void on_start_failed(const std::string& host, const std::string& why) {
    on_node_lost(host, why);
  }
};

class NodeAgent : public pmix::ServerListener {
 public:
  // With a router, the agent hosts a PMIx server (namespace `server_nspace`) for its workers.
  NodeAgent(EventLoop& loop, AgentListener& listener, pmix::ModexRouter* router = nullptr,
            const std::string& server_nspace = "pytorch_exec",
            struct hwloc_topology* topology = nullptr);
  // Kills whatever is still running (so an exception can never leave workers behind).
  ~NodeAgent() override;
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Starts one generation.  With `ns` (and a PMIx server), its namespace is registered and every
  // worker's environment gets what PMIx_server_setup_fork adds.  Throws (SystemError, PmixError)
  // if a fork, a pipe or the registration fails; workers already started stay registered and
  // are reported as usual.
  void start(int generation, std::vector<WorkerSpec> specs,
             const pmix::NamespaceInfo* ns = nullptr);
  // Starts this node's processes of a spawned job (MPI_Comm_spawn), in namespace `ns` (which
  // every node registers, those without its processes too: `specs` is then empty).  Throws as
  // start() does.
  void start_spawned(int generation, int number, std::vector<WorkerSpec> specs,
                     const pmix::NamespaceInfo& ns);
  // Where PMIx_Spawn requests of the workers go (none: they fail).
  void on_spawn_request(std::function<void(pmix::SpawnRequest, pmix::SpawnDone)> handler) {
    spawn_handler_ = std::move(handler);
  }
  // Sends sig to the process group of every live worker.
  void signal_all(int sig);
  // Kills this node's processes of spawned job `number` of `generation` (SIGKILL): the spawn
  // failed elsewhere.  Their exits are reported as usual.
  void stop_spawned(int generation, int number);
  // Rank `rank` of `generation` (of its spawned job `spawn`, when not 0; on any node) failed: the
  // PMIx server tells this node's processes that registered for it, of every namespace
  // (PmixServer::notify_proc_failure).  Nothing without a PMIx server or when that generation
  // (or spawned job) is not known here.
  void notify_failure(int generation, int spawn, int rank, int exit_code, bool aborted);
  // Stops (true) or resumes reading the ranks' stdout and stderr: backpressure when their
  // destination lags behind; a rank that writes meanwhile blocks once its pipe is full.
  void pause_output(bool paused);
  size_t live() const { return workers_.size(); }

  // Standard input for `rank` (a worker started with stdin_pipe).  Data for a rank that is not
  // running, or has closed its stdin, is dropped.
  void stdin_write(int rank, std::string_view data);
  // The end of the job's standard input: every worker's stdin closes once its data is written,
  // and workers started later (the next generation) get it closed at once.
  void stdin_close_all();
  size_t stdin_backlog() const { return stdin_backlog_; }

  // Multi-node: another node asks for what a local client committed (see PmixServer).
  void dmodex_request(const std::string& nspace, int rank, pmix::ModexDone done);

 private:
  struct Worker;
  void on_client_connected(const std::string& nspace, int rank) override;
  void on_client_finalized(const std::string& nspace, int rank) override;
  void on_abort(const std::string& nspace, int rank, int status, const std::string& msg) override;
  void on_spawn(pmix::SpawnRequest req, pmix::SpawnDone done) override;
  void prepare_pmix(const pmix::NamespaceInfo& ns, std::vector<WorkerSpec>& specs);
  void launch(int generation, int spawn, const std::string& nspace, std::vector<WorkerSpec>& specs);
  Worker* find_rank(const std::string& nspace, int rank);
  void on_sigchld();
  void on_readable(Worker& w, Stream s);
  void flush_partial(Worker& w, Stream s);
  void output(const Worker& w, Stream s, std::string_view lines);
  void watch_output(Worker& w);
  void on_stdin_writable(Worker& w);
  void flush_stdin(Worker& w);
  void drop_stdin(Worker& w);
  void finish(pid_t pid, int status);
  // Kills the strays of generations that have no rank here; how many there were (a zombie is
  // none: its environment is gone).
  size_t end_strays();
  // Deregisters the namespaces (those a client connected to, if only_used).
  void end_namespaces(bool only_used);
  static std::vector<pid_t> children();
  // SIGKILL to a process group, remembered until the group is gone (still_ending).
  void kill_group(pid_t group);
  // Whether a group killed still has a process (a zombie too); forgets those that have none.
  bool still_ending();

  OrphanGuard guard_;  // first member: outlives the workers' cleanup in ~NodeAgent
  EventLoop& loop_;
  AgentListener& listener_;
  Event sigchld_;
  std::map<pid_t, std::unique_ptr<Worker>> workers_;
  // Exited ranks whose stdout or stderr a process they started in a session of their own still
  // holds: read on (their output is theirs) until its end.
  std::vector<std::unique_ptr<Worker>> lingering_;
  size_t stdin_backlog_ = 0;
  bool stdin_ended_ = false;  // stdin_close_all() was called
  std::string job_marker_;    // "PYTORCH_EXEC_JOBID=..." of the workers (end_strays)
  std::string agent_marker_;  // "PYTORCH_EXEC_AGENT=...", this agent's (its orphan guard's)
  Event stray_sweep_;         // end_strays() every kStraySweep s, and at a generation's end here
  std::set<pid_t> ending_;    // process groups killed and not yet seen gone (kill_group)
  bool output_paused_ = false;
  std::unique_ptr<pmix::PmixServer> pmix_;
  std::string nspace_;  // the current generation's PMIx namespace
  int nspace_generation_ = -1;
  std::map<int, std::string> spawned_ns_;  // its spawned jobs' namespaces, by number
  std::function<void(pmix::SpawnRequest, pmix::SpawnDone)> spawn_handler_;
};

}  // namespace pe
