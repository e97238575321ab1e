#include "exec/job.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "exec/job_map.hpp"

namespace pe {
namespace {

constexpr size_t kStdinBacklogLimit = 4u << 20;
constexpr double kAfterKillTimeout = 10.0;  // seconds to wait for SIGKILLed workers to be reaped
constexpr size_t kTailLines = 10;

std::string random_job_id() {
  unsigned char b[6];
  if (getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) {
    auto v = static_cast<unsigned long>(getpid()) ^ static_cast<unsigned long>(time(nullptr));
    for (auto& c : b) c = static_cast<unsigned char>(v >>= 5);
  }
  char s[16];
  std::snprintf(s, sizeof s, "%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5]);
  return s;
}

void say(const std::string& line) {
  std::string s = "pytorch_exec: " + line + "\n";
  write_all(2, s.data(), s.size());
}

}  // namespace

JobController::JobController(LaunchConfig cfg, EnvMap env, std::string host, JobMap map)
    : cfg_(std::move(cfg)),
      env_(std::move(env)),
      host_(std::move(host)),
      job_id_(random_job_id()),
      sink_(OutputOptions{cfg_.tag_output, cfg_.timestamp_output, cfg_.output_dir, cfg_.output_copy},
            map.world_size),
      map_(std::move(map)) {}

JobController::~JobController() = default;

int JobController::run() {
  plan_ = plan_node(cfg_, map_.world_size);
  if (cfg_.display_topology) std::cout << topo::format_topology(*plan_.topology, plan_.analysis) << std::flush;
  if (cfg_.display_map) std::cout << format_job_map(map_, {&plan_}) << std::flush;
  if (cfg_.dry_run) return 0;
  sink_.open_files();
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2})
    signal_events_.push_back(loop_.watch_signal(sig, [this, sig] { on_signal(sig); }));
  ::signal(SIGPIPE, SIG_IGN);
  grace_timer_ = loop_.timer([this] {
    logger("exec")->info("kill grace of {} s is over: SIGKILL", cfg_.kill_grace);
    agent_->signal_all(SIGKILL);
    kill_timer_.arm(kAfterKillTimeout);
  });
  kill_timer_ = loop_.timer([this] {
    say("timed out waiting for " + std::to_string(agent_->live()) +
        " killed process(es) to exit; giving up");
    finish(exit_status_ ? exit_status_ : 1);
  });
  agent_ = std::make_unique<NodeAgent>(loop_, *this, &modex_, "pytorch_exec." + job_id_,
                                       plan_.topology->raw());
  setup_stdin();
  start_generation();
  if (state_ != State::Done) loop_.run();
  return exit_status_;
}

std::vector<WorkerSpec> JobController::worker_specs(const GenerationInfo& gen) {
  std::vector<WorkerSpec> specs;
  std::vector<std::string> argv{cfg_.program_arg0};
  argv.insert(argv.end(), cfg_.args.begin(), cfg_.args.end());
  for (int rank = 0; rank < map_.world_size; ++rank) {
    WorkerSpec w;
    w.rank = rank;
    w.spawn.path = cfg_.program;
    w.spawn.argv = argv;
    const auto& where = plan_.ranks.at(static_cast<size_t>(map_.ranks[static_cast<size_t>(rank)].local_rank));
    w.spawn.envp = to_envp(worker_environment(env_, cfg_.exports, map_, rank, gen, locality_of(where)));
    w.spawn.cpus = where.os_cpus;
    w.spawn.wdir = cfg_.wdir;
    bool gets_stdin = cfg_.stdin_mode == StdinMode::All ||
                      (cfg_.stdin_mode == StdinMode::OneRank && rank == cfg_.stdin_rank);
    if (gets_stdin && stdin_how_ == StdinHow::Forward && !stdin_eof_) w.spawn.stdin_pipe = true;
    if (gets_stdin && stdin_how_ == StdinHow::Direct) w.spawn.stdin_fd = 0;
    specs.push_back(std::move(w));
  }
  return specs;
}

