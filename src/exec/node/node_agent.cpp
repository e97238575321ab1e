#include "exec/node/node_agent.hpp"

#include <dirent.h>
#include <hwloc.h>
#include <pytorch_exec/version.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <sstream>
#include <unordered_map>

#include "common/auth.hpp"
#include "common/log.hpp"
#include "common/unique_fd.hpp"
#include "exec/node/error_file.hpp"
#include "pmix_rdzv/ompi_env.hpp"

namespace pe {
namespace {
constexpr double kStraySweep = 0.5;  // seconds between looks for strays (end_strays)
}  // namespace

struct NodeAgent::Worker {
  int rank = 0;
  int generation = 0;
  int spawn = 0;  // 0: the job's own rank; else its spawned job's number
  std::string nspace;
  bool pmix_connected = false;
  bool pmix_finalized = false;
  ChildProcess proc;
  LineBuffer out_buf, err_buf;
  Event out_ev, err_ev, in_ev;
  Event out_hold, err_hold;  // a partial line's wait for the rest (kPartialHold)
  bool out_open = true, err_open = true;  // until EOF on the pipe
  std::string in_pending;
  bool in_closing = false;
  std::string generation_marker;  // "PYTORCH_EXEC_GENERATION=G" in its environment (end_strays)
  std::string error_file;         // its TORCHELASTIC_ERROR_FILE
  bool aborted = false;           // a spawned process's PMIx_Abort, reported with its exit
  int abort_status = 0;
  std::string abort_message;
};

NodeAgent::NodeAgent(EventLoop& loop, AgentListener& listener, pmix::ModexRouter* router,
                     const std::string& server_nspace, hwloc_topology_t topology)
    : loop_(loop), listener_(listener) {
  sigchld_ = loop_.watch_signal(SIGCHLD, [this] { on_sigchld(); });
  // Orphans among the workers' descendants come here, not to init (end_strays); if this process
  // dies, its guard kills them by this agent's mark.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  agent_marker_ = "PYTORCH_EXEC_AGENT=" + auth::to_hex(auth::random_bytes(8));
  guard_.kill_marked_on_death(agent_marker_);
  // A stray can come here after the last exit that looked for strays (its parent outside our
  // children died later; under load, 1 run in 60 kept one): looked for again now and then.
  stray_sweep_ = loop_.timer([this] {
    end_strays();
    still_ending();  // forgets the groups that are gone
    stray_sweep_.arm(kStraySweep);
  });
  stray_sweep_.arm(kStraySweep);
  if (router) {
    pmix_ = std::make_unique<pmix::PmixServer>(loop_, *this, *router, server_nspace, topology);
    guard_.remove_on_death(pmix_->tmpdir());
    if (!pmix_->shm_dir().empty()) guard_.remove_on_death(pmix_->shm_dir());
  }
}

NodeAgent::~NodeAgent() {
  for (auto& [pid, w] : workers_) kill_group(pid);
  // Reap what dies within a moment; a process stuck in the kernel is left to init rather than
  // hanging pytorch_exec (the job controller has already reported the timeout).
  for (int i = 0; i < 100 && !workers_.empty(); ++i) {
    for (auto it = workers_.begin(); it != workers_.end();)
      it = ::waitpid(it->first, nullptr, WNOHANG) == 0 ? std::next(it) : workers_.erase(it);
    if (!workers_.empty()) ::usleep(10000);
  }
  // What the ranks left in sessions of their own comes here as the processes between them die,
  // which the loop no longer sees: looked for until none is left and every group killed is gone
  // (a moment), reaping meanwhile.  Not only until a look finds none: a dying process's
  // environment reads empty before its children come here (CI, under load, kept a rank's
  // daemon that way).
  for (int i = 0; i < 200; ++i) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (end_strays() == 0 && !still_ending()) break;
    ::usleep(10000);
  }
  // Also where the server is left running at the process's end (PmixServer::end_with_process);
  // then a namespace no client connected to has nothing to clean up (1 ms saved at the end of a
  // job of 64 ranks that do not use PMIx).
  end_namespaces(pmix::PmixServer::ends_with_process());
}

// The namespaces end with their processes: PMIx runs what their clients asked it to do then
// (PMIX_REGISTER_CLEANUP's files and directories).
void NodeAgent::end_namespaces(bool only_used) {
  if (!pmix_) return;
  bool answering = true;  // after a timeout PMIx is stuck: no 10 s more for every namespace
  auto end = [&](const std::string& n) {
    if (answering && (!only_used || pmix_->had_clients(n)))
      answering = pmix_->deregister_namespace(n);
  };
  for (const auto& [number, n] : spawned_ns_) end(n);
  if (!nspace_.empty()) end(nspace_);
}

