#include "exec/frontend/daemon_launcher.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/line_buffer.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/cli.hpp"
#include "exec/node/child_process.hpp"

namespace pe {
namespace {

constexpr double kLauncherExitWait = 5.0;

std::string execd_path() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "pytorch_execd";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "pytorch_execd";
}

}  // namespace

std::string shell_quote(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:,=@+") ==
          std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct DaemonLauncher::Launcher {
  std::string what;  // argv[0], for messages
  std::vector<int> nodes;
  int incarnation = 0;
  ChildProcess proc;
  Event out_ev, err_ev;
  LineBuffer out_buf, err_buf;
  bool exited = false;
};

DaemonLauncher::DaemonLauncher(EventLoop& loop, const LaunchConfig& cfg, const EnvMap& env,
                               const JobMap& map, std::string host, bool slurm, ExitFn on_exit)
    : loop_(loop),
      cfg_(cfg),
      env_(env),
      map_(map),
      host_(std::move(host)),
      slurm_(slurm),
      on_exit_(std::move(on_exit)),
      execd_(execd_path()) {}

DaemonLauncher::~DaemonLauncher() {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kLauncherExitWait);
  for (auto& l : launchers_) {
    while (!l->exited && std::chrono::steady_clock::now() < deadline) {
      pid_t r = ::waitpid(l->proc.pid, nullptr, WNOHANG);
      if (r == l->proc.pid || (r < 0 && errno == ECHILD))
        l->exited = true;
      else
        ::usleep(5000);
    }
    if (!l->exited) {
      logger("ctrl")->warn("{} (pid {}) did not exit: killing it", l->what, l->proc.pid);
      ::kill(-l->proc.pid, SIGKILL);
      ::waitpid(l->proc.pid, nullptr, 0);
    }
  }
}

std::vector<std::string> DaemonLauncher::daemon_argv(int node, bool slurm) const {
  std::vector<std::string> argv{execd_, "--connect", connect_};
  if (slurm) {
    argv.push_back("--slurm");
  } else {
    argv.insert(argv.end(),
                {"--node", map_.nodes.at(static_cast<size_t>(node)).host, "--secret-stdin"});
  }
  LaunchConfig defaults;
  if (env_.count("PYTORCH_EXEC_DAEMON_TIMEOUT"))
    argv.insert(argv.end(), {"--connect-timeout", seconds_text(daemon_timeout(env_))});
  if (cfg_.heartbeat_interval != defaults.heartbeat_interval)
    argv.insert(argv.end(), {"--heartbeat-interval", seconds_text(cfg_.heartbeat_interval)});
  if (cfg_.heartbeat_timeout != defaults.heartbeat_timeout)
    argv.insert(argv.end(), {"--heartbeat-timeout", seconds_text(cfg_.heartbeat_timeout)});
  return argv;
}

std::vector<std::string> DaemonLauncher::launch_command(int node) const {
  const std::string& host = map_.nodes.at(static_cast<size_t>(node)).host;
  auto daemon = daemon_argv(node, false);
  if (cfg_.launch_agent.empty() && is_local_host(host, host_)) return daemon;
  std::string agent = cfg_.launch_agent.empty() ? "ssh -x -o BatchMode=yes" : cfg_.launch_agent;
  std::vector<std::string> argv;
  bool placed = false;
  for (auto word : split_words(agent)) {
    for (size_t at; (at = word.find("{host}")) != std::string::npos; placed = true)
      word.replace(at, 6, host);
    argv.push_back(word);
  }
  if (argv.empty()) throw UsageError("--launch-agent is empty");
  if (!placed) argv.push_back(host);
  std::string base = argv[0].substr(argv[0].rfind('/') + 1);
  if (base == "ssh" || base == "rsh") {
    // The remote shell parses the command: one quoted string.
    std::string cmd;
    for (const auto& a : daemon) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
    argv.push_back(cmd);
  } else {
    argv.insert(argv.end(), daemon.begin(), daemon.end());
  }
  return argv;
}

void DaemonLauncher::launch(const std::vector<std::string>& addresses, int port,
                            const std::string& secret) {
  connect_.clear();
  for (const auto& a : addresses)
    connect_ += (connect_.empty() ? "" : ",") + a + ":" + std::to_string(port);
  secret_ = secret;
  sigchld_ev_ = loop_.watch_signal(SIGCHLD, [this] { on_sigchld(); });
  if (!slurm_) {
    for (size_t i = 0; i < map_.nodes.size(); ++i)
      start(launch_command(static_cast<int>(i)), {static_cast<int>(i)}, true);
    return;
  }
  std::vector<int> all;
  for (size_t i = 0; i < map_.nodes.size(); ++i) all.push_back(static_cast<int>(i));
  auto argv = srun_argv(all);
  start(std::move(argv), std::move(all), false);
}

void DaemonLauncher::launch_node(int node, int incarnation) {
  // An arrival outside the allocation (a hostfile's host): the launch agent starts it.
  auto nodes = slurm_ ? slurm_nodes(env_) : std::vector<std::string>{};
  const std::string& host = map_.nodes.at(static_cast<size_t>(node)).host;
  if (slurm_ && (nodes.empty() || std::find(nodes.begin(), nodes.end(), host) != nodes.end()))
    start(srun_argv({node}), {node}, false, incarnation);
  else
    start(launch_command(node), {node}, true, incarnation);
}