void JobController::start_generation() {
  GenerationInfo gen;
  gen.job_id = job_id_;
  gen.run_id = cfg_.run_id;
  gen.generation = generation_;
  gen.restart_count = restarts_;
  gen.max_restarts = cfg_.max_restarts;
  gen.master_addr = "127.0.0.1";
  gen.master_port = find_free_port(gen.master_addr);
  long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
  gen.oversubscribed = ncpu > 0 && map_.world_size > ncpu;
  pmix::NamespaceInfo ns;
  ns.nspace = "pytorch_exec." + job_id_ + "." + std::to_string(generation_);
  ns.world_size = map_.world_size;
  for (const auto& node : map_.nodes) {
    ns.hosts.push_back(node.host);
    ns.node_ranks.push_back(node.ranks);
  }
  ns.this_node = 0;
  ns.oversubscribed = gen.oversubscribed;
  state_ = State::Running;
  exited_ok_ = 0;
  failure_.reset();
  logger("exec")->info("generation {}: {} ranks, MASTER_ADDR={} MASTER_PORT={}", generation_,
                       map_.world_size, gen.master_addr, gen.master_port);
  auto specs = worker_specs(gen);
  // "All" on a file: every rank reads it from the start, through its own open file description.
  std::vector<UniqueFd> own_stdin;
  if (stdin_how_ == StdinHow::Direct && cfg_.stdin_mode == StdinMode::All) {
    for (auto& w : specs) {
      own_stdin.emplace_back(::open("/proc/self/fd/0", O_RDONLY | O_CLOEXEC));
      w.spawn.stdin_fd = own_stdin.back().get();
    }
  }
  if (cfg_.report_bindings)
    for (int rank = 0; rank < map_.world_size; ++rank)
      say("generation " + std::to_string(generation_) + " rank " + std::to_string(rank) + " on " +
          host_ + ": " + topo::describe_placement(plan_.ranks.at(static_cast<size_t>(rank))));
  try {
    agent_->start(generation_, std::move(specs), &ns);
  } catch (const Error& e) {
    say(std::string("cannot start the workers: ") + e.what());
    exit_status_ = 1;
    state_ = State::Failing;
    stop_workers(SIGTERM);
  }
}

void JobController::on_output(int generation, int rank, Stream s, std::string_view lines) {
  sink_.write(generation, rank, s, lines);
}

void JobController::on_exit(const WorkerExit& e) {
  if (state_ == State::Running) {
    if (!is_failure(e.status, e.exec_errno, e.pmix_unfinalized)) {
      if (++exited_ok_ == map_.world_size) finish(0);
      return;
    }
    Failure f;
    f.rank = e.rank;
    f.pid = e.pid;
    f.host = host_;
    f.status = e.status;
    f.exec_errno = e.exec_errno;
    f.bind_failed = e.bind_failed;
    f.program = cfg_.program;
    f.unfinalized = e.pmix_unfinalized;
    on_rank_failed(std::move(f));
  }
  if (agent_->live() == 0 && state_ != State::Running && state_ != State::Done) on_all_stopped();
}

void JobController::on_abort(int generation, int rank, pid_t pid, int status, const std::string& msg) {
  if (state_ != State::Running || generation != generation_) return;
  Failure f;
  f.rank = rank;
  f.pid = pid;
  f.host = host_;
  f.status = status;
  f.program = cfg_.program;
  f.aborted = true;
  f.abort_message = msg;
  on_rank_failed(std::move(f));
}

// The first failure of a generation: restart the group while the budget lasts (a program that
// cannot be executed or bound is not retried), else stop everything and report it.
void JobController::on_rank_failed(Failure f) {
  failure_ = std::move(f);
  if (restarts_ < cfg_.max_restarts && failure_->exec_errno == 0) {
    say(describe_failure(*failure_) + "; restarting all " + std::to_string(map_.world_size) +
        " ranks (restart " + std::to_string(restarts_ + 1) + " of " +
        std::to_string(cfg_.max_restarts) + ")");
    state_ = State::Restarting;
  } else {
    state_ = State::Failing;
  }
  stop_workers(SIGTERM);
}