void NodeAgent::kill_group(pid_t group) {
  ::kill(-group, SIGKILL);
  ending_.insert(group);
}

bool NodeAgent::still_ending() {
  for (auto it = ending_.begin(); it != ending_.end();)
    it = ::kill(-*it, 0) != 0 && errno == ESRCH ? ending_.erase(it) : std::next(it);
  return !ending_.empty();
}

void NodeAgent::start(int generation, std::vector<WorkerSpec> specs,
                      const pmix::NamespaceInfo* ns) {
  end_namespaces(false);
  spawned_ns_.clear();
  nspace_.clear();
  if (pmix_ && ns) {
    nspace_ = ns->nspace;
    nspace_generation_ = generation;
    prepare_pmix(*ns, specs);
  }
  launch(generation, 0, nspace_, specs);
}

void NodeAgent::start_spawned(int generation, int number, std::vector<WorkerSpec> specs,
                              const pmix::NamespaceInfo& ns) {
  if (!pmix_) throw Error("no PMIx server on this node");
  prepare_pmix(ns, specs);
  spawned_ns_[number] = ns.nspace;
  launch(generation, number, ns.nspace, specs);
}

// Registers the namespace (with the processors of the workers that are bound); every worker's
// environment gets Open MPI's variables (unless the user set them) and what
// PMIx_server_setup_fork adds.
void NodeAgent::prepare_pmix(const pmix::NamespaceInfo& ns, std::vector<WorkerSpec>& specs) {
  pmix::NamespaceInfo here = ns;
  for (const auto& spec : specs)
    if (!spec.spawn.cpus.empty()) here.bound_cpus[spec.rank] = spec.spawn.cpus;
  pmix_->register_namespace(here);
  auto ompi = pmix::open_mpi_environment({ns.nspace, pmix_->tmpdir(),
                                          ns.universe_size > 0 ? ns.universe_size : ns.world_size,
                                          pmix_->shm_dir()});
  for (auto& spec : specs) {
    auto& env = spec.spawn.envp;
    std::unordered_map<std::string, size_t> at;  // a variable's name: its place in env
    for (size_t i = 0; i < env.size(); ++i) at.emplace(env[i].substr(0, env[i].find('=')), i);
    for (const auto& [k, v] : ompi)
      if (at.emplace(k, env.size()).second) env.push_back(k + "=" + v);  // the user's wins
    for (auto& var : pmix_->setup_fork(ns.nspace, spec.rank)) {
      auto [it, added] = at.emplace(var.substr(0, var.find('=')), env.size());
      if (added)
        env.push_back(std::move(var));
      else
        env[it->second] = std::move(var);
    }
  }
}

void NodeAgent::launch(int generation, int spawn, const std::string& nspace,
                       std::vector<WorkerSpec>& specs) {
  std::vector<std::unique_ptr<Worker>> ws;
  std::vector<const SpawnSpec*> to_start;
  for (auto& spec : specs) {
    auto w = std::make_unique<Worker>();
    for (const auto& e : spec.spawn.envp) {
      if (e.rfind(PYTORCH_EXEC_ENV_JOBID "=", 0) == 0) job_marker_ = e;
      if (e.rfind(PYTORCH_EXEC_ENV_GENERATION "=", 0) == 0) w->generation_marker = e;
    }
    w->rank = spec.rank;
    w->generation = generation;
    w->spawn = spawn;
    w->nspace = nspace;
    // This agent's mark: its orphan guard finds what the workers leave by it (orphan_guard.hpp).
    auto& env = spec.spawn.envp;
    env.erase(std::remove_if(env.begin(), env.end(),
                             [](const std::string& e) {
                               return e.rfind("PYTORCH_EXEC_AGENT=", 0) == 0 ||
                                      e.rfind("TORCHELASTIC_ERROR_FILE=", 0) == 0;
                             }),
              env.end());
    env.push_back(agent_marker_);
    // As torchrun: where torch's @record writes an uncaught exception (read in finish()).
    if (pmix_) {
      w->error_file = pmix_->tmpdir() + "/error." + std::to_string(generation) + "." +
                      std::to_string(spawn) + "." + std::to_string(spec.rank) + ".json";
      ::unlink(w->error_file.c_str());
      env.push_back("TORCHELASTIC_ERROR_FILE=" + w->error_file);
    }
    ws.push_back(std::move(w));
    to_start.push_back(&spec.spawn);
  }
  std::vector<ChildProcess> procs;
  std::exception_ptr failed = spawn_children(to_start, procs);
  // What started is a worker, also when a later start failed; the guard learns their process
  // groups at once (until then, the agent's mark in their environment is what it would find
  // them by).
  std::vector<pid_t> started;
  struct TellGuard {  // also when watching a rank's output throws
    OrphanGuard& guard;
    const std::vector<pid_t>& pids;
    ~TellGuard() { guard.watch(pids); }
  } tell{guard_, started};
  for (size_t i = 0; i < ws.size(); ++i) {
    if (procs[i].pid <= 0) continue;
    pid_t pid = procs[i].pid;
    started.push_back(pid);
    Worker& w = *workers_.emplace(pid, std::move(ws[i])).first->second;
    w.proc = std::move(procs[i]);
    logger("agent")->debug("generation {} {} rank {} started as pid {}", generation,
                           spawn ? "spawned job " + std::to_string(spawn) : std::string("job"),
                           w.rank, pid);
  }
  for (pid_t pid : started) {
    Worker& w = *workers_.at(pid);
    watch_output(w);
    if (stdin_ended_) drop_stdin(w);
  }
  if (failed) std::rethrow_exception(failed);
}

