// The job state machine of the front end: start a generation, forward output, react to worker
// exits and to signals, restart the whole group while the budget lasts, and produce the exit
// status.  Decisions that need no processes (what a failure means, what to print) are in
// failure.hpp.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/failure.hpp"
#include "exec/launch_config.hpp"
#include "exec/node_agent.hpp"
#include "exec/node_plan.hpp"
#include "exec/stdio.hpp"
#include "exec/worker_env.hpp"
#include "pmix_rdzv/modex_router.hpp"

namespace pe {

class JobController : public AgentListener {
 public:
  // `map` has one node, this machine (multi-node launches go through pytorch_execd).
  JobController(LaunchConfig cfg, EnvMap env, std::string host, JobMap map);
  ~JobController() override;
  // Runs the job to its end; returns pytorch_exec's exit status.
  int run();

 private:
  enum class State { Running, Restarting, Failing, Interrupted, Done };

  void start_generation();
  std::vector<WorkerSpec> worker_specs(const GenerationInfo& gen);
  void on_output(int generation, int rank, Stream s, std::string_view lines) override;
  void on_exit(const WorkerExit& e) override;
  void on_abort(int generation, int rank, pid_t pid, int status, const std::string& msg) override;
  void on_rank_failed(Failure f);
  void on_stdin_drained() override;
  void on_signal(int sig);
  void stop_workers(int sig);
  void on_all_stopped();
  void finish(int status);
  void setup_stdin();
  void on_stdin_readable();

  LaunchConfig cfg_;
  EnvMap env_;
  std::string host_;
  std::string job_id_;
  EventLoop loop_;
  pmix::LocalModexRouter modex_;
  OutputSink sink_;
  JobMap map_;
  NodePlan plan_;                    // before agent_: the agent borrows its topology
  std::unique_ptr<NodeAgent> agent_;

  State state_ = State::Running;
  int generation_ = 0;
  int restarts_ = 0;
  int exited_ok_ = 0;
  int interrupt_signal_ = 0;
  std::optional<Failure> failure_;
  int exit_status_ = 0;

  std::vector<Event> signal_events_;
  Event grace_timer_;
  Event kill_timer_;

  // Standard input.
  enum class StdinHow { DevNull, Forward, Direct };
  StdinHow stdin_how_ = StdinHow::DevNull;
  bool stdin_eof_ = false;
  Event stdin_event_;
};

}  // namespace pe