void JobController::stop_workers(int sig) {
  agent_->signal_all(sig);
  if (agent_->live() > 0 && !grace_timer_.pending() && !kill_timer_.pending())
    grace_timer_.arm(cfg_.kill_grace);
}

void JobController::on_all_stopped() {
  grace_timer_.disarm();
  kill_timer_.disarm();
  switch (state_) {
    case State::Restarting:
      ++restarts_;
      ++generation_;
      sink_.clear_tails();
      start_generation();
      return;
    case State::Failing:
      if (failure_) {
        std::string report = failure_report(*failure_, sink_.stderr_tail(failure_->rank, kTailLines));
        write_all(2, report.data(), report.size());
        if (restarts_ > 0 && restarts_ == cfg_.max_restarts)
          say("no restarts left (" + std::to_string(restarts_) + " used)");
        finish(failure_exit_code(*failure_));
      } else {
        finish(exit_status_ ? exit_status_ : 1);
      }
      return;
    case State::Interrupted:
      finish(128 + interrupt_signal_);
      return;
    default:
      return;
  }
}

void JobController::on_signal(int sig) {
  if (sig == SIGUSR1 || sig == SIGUSR2) {
    agent_->signal_all(sig);
    return;
  }
  if (state_ == State::Done) return;
  if (state_ == State::Interrupted) {
    say("second signal: killing all processes now");
    grace_timer_.disarm();
    agent_->signal_all(SIGKILL);
    if (!kill_timer_.pending()) kill_timer_.arm(kAfterKillTimeout);
    return;
  }
  logger("exec")->info("signal {} received: forwarding to {} processes", sig, agent_->live());
  interrupt_signal_ = sig;
  state_ = State::Interrupted;
  grace_timer_.disarm();
  stop_workers(sig);
  if (agent_->live() == 0) on_all_stopped();
}

void JobController::finish(int status) {
  exit_status_ = status;
  state_ = State::Done;
  stdin_event_ = Event();
  loop_.stop();
}

void JobController::setup_stdin() {
  if (cfg_.stdin_mode == StdinMode::None) return;
  struct stat st;
  if (::fstat(0, &st) != 0) return;  // closed: /dev/null
  if (S_ISREG(st.st_mode) || (S_ISCHR(st.st_mode) && !::isatty(0))) {
    stdin_how_ = StdinHow::Direct;  // files and /dev/null cannot be polled; hand them over
    return;
  }
  if (::isatty(0) && ::tcgetpgrp(0) != ::getpgrp()) {
    logger("stdio")->info("stdin is a terminal and we are in the background: not forwarding it");
    return;
  }
  stdin_how_ = StdinHow::Forward;
  stdin_event_ = loop_.watch_readable(0, [this] { on_stdin_readable(); });
}

void JobController::on_stdin_readable() {
  char buf[65536];
  ssize_t n = ::read(0, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    stdin_eof_ = true;
    stdin_event_ = Event();
    agent_->stdin_close_all();
    return;
  }
  std::string_view data(buf, static_cast<size_t>(n));
  if (cfg_.stdin_mode == StdinMode::All) {
    for (int r = 0; r < map_.world_size; ++r) agent_->stdin_write(r, data);
  } else {
    agent_->stdin_write(cfg_.stdin_rank, data);
  }
  if (agent_->stdin_backlog() > kStdinBacklogLimit) stdin_event_.disarm();
}

void JobController::on_stdin_drained() {
  if (stdin_how_ == StdinHow::Forward && !stdin_eof_ && stdin_event_ && !stdin_event_.pending())
    stdin_event_ = loop_.watch_readable(0, [this] { on_stdin_readable(); });
}

}  // namespace pe
