#include "exec/frontend/node_sources.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/ctrl/heartbeat.hpp"
#include "exec/node/child_process.hpp"
#include "exec/node/worker_env.hpp"

extern char** environ;

namespace pe {
namespace {

constexpr double kTick = 0.1;           // seconds between looks at the hostfile
constexpr double kSettle = 0.02;        // a changed hostfile is read once unchanged this long
constexpr double kReportEvery = 1.0;    // the hosts go to the membership this often anyway
constexpr double kCommandTimeout = 30;  // seconds a discovery command may take
constexpr double kReapRetry = 0.01;

double now() { return ctrl::Heartbeats::steady_seconds(); }

}  // namespace

struct CommandRun::State {
  EventLoop& loop;
  DoneFn done;
  ChildProcess proc;
  std::string out, err_line;
  bool out_open = true, err_open = true, finished = false;
  Event out_ev, err_ev, deadline, reap;
  explicit State(EventLoop& l, DoneFn d) : loop(l), done(std::move(d)) {}
};

CommandRun::CommandRun(EventLoop& loop, const std::string& cmd, double timeout, DoneFn done)
    : st_(std::make_unique<State>(loop, std::move(done))) {
  SpawnSpec spec;
  spec.path = "/bin/sh";
  spec.argv = {"sh", "-c", cmd};
  spec.envp = to_envp(environment_from(environ));
  st_->proc = spawn_child(spec);
  st_->out_ev = loop.watch_readable(st_->proc.stdout_r.get(), [this] { on_readable(true); });
  st_->err_ev = loop.watch_readable(st_->proc.stderr_r.get(), [this] { on_readable(false); });
  st_->deadline = loop.timer([this] {
    ::kill(-st_->proc.pid, SIGKILL);
    ::waitpid(st_->proc.pid, nullptr, 0);  // killed: it goes at once
    end(-1);
  });
  st_->deadline.arm(timeout);
  st_->reap = loop.timer([this] { try_reap(); });
}

CommandRun::~CommandRun() {
  if (st_->finished) return;
  ::kill(-st_->proc.pid, SIGKILL);
  ::waitpid(st_->proc.pid, nullptr, 0);
}

void CommandRun::on_readable(bool out) {
  char buf[65536];
  ssize_t n = ::read((out ? st_->proc.stdout_r : st_->proc.stderr_r).get(), buf, sizeof buf);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    (out ? st_->out_ev : st_->err_ev) = Event();
    (out ? st_->out_open : st_->err_open) = false;
    if (!st_->out_open && !st_->err_open) try_reap();
    return;
  }
  if (out) {
    if (st_->out.size() < (1u << 20)) st_->out.append(buf, static_cast<size_t>(n));
    return;
  }
  write_all(2, buf, static_cast<size_t>(n));  // the command's own complaints
}

void CommandRun::try_reap() {
  int status = 0;
  pid_t r = ::waitpid(st_->proc.pid, &status, WNOHANG);
  if (r == st_->proc.pid) return end(status);
  if (r < 0 && errno != EINTR) return end(-1);
  st_->reap.arm(kReapRetry);  // its output is closed, it is about to exit
}

void CommandRun::end(int status) {
  st_->finished = true;
  st_->deadline.disarm();
  st_->reap.disarm();
  st_->out_ev = Event();
  st_->err_ev = Event();
  auto done = std::move(st_->done);
  std::string out = std::move(st_->out);
  st_->loop.post([done = std::move(done), status, out = std::move(out)] { done(status, out); });
}

std::vector<HostSlots> parse_discovery(const std::string& out) {
  if (out.find_first_not_of(" \t\r\n") == std::string::npos) return {};  // the callers decide
  std::istringstream in(out);
  return parse_hostfile(in, "--host-discovery output");
}