void NodeAgent::on_spawn(pmix::SpawnRequest req, pmix::SpawnDone done) {
  if (!spawn_handler_) return done("MPI_Comm_spawn is not supported here", "");
  spawn_handler_(std::move(req), std::move(done));
}

void NodeAgent::dmodex_request(const std::string& nspace, int rank, pmix::ModexDone done) {
  if (!pmix_) return done(-1, "");
  pmix_->dmodex_request(nspace, rank, std::move(done));
}

void NodeAgent::notify_failure(int generation, int spawn, int rank, int exit_code,
                               bool aborted) {
  if (!pmix_ || nspace_.empty() || generation != nspace_generation_) return;
  auto it = spawned_ns_.find(spawn);
  if (spawn && it == spawned_ns_.end()) return;
  const std::string& nspace = spawn ? it->second : nspace_;
  logger("agent")->info("{} rank {} failed: telling the local processes", nspace, rank);
  try {
    pmix_->notify_proc_failure(nspace, rank, exit_code, aborted);
  } catch (const Error& e) {
    logger("agent")->warn("{}", e.what());
  }
}

void NodeAgent::stop_spawned(int generation, int number) {
  for (auto& [pid, w] : workers_)
    if (w->spawn == number && w->generation == generation) {
      logger("agent")->info("spawned job {} rank {} (pid {}): stopped", number, w->rank, pid);
      kill_group(pid);
    }
}

void NodeAgent::signal_all(int sig) {
  for (auto& [pid, w] : workers_) {
    logger("agent")->debug("signal {} to process group {} (rank {})", sig, pid, w->rank);
    ::kill(-pid, sig);
  }
}

void NodeAgent::watch_output(Worker& w) {
  Worker* wp = &w;
  bool out = w.out_open && !output_paused_, err = w.err_open && !output_paused_;
  if (!out)
    w.out_ev = Event();
  else if (!w.out_ev)
    w.out_ev =
        loop_.watch_readable(w.proc.stdout_r.get(), [this, wp] { on_readable(*wp, Stream::Out); });
  if (!err)
    w.err_ev = Event();
  else if (!w.err_ev)
    w.err_ev =
        loop_.watch_readable(w.proc.stderr_r.get(), [this, wp] { on_readable(*wp, Stream::Err); });
}

void NodeAgent::pause_output(bool paused) {
  if (paused == output_paused_) return;
  output_paused_ = paused;
  logger("agent")->debug("{} reading the ranks' output", paused ? "pausing" : "resuming");
  for (auto& [pid, w] : workers_) watch_output(*w);
  for (auto& w : lingering_) watch_output(*w);
}

void NodeAgent::on_readable(Worker& w, Stream s) {
  char buf[65536];
  int fd = (s == Stream::Out ? w.proc.stdout_r : w.proc.stderr_r).get();
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n > 0) {
    LineBuffer& lb = s == Stream::Out ? w.out_buf : w.err_buf;
    std::string_view lines = lb.append(buf, static_cast<size_t>(n));
    if (!lines.empty()) output(w, s, lines);
    // Whole lines go on as they come, so that lines of several ranks do not mix; a partial one
    // (a prompt, a progress bar, a block of a program's buffered output) waits a little for its
    // rest: kPartialHold from its first bytes, however often more of it comes meanwhile.
    Event& hold = s == Stream::Out ? w.out_hold : w.err_hold;
    if (lb.empty()) {
      hold.disarm();
    } else if (!hold.pending() || !lines.empty()) {  // a new partial line began here
      Worker* wp = &w;
      if (!hold) hold = loop_.timer([this, wp, s] { flush_partial(*wp, s); });
      hold.arm(kPartialHold);
    }
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  // EOF (or an error): the stream is done even if the process is not.
  (s == Stream::Out ? w.out_open : w.err_open) = false;
  (s == Stream::Out ? w.out_ev : w.err_ev) = Event();
  if (!w.out_open && !w.err_open)  // an exited rank's streams, at their end: forgotten
    loop_.post([this, wp = &w] {
      lingering_.erase(std::remove_if(lingering_.begin(), lingering_.end(),
                                      [wp](const auto& l) { return l.get() == wp; }),
                       lingering_.end());
    });
}

