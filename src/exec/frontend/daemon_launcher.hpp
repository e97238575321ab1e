// Starting the node daemons of a multi-node job: one `srun` step for every node inside a SLURM
// allocation, else one launch-agent command per node (ssh by default, or --launch-agent
// "CMD {host}"), with the daemon's command line quoted for a remote shell where one parses it.
// The job's secret goes to the daemons on the launcher's standard input (or, through srun, in
// its environment), never on a command line.  The launchers' own output (ssh or srun errors)
// goes to our stderr line by line.  When a launcher exits, `on_exit` gets the nodes it started.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/frontend/job_map.hpp"
#include "exec/frontend/launch_config.hpp"
#include "exec/node/worker_env.hpp"

namespace pe {

class DaemonLauncher {
 public:
  // The nodes of a launcher that exited or could not be started, and what to say of them
  // ("its daemon could not be started (srun exited with status 1)").
  // `incarnation` is what launch_node was given (0 for launch()).
  using ExitFn =
      std::function<void(const std::vector<int>& nodes, const std::string& how, int incarnation)>;
  // `slurm`: srun starts them all, else the launch agent starts each.
  DaemonLauncher(EventLoop& loop, const LaunchConfig& cfg, const EnvMap& env, const JobMap& map,
                 std::string host, bool slurm, ExitFn on_exit);
  // Waits a moment for the launchers to exit (their daemons exit when the control plane
  // closes), then kills them.
  ~DaemonLauncher();

  // Starts every node's daemon; they connect back to `addresses` at `port`.  A node whose
  // launcher cannot be started is reported through on_exit at once.
  void launch(const std::vector<std::string>& addresses, int port, const std::string& secret);
  // After launch(): starts the daemon of node `node` of the map (an elastic arrival) the same way.
  void launch_node(int node, int incarnation);
  // Node `node` is lost by its silence: its own launcher (of that incarnation) is killed, so
  // that a frozen or cut-off daemon is not waited for at the end.  Not an srun of several
  // nodes.
  void kill_node(int node, int incarnation);
  // The daemon command line and launcher command for node `node` (for tests).
  std::vector<std::string> launch_command(int node) const;
  // Path of pytorch_execd (next to pytorch_exec).
  const std::string& execd() const { return execd_; }

 private:
  struct Launcher;
  void start(std::vector<std::string> argv, std::vector<int> nodes, bool secret_on_stdin,
             int incarnation = 0);
  std::vector<std::string> srun_argv(const std::vector<int>& nodes) const;
  void forward_output(Launcher& l, bool out);
  void on_sigchld();
  std::vector<std::string> daemon_argv(int node, bool slurm) const;

  EventLoop& loop_;
  const LaunchConfig& cfg_;
  const EnvMap& env_;
  const JobMap& map_;
  std::string host_;
  bool slurm_;
  ExitFn on_exit_;
  std::string execd_;
  std::string connect_;  // "ADDR:PORT,..."
  std::string secret_;
  Event sigchld_ev_;
  std::vector<std::unique_ptr<Launcher>> launchers_;
};

// '...' quoting for a POSIX shell, unless the word needs none.
std::string shell_quote(const std::string& s);

// PYTORCH_EXEC_DAEMON_TIMEOUT of `env` (default 60): seconds a daemon has to report ready, and
// to reach the front end.  Throws UsageError for a value that is no positive number.
double daemon_timeout(const EnvMap& env);

}  // namespace pe