namespace {

// Runs `loop` until it is stopped.  A SIGINT, SIGTERM or SIGHUP meanwhile stops it and throws
// ProgramError (128 + the signal), so that what the caller started (a discovery command) is
// ended as it unwinds.
// Runs `loop` until it stops, `start` called once the signals are caught (what it starts, such
// as a command, is then never left running by a signal's default action).
void run_interruptible(EventLoop& loop, const std::string& what,
                       const std::function<void()>& start = {}) {
  SignalPipe signals({SIGINT, SIGTERM, SIGHUP});
  if (start) start();
  int signal = 0;
  Event on_signal = loop.watch_readable(signals.fd(), [&] {
    for (int sig : signals.take()) signal = signal ? signal : sig;
    if (signal) loop.stop();
  });
  loop.run();
  if (signal)
    throw ProgramError("interrupted by signal " + std::to_string(signal) + " " + what,
                       128 + signal);
}

}  // namespace

std::vector<HostSlots> run_discovery(const std::string& cmd, double timeout) {
  EventLoop loop;
  int status = 0;
  std::string out;
  std::unique_ptr<CommandRun> run;
  run_interruptible(loop, "while running the --host-discovery command", [&] {
    run = std::make_unique<CommandRun>(loop, cmd, timeout, [&](int st, std::string o) {
      status = st;
      out = std::move(o);
      loop.stop();
    });
  });
  if (status < 0)
    throw Error("--host-discovery: the command did not finish within " +
                std::to_string(static_cast<int>(timeout)) + " s");
  if (status != 0) throw Error("--host-discovery: the command " + describe_wait_status(status));
  return parse_discovery(out);
}

std::vector<HostSlots> wait_for_hosts(const LaunchConfig& cfg, const std::string& source,
                                      size_t have) {
  std::fprintf(stderr,
               "pytorch_exec: %s lists %zu host(s), --nnodes %d:%d needs at least %d: waiting up "
               "to %s s for more (--join-timeout)\n",
               source.c_str(), have, cfg.nnodes_min, cfg.nnodes_max, cfg.nnodes_min,
               seconds_text(cfg.join_timeout).c_str());
  EventLoop loop;
  bool timed_out = false;
  std::vector<HostSlots> hosts;
  Event done = loop.timer([&] { loop.stop(); });
  Event last_call = loop.timer([&] { done.arm(0); });
  Event deadline = loop.timer([&] {  // with MIN listed (a last call running), they will do
    timed_out = hosts.size() < static_cast<size_t>(cfg.nnodes_min);
    done.arm(0);
  });
  deadline.arm(cfg.join_timeout);
  size_t most = static_cast<size_t>(cfg.nnodes_max) + static_cast<size_t>(cfg.spares);
  NodeSources sources(loop, cfg, [&](const std::vector<HostSlots>& listed) {
    hosts = listed;
    if (hosts.size() >= most)
      done.arm(0);
    else if (hosts.size() < static_cast<size_t>(cfg.nnodes_min))
      last_call.disarm();  // fewer again
    else if (!last_call.pending())
      last_call.arm(cfg.last_call);
  });
  run_interruptible(loop, "while waiting for nodes");
  if (timed_out)
    throw ProgramError("only " + std::to_string(hosts.size()) + " of at least " +
                           std::to_string(cfg.nnodes_min) + " host(s) listed within the join "
                           "timeout of " + seconds_text(cfg.join_timeout) + " s (--join-timeout)",
                       1);
  return hosts;
}

NodeSources::NodeSources(EventLoop& loop, const LaunchConfig& cfg, HostsFn on_hosts)
    : loop_(loop), cfg_(cfg), on_hosts_(std::move(on_hosts)) {
  timer_ = loop_.timer([this] {
    tick();
    timer_.arm(kTick);
  });
  timer_.arm(kTick);
  settle_timer_ = loop_.timer([this] { read_hostfile(false); });
  if (!cfg_.hostfile.empty()) read_hostfile(true);
  next_run_ = next_report_ = now();
}

NodeSources::~NodeSources() = default;

bool NodeSources::wanted(const LaunchConfig& cfg) {
  return cfg.nnodes_min > 0 && (!cfg.hostfile.empty() || !cfg.host_discovery.empty());
}