double daemon_timeout(const EnvMap& env) {
  auto it = env.find("PYTORCH_EXEC_DAEMON_TIMEOUT");
  if (it == env.end()) return 60.0;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (!end || *end || !(v > 0))
    throw UsageError("PYTORCH_EXEC_DAEMON_TIMEOUT: '" + it->second +
                     "' is not a number of seconds");
  return v;
}

// One srun step that starts the daemons of `nodes`.
std::vector<std::string> DaemonLauncher::srun_argv(const std::vector<int>& nodes) const {
  std::vector<std::string> hosts;
  for (int i : nodes) hosts.push_back(map_.nodes.at(static_cast<size_t>(i)).host);
  std::string count = std::to_string(nodes.size());
  std::vector<std::string> argv{"srun",
                                "--nodes=" + count,
                                "--ntasks=" + count,
                                "--ntasks-per-node=1",
                                "--nodelist=" + join(hosts, ","),
                                "--overlap",
                                "--whole",
                                "--mpi=none",
                                "--cpu-bind=none",
                                "--kill-on-bad-exit=0",
                                "--export=ALL",
                                "--job-name=pytorch_execd",
                                "--input=none"};
  // An elastic job goes on without a node that fails: SLURM must not end the step (it still
  // kills the failed node's daemon, which the job sees as that node's loss).
  if (cfg_.nnodes_min > 0) argv.push_back("--no-kill");
  auto d = daemon_argv(0, true);
  argv.insert(argv.end(), d.begin(), d.end());
  return argv;
}

void DaemonLauncher::start(std::vector<std::string> argv, std::vector<int> nodes,
                           bool secret_on_stdin, int incarnation) {
  auto l = std::make_unique<Launcher>();
  l->what = argv[0];
  l->nodes = std::move(nodes);
  l->incarnation = incarnation;
  SpawnSpec spec;
  auto path = env_.count("PATH") ? env_.at("PATH") : std::string("/usr/bin:/bin");
  try {
    spec.path = resolve_program(argv[0], "", path);
  } catch (const Error& e) {
    return on_exit_(l->nodes, std::string("cannot start its daemon: ") + e.what(), incarnation);
  }
  spec.argv = std::move(argv);
  EnvMap env = environment_from(environ);
  if (!secret_on_stdin) env["PYTORCH_EXEC_SECRET"] = auth::to_hex(secret_);
  spec.envp = to_envp(env);
  spec.stdin_pipe = true;
  logger("ctrl")->debug("launching: {}", join(spec.argv, " "));
  l->proc = spawn_child(spec);
  if (secret_on_stdin) {
    std::string line = auth::to_hex(secret_) + "\n";
    write_all(l->proc.stdin_w.get(), line.data(), line.size());
  }
  l->proc.stdin_w.reset();
  Launcher* lp = l.get();
  l->out_ev =
      loop_.watch_readable(l->proc.stdout_r.get(), [this, lp] { forward_output(*lp, true); });
  l->err_ev =
      loop_.watch_readable(l->proc.stderr_r.get(), [this, lp] { forward_output(*lp, false); });
  launchers_.push_back(std::move(l));
}

// Line by line to our stderr, except srun's note that the cluster cannot bind CPUs (we asked it
// not to).
void DaemonLauncher::forward_output(Launcher& l, bool out) {
  UniqueFd& fd = out ? l.proc.stdout_r : l.proc.stderr_r;
  LineBuffer& lb = out ? l.out_buf : l.err_buf;
  char buf[65536];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  std::string text;
  if (n > 0) {
    text = std::string(lb.append(buf, static_cast<size_t>(n)));
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    (out ? l.out_ev : l.err_ev) = Event();
    text = lb.take_rest();
    if (!text.empty()) text += "\n";
  }
  for (const auto& line : split(text, '\n')) {
    if (line.empty()) continue;
    if (line.find("lacks support for cpu binding") != std::string::npos) {
      logger("ctrl")->debug("{}: {}", l.what, line);
      continue;
    }
    std::string l2 = line + "\n";
    write_all(2, l2.data(), l2.size());
  }
}

void DaemonLauncher::kill_node(int node, int incarnation) {
  for (auto& l : launchers_)
    if (!l->exited && l->incarnation == incarnation && l->nodes == std::vector<int>{node}) {
      logger("ctrl")->info("{} (pid {}) of a silent node: killing it", l->what, l->proc.pid);
      ::kill(-l->proc.pid, SIGKILL);
    }
}

void DaemonLauncher::on_sigchld() {
  for (size_t i = 0; i < launchers_.size(); ++i) {  // on_exit_ may start another
    Launcher* l = launchers_[i].get();
    if (l->exited) continue;
    int status = 0;
    if (::waitpid(l->proc.pid, &status, WNOHANG) != l->proc.pid) continue;
    l->exited = true;
    logger("ctrl")->info("{} (pid {}) {}", l->what, l->proc.pid, describe_wait_status(status));
    // One srun for several nodes: which of them could not take the step is not known.
    std::string what = l->nodes.size() == 1 ? l->what
                                            : "the " + l->what + " that starts the daemons of " +
                                                  std::to_string(l->nodes.size()) + " nodes";
    on_exit_(l->nodes,
             "its daemon could not be started (" + what + " " + describe_wait_status(status) + ")",
             l->incarnation);
  }
}

}  // namespace pe