void NodeAgent::flush_partial(Worker& w, Stream s) {
  std::string rest = (s == Stream::Out ? w.out_buf : w.err_buf).take_rest();
  if (!rest.empty()) output(w, s, rest);
}

NodeAgent::Worker* NodeAgent::find_rank(const std::string& nspace, int rank) {
  for (auto& [pid, w] : workers_)
    if (w->rank == rank && w->nspace == nspace) return w.get();
  return nullptr;
}

void NodeAgent::on_client_connected(const std::string& nspace, int rank) {
  logger("pmix")->info("upcall client_connected {}:{}", nspace, rank);
  if (Worker* w = find_rank(nspace, rank)) w->pmix_connected = true;
}

void NodeAgent::on_client_finalized(const std::string& nspace, int rank) {
  logger("pmix")->info("upcall client_finalized {}:{}", nspace, rank);
  if (Worker* w = find_rank(nspace, rank)) w->pmix_finalized = true;
}

void NodeAgent::on_abort(const std::string& nspace, int rank, int status, const std::string& msg) {
  logger("pmix")->info("upcall abort {}:{} status {}: {}", nspace, rank, status, msg);
  // A spawned process that aborts exits with the abort's status: its exit is reported, as an
  // abort.
  Worker* w = find_rank(nspace, rank);
  if (w && w->spawn == 0) listener_.on_abort(w->generation, rank, w->proc.pid, status, msg);
  if (w && w->spawn != 0) {
    w->aborted = true;
    w->abort_status = status;
    w->abort_message = msg.substr(0, kMaxWorkerError);
  }
}

void NodeAgent::on_sigchld() {
  for (;;) {
    siginfo_t info{};
    // Peek first: while the zombie exists its pid (= its process group id) cannot be reused,
    // so killing what it left in its group is safe.
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    // PMIx notices the process sent before it exited (its "finalized") were posted before the
    // exit that waitid just saw: run them now, for every exit, so that none is judged without
    // them (draining once before the loop missed ranks that exited while it ran).
    loop_.run_posted();
    pid_t pid = info.si_pid;
    if (workers_.count(pid)) kill_group(pid);  // stragglers in the rank's group
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) continue;
    if (workers_.count(pid))
      finish(pid, status);
    else
      end_strays();  // what it left came here as it exited (a rank's child, a stray's)
  }
}

// This process is the workers' subreaper (the constructor): a process that a rank started in a
// session of its own (setsid: a daemon), whose parent has exited, is its child now.  Those of
// this job (its job id in their environment) are killed once their generation has no rank left
// here: at a restart, or the end of the job, as the ranks' own process groups are.
size_t NodeAgent::end_strays() {
  if (job_marker_.empty()) return 0;
  size_t found = 0;
  std::set<std::string> live;  // the generations that still have a rank here
  for (const auto& [pid, w] : workers_) live.insert(w->generation_marker);
  for (pid_t pid : children()) {
    if (workers_.count(pid) || pid == guard_.pid()) continue;
    bool ours = false, alive = false;
    for (const std::string& var : environ_of(pid)) {
      ours = ours || var == job_marker_;
      alive = alive || live.count(var);
    }
    if (!ours || alive) continue;
    ++found;
    logger("agent")->info("killing pid {}: it outlived its rank in a session of its own", pid);
    // With what it started (its group; what left that comes here in turn, see on_sigchld).
    pid_t group = ::getpgid(pid);
    if (group > 1 && group != ::getpgrp() && !workers_.count(group)) kill_group(group);
    ::kill(pid, SIGKILL);  // reaped by on_sigchld (any child), or by ~NodeAgent
  }
  return found;
}

