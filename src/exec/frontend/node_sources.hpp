// Where an elastic job (--nnodes MIN:MAX) finds nodes while it runs: its hostfile, read again
// whenever it changes, and a discovery command (--host-discovery CMD, Horovod's
// --host-discovery-script), run every --host-discovery-interval seconds, which prints the hosts
// that may be used, one "host" or "host:slots" per line.  At once when a source changes, and
// every second (cool-downs end), the hosts of every source go to `on_hosts`; the membership
// decides what to do with them (a host that leaves every list leaves the job).  A hostfile that
// cannot be read or parsed, or a command that fails, times out or prints a malformed line, is
// logged (a warning, once for the same trouble) and its source keeps its last list.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/launch_config.hpp"

namespace pe {

// One run of `sh -c CMD`: its standard output is collected, its standard error goes to ours;
// after `timeout` seconds it is killed.  done(status, output) is called once, status -1 for a
// command that timed out (else as waitpid gives it).  Destroying a run kills and reaps the
// command if it is still running.
class CommandRun {
 public:
  using DoneFn = std::function<void(int status, std::string out)>;
  CommandRun(EventLoop& loop, const std::string& cmd, double timeout, DoneFn done);
  ~CommandRun();

 private:
  void on_readable(bool out);
  void try_reap();
  void end(int status);

  struct State;
  std::unique_ptr<State> st_;
};

// The hosts a discovery command printed (none for an empty output).  Throws UsageError naming
// the line.
std::vector<HostSlots> parse_discovery(const std::string& out);
// Runs the discovery command once and waits for it (the job's first nodes).  Throws Error.
std::vector<HostSlots> run_discovery(const std::string& cmd, double timeout);

// An elastic job whose hostfile or discovery command lists fewer than --nnodes MIN hosts at its
// start (`have` of them, from `source`): watches its sources as the job would, and returns their
// hosts once they list MIN and --last-call is over (at once with MAX plus --spares), as
// torchrun's rendezvous waits for its first nodes.  Throws ProgramError: status 1 when
// --join-timeout passes first, 128 + the signal for SIGINT, SIGTERM or SIGHUP.
std::vector<HostSlots> wait_for_hosts(const LaunchConfig& cfg, const std::string& source,
                                      size_t have);

class NodeSources {
 public:
  using HostsFn = std::function<void(const std::vector<HostSlots>& hosts)>;
  // Watches cfg.hostfile (elastic jobs) and runs cfg.host_discovery, if given.
  NodeSources(EventLoop& loop, const LaunchConfig& cfg, HostsFn on_hosts);
  ~NodeSources();
  // Whether there is anything to watch.
  static bool wanted(const LaunchConfig& cfg);

 private:
  void tick();
  void read_hostfile(bool at_once);
  void on_discovered(int status, const std::string& out);
  void warn(const std::string& what);
  void report();

  EventLoop& loop_;
  const LaunchConfig& cfg_;
  HostsFn on_hosts_;
  std::string file_stamp_;  // what the hostfile looked like when last read
  std::string seen_stamp_;  // what it looked like at the last look (a change must settle)
  std::vector<HostSlots> from_file_, from_command_;
  std::unique_ptr<CommandRun> run_;
  double next_run_ = 0, next_report_ = 0;
  std::string last_warning_;
  Event timer_;
  Event settle_timer_;  // a look at a changed hostfile again, shortly after
};

}  // namespace pe