void NodeSources::tick() {
  double t = now();
  if (!cfg_.hostfile.empty()) read_hostfile(false);
  if (!cfg_.host_discovery.empty() && !run_ && t >= next_run_) {
    next_run_ = t + cfg_.discovery_interval;
    try {
      run_ = std::make_unique<CommandRun>(
          loop_, cfg_.host_discovery, kCommandTimeout,
          [this](int status, std::string out) { on_discovered(status, out); });
    } catch (const Error& e) {
      warn(std::string("--host-discovery: cannot run the command: ") + e.what());
    }
  }
  if (t >= next_report_) report();
}

// Read again when its size, time or inode changed (an editor's rename too) and then stayed the
// same for kSettle: a file being written in place (truncated, then filled) is not taken
// half-written, and a hostfile that lists no host is not taken at all, since hosts that leave
// it leave the job.
void NodeSources::read_hostfile(bool at_once) {
  struct stat st;
  if (::stat(cfg_.hostfile.c_str(), &st) != 0) {
    warn("--hostfile " + cfg_.hostfile + ": " + std::strerror(errno) + " (keeping its hosts)");
    return;
  }
  std::string stamp = std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
                      std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  if (stamp == file_stamp_) return;
  bool settled = stamp == seen_stamp_;
  seen_stamp_ = stamp;
  if (!settled && !at_once) {
    if (!settle_timer_.pending()) settle_timer_.arm(kSettle);
    return;
  }
  std::ifstream in(cfg_.hostfile);
  try {
    if (!in) throw UsageError("cannot open it");
    auto hosts = parse_hostfile(in, cfg_.hostfile);
    if (hosts.empty()) throw UsageError("--hostfile " + cfg_.hostfile + " lists no hosts");
    from_file_ = std::move(hosts);
    file_stamp_ = stamp;
    logger("exec")->info("--hostfile {}: {} host(s)", cfg_.hostfile, from_file_.size());
    report();
  } catch (const UsageError& e) {
    file_stamp_ = stamp;  // not again until it changes
    warn(std::string(e.what()) + " (keeping the hosts read before)");
  }
}

void NodeSources::on_discovered(int status, const std::string& out) {
  run_.reset();
  if (status != 0) {
    warn("--host-discovery: the command " +
         (status < 0
              ? "did not finish within " + std::to_string(static_cast<int>(kCommandTimeout)) + " s"
              : describe_wait_status(status)) +
         " (keeping the hosts found before)");
    return;
  }
  try {
    auto hosts = parse_discovery(out);
    if (hosts.empty()) throw UsageError("--host-discovery: the command printed no hosts");
    bool changed = hosts.size() != from_command_.size();
    for (size_t i = 0; !changed && i < hosts.size(); ++i)
      changed = hosts[i].host != from_command_[i].host || hosts[i].slots != from_command_[i].slots;
    from_command_ = std::move(hosts);
    last_warning_.clear();
    if (!changed) return;
    logger("exec")->info("--host-discovery: {} host(s)", from_command_.size());
    report();
  } catch (const UsageError& e) {
    warn(std::string(e.what()) + " (keeping the hosts found before)");
  }
}

void NodeSources::warn(const std::string& what) {
  if (what == last_warning_) return;
  last_warning_ = what;
  logger("exec")->warn("{}", what);
}

// Every host once, the hostfile's first; nothing before every source has given its first list
// (a host missing from the report leaves the job).
void NodeSources::report() {
  next_report_ = now() + kReportEvery;
  if ((!cfg_.hostfile.empty() && from_file_.empty()) ||
      (!cfg_.host_discovery.empty() && from_command_.empty()))
    return;
  std::vector<HostSlots> all = from_file_;
  for (const auto& h : from_command_) {
    bool seen = false;
    for (const auto& a : all) seen = seen || a.host == h.host;
    if (!seen) all.push_back(h);
  }
  if (cfg_.nolocal) all = without_local_host(std::move(all), local_hostname());
  on_hosts_(all);
}

}  // namespace pe