// This process's children, from /proc/self/task/*/children (a kernel built without
// CONFIG_PROC_CHILDREN lists none: strays are then left to init, as before subreaping).
std::vector<pid_t> NodeAgent::children() {
  std::vector<pid_t> out;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::istringstream f(read_file(std::string("/proc/self/task/") + e->d_name + "/children"));
      for (long pid; f >> pid;) out.push_back(static_cast<pid_t>(pid));
    }
    ::closedir(d);
  }
  return out;
}

void NodeAgent::finish(pid_t pid, int status) {
  auto node = workers_.extract(pid);
  Worker& w = *node.mapped();
  guard_.forget(pid);
  // Drain what the worker wrote before it exited, then a partial last line, as it is.
  for (Stream s : {Stream::Out, Stream::Err}) {
    int fd = (s == Stream::Out ? w.proc.stdout_r : w.proc.stderr_r).get();
    LineBuffer& lb = s == Stream::Out ? w.out_buf : w.err_buf;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) {
      std::string_view lines = lb.append(buf, static_cast<size_t>(n));
      if (!lines.empty()) output(w, s, lines);
    }
    // Not at its end (EAGAIN): a process the rank started in a session of its own, which lives
    // on until the node has no rank left, still writes to it; it is read on (lingering_).
    bool& open = s == Stream::Out ? w.out_open : w.err_open;
    open = open && n < 0 && errno == EAGAIN;
    if (!open) (s == Stream::Out ? w.out_ev : w.err_ev) = Event();
    flush_partial(w, s);
  }
  drop_stdin(w);
  WorkerExit e;
  e.rank = w.rank;
  e.pid = pid;
  e.generation = w.generation;
  e.spawn = w.spawn;
  e.status = status;
  e.exec_errno = w.proc.exec_errno;
  e.bind_failed = w.proc.bind_failed;
  e.pmix_unfinalized = w.pmix_connected && !w.pmix_finalized;
  if (!w.error_file.empty()) e.error = take_error_file(w.error_file).substr(0, kMaxWorkerError);
  e.aborted = w.aborted;
  e.abort_status = w.abort_status;
  e.abort_message = w.abort_message;
  logger("agent")->debug("rank {} (pid {}) {}", w.rank, pid, describe_wait_status(status));
  if (w.out_open || w.err_open) lingering_.push_back(std::move(node.mapped()));
  // Those of its generation, if that has no rank here any more (a stray of a generation that
  // still has one is kept; looking at every exit made 64 ranks' ends quadratic).
  if (std::none_of(workers_.begin(), workers_.end(), [&w](const auto& kv) {
        return kv.second->generation_marker == w.generation_marker;
      }))
    end_strays();
  listener_.on_exit(e);
}

void NodeAgent::output(const Worker& w, Stream s, std::string_view lines) {
  if (w.spawn == 0)
    listener_.on_output(w.generation, w.rank, s, lines);
  else
    listener_.on_spawned_output(w.generation, w.spawn, w.rank, s, lines);
}

void NodeAgent::stdin_write(int rank, std::string_view data) {
  for (auto& [pid, w] : workers_) {
    if (w->rank != rank || w->spawn || !w->proc.stdin_w.valid() || w->in_closing) continue;
    w->in_pending.append(data);
    stdin_backlog_ += data.size();
    flush_stdin(*w);
  }
}

void NodeAgent::stdin_close_all() {
  stdin_ended_ = true;
  for (auto& [pid, w] : workers_) {
    w->in_closing = true;
    if (w->in_pending.empty()) drop_stdin(*w);
  }
}

void NodeAgent::flush_stdin(Worker& w) {
  while (!w.in_pending.empty()) {
    ssize_t n = ::write(w.proc.stdin_w.get(), w.in_pending.data(), w.in_pending.size());
    if (n > 0) {
      w.in_pending.erase(0, static_cast<size_t>(n));
      stdin_backlog_ -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (!w.in_ev)
        w.in_ev = loop_.watch_writable(w.proc.stdin_w.get(), [this, &w] { on_stdin_writable(w); });
      return;
    }
    drop_stdin(w);  // EPIPE: the worker closed its stdin
    return;
  }
  w.in_ev = Event();
  if (w.in_closing) drop_stdin(w);
  if (stdin_backlog_ == 0) listener_.on_stdin_drained();
}

void NodeAgent::on_stdin_writable(Worker& w) { flush_stdin(w); }

void NodeAgent::drop_stdin(Worker& w) {
  bool had = !w.in_pending.empty();
  stdin_backlog_ -= w.in_pending.size();
  w.in_pending.clear();
  w.in_ev = Event();
  w.proc.stdin_w.reset();
  if (had && stdin_backlog_ == 0) listener_.on_stdin_drained();
}

}  // namespace pe
