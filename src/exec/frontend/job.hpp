// The job state machine of the front end: start a generation, forward output, react to worker
// exits and to signals, restart the whole group while the budget lasts, and produce the exit
// status.  Decisions that need no processes (what a failure means, what to print) are in
// failure.hpp.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/frontend/failure.hpp"
#include "exec/frontend/launch_config.hpp"
#include "exec/frontend/membership.hpp"
#include "exec/frontend/node_sources.hpp"
#include "exec/frontend/stdio.hpp"
#include "exec/frontend/workers.hpp"
#include "exec/node/node_agent.hpp"
#include "exec/node/worker_env.hpp"

namespace pe {

class JobController : public AgentListener {
 public:
  // `workers` makes the job's WorkerSet (workers_for(), or a fake in unit tests).
  JobController(LaunchConfig cfg, EnvMap env, JobMap map, WorkerSetSource workers);
  ~JobController() override;
  // Runs the job to its end; returns pytorch_exec's exit status.
  int run();

 private:
  enum class State { Preparing, Running, Restarting, Reforming, Failing, Interrupted, Done };

  void start_generation();
  std::vector<WorkerSpec> worker_specs(const GenerationInfo& gen);
  // One line of pytorch_exec's own ("pytorch_exec: LINE") to stderr.
  void say(const std::string& line);
  void on_output(int generation, int rank, Stream s, std::string_view lines) override;
  void on_spawned_output(int generation, int spawn, int rank, Stream s,
                         std::string_view lines) override;
  void on_exit(const WorkerExit& e) override;
  void on_abort(int generation, int rank, pid_t pid, int status, const std::string& msg) override;
  void on_rank_failed(Failure f);
  void on_node_lost(const std::string& host, const std::string& why) override;
  void on_nodes_lost(const std::string& host, const std::string& why,
                     const std::vector<std::string>& below) override;
  void on_start_failed(const std::string& host, const std::string& why) override;
  bool in_group(int slot) const;
  bool arriving(int slot) const;
  void take_out(const std::string& host, int slot);
  std::string reform_without(const std::string& host, const std::string& why,
                             bool members_below = false);
  // Elastic arrivals: hosts from the node sources, a new node's daemon ready, the last call.
  void on_hosts(const std::vector<HostSlots>& hosts);
  void on_unlisted(const std::string& host);
  bool resize(const std::string& host, int slots);
  std::string resized_in(const std::vector<int>& slots) const;
  std::string admit(const std::string& host, int ranks, int slots, bool spawn_only,
                    long order = -1, std::string* kept_out = nullptr);
  // Join mode: a node asks to join; the first generation waits for MIN of them (gather).
  ctrl::Verdict on_join(const std::string& host, int slots, int node_rank);
  void gather();
  void next_generation();
  void on_join_timeout();
  // Waiting for --nnodes MIN nodes (join mode's start, or after a loss) until --join-timeout.
  void start_gathering();
  void on_wait_notice();
  static constexpr double kWaitNotice = 10, kWaitNoticeEvery = 60;
  // -v: each generation's timeline (detect -> stopped -> re-formed -> all workers running).
  void on_running(int generation);
  std::string on_spawn_host(const std::string& host) override;
  void on_spawn_host_lost(const std::string& host, const std::string& why) override;
  bool spawn_only(const std::string& host) const;
  void on_node_ready(const std::string& host);
  void on_last_call();
  void fail_with_node(const std::string& host, const std::string& why);
  void on_stdin_drained() override;
  void on_signal(int sig);
  void interrupt(int sig, int send, int status = -1);
  void on_time_limit();
  static constexpr int kTimeLimitStatus = 124;  // as timeout(1)
  void enter_failing();
  void on_output_closed(Stream s);
  void stop_workers(int sig);
  void on_all_stopped();
  void finish(int status);
  void setup_stdin(bool local);
  void on_stdin_readable();

  const LaunchConfig cfg_;
  EnvMap env_;
  WorkerSetSource source_;
  std::string job_id_;
  EventLoop loop_;
  OutputSink sink_;
  JobMap base_map_;           // every node the job has had, by slot (grows with arrivals)
  JobMap map_;                // the current generation's: some of base_map_'s nodes
  Membership membership_;     // the nodes by slot: starting, ready or lost; cool-downs
  std::vector<int> members_;  // the slots of the current generation, in its order
  std::unique_ptr<NodeSources> sources_;
  std::map<std::string, std::string> kept_out_;  // hosts offered and not admitted: why (logged)
  std::set<std::string> listed_;  // hosts the node sources list (or listed, for the first nodes)
  std::string retiring_;          // the host on_unlisted is taking out of the job
  std::unique_ptr<WorkerSet> workers_;

  State state_ = State::Preparing;
  int generation_ = 0;
  int restarts_ = 0;
  int scale_events_ = 0;  // re-formings after lost nodes (--max-scale-events)
  int exited_ok_ = 0;
  int interrupt_status_ = 0;  // pytorch_exec's exit status once interrupted (128 + signal, 124)
  Event time_limit_;          // --timeout
  std::optional<Failure> failure_;
  int exit_status_ = 0;

  std::unique_ptr<SignalPipe> signals_;  // SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT
  Event signal_event_;
  Event window_timer_;  // --failure-window
  // Elastic jobs: a rank killed by SIGKILL is held for kSigkillHold s, in case its node is
  // being lost (SLURM kills a DOWN node's processes all at once, and the daemon can report its
  // rank's death before its own connection closes): then it is the node's loss, not a failure.
  std::optional<Failure> held_;
  Failure take_held(Failure f);
  Event hold_timer_;
  Event grace_timer_;
  Event kill_timer_;
  Event suspend_timer_;  // SIGTSTP: stops pytorch_exec once the ranks were told
  Event last_call_;  // --last-call: arrivals wait for others
  // When the change that led to the next generation was seen (a failure, a loss, the first
  // arrival of a last call), when the old one had stopped, when the new one was started; -1:
  // not yet.  Seconds of ctrl::Heartbeats::steady_seconds().
  struct Timeline {
    double detect = -1, stopped = -1, reformed = -1;
  } timeline_;
  double first_arrival_ = -1;  // of the arrivals not admitted yet
  // Nodes listed with other slots since the last generation (their ranks change at the next).
  std::set<std::string> resized_;
  bool gathering_ = false;  // join mode: waiting for --nnodes MIN nodes before generation 0
  bool gather_called_ = false;  // the last call once MIN nodes are there was made
  Event join_timer_;        // --rdzv-conf join_timeout
  // While gathering: a line after kWaitNotice s, then every kWaitNoticeEvery s, saying what it
  // waits for and until when (a launcher waiting silently looks hung).
  Event wait_notice_;
  double gather_deadline_ = 0;  // steady seconds

  // Standard input.
  StdinHow stdin_how_ = StdinHow::DevNull;
  bool stdin_eof_ = false;
  bool stdin_file_ = false;    // a regular file forwarded to other nodes: read without polling
  bool stdin_paused_ = false;  // the backlog limit was reached
  Event stdin_event_;
};

}  // namespace pe
