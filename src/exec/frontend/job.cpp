#include "exec/frontend/job.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/ctrl/heartbeat.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/job_map.hpp"
#include "exec/frontend/remote_workers.hpp"

namespace pe {
namespace {

constexpr size_t kStdinBacklogLimit = 4u << 20;
constexpr double kAfterKillTimeout = 10.0;  // seconds to wait for SIGKILLed workers to be reaped
constexpr double kSuspendDelay = 0.05;  // seconds between SIGTSTP to other nodes and our stop
constexpr double kSigkillHold = 0.5;    // seconds a SIGKILLed rank of an elastic job waits for
                                        // its node's loss (held_)
constexpr size_t kTailLines = 10;
// The DataChannel job token of each generation: this many random bytes, in hex.
constexpr size_t kDcTokenBytes = 16;

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

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

Membership first_members(const LaunchConfig& cfg, const JobMap& map) {
  Membership m(MembershipSettings{cfg.nnodes_max, cfg.tree_radix, cfg.host_cooldown,
                                  cfg.nnodes_multiple});
  for (const auto& n : map.nodes) m.add_initial(n.host, static_cast<int>(n.ranks.size()));
  return m;
}

}  // namespace

JobController::JobController(LaunchConfig cfg, EnvMap env, JobMap map, WorkerSetSource workers)
    : cfg_(std::move(cfg)),
      env_(std::move(env)),
      source_(std::move(workers)),
      job_id_(random_job_id()),
      sink_(output_options(cfg_, cfg_.run_id.empty() ? job_id_ : cfg_.run_id), map.world_size),
      base_map_(std::move(map)),
      map_(base_map_),
      membership_(first_members(cfg_, base_map_)),
      members_(membership_.next_generation()) {}

JobController::~JobController() = default;

int JobController::run() {
  if (cfg_.master_port && !source_.local)
    throw UsageError("--master-port " + std::to_string(cfg_.master_port) +
                     " applies to a job on one machine (torchrun's one-node runs); across "
                     "nodes pytorch_exec chooses MASTER_PORT");
  if (!cfg_.dry_run) setup_stdin(source_.local);
  workers_ = source_.make(WorkerSetContext{
      loop_, *this, cfg_, env_, base_map_, job_id_, stdin_how_,
      [this](const std::string& h) { on_node_ready(h); },
      [this](const std::string& h, int slots, int node_rank) {
        return on_join(h, slots, node_rank);
      },
      [this](int generation) { on_running(generation); }});
  if (cfg_.display_map) std::cout << workers_->format_map() << std::flush;
  if (cfg_.dry_run) return 0;
  sink_.open_files();
  signals_ = std::make_unique<SignalPipe>(
      std::initializer_list<int>{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGTSTP,
                                 SIGCONT});
  // Ctrl-Z: the ranks (in process groups of their own, which the terminal does not stop) are
  // sent SIGTSTP, then pytorch_exec stops; a moment later on other nodes, so that the message
  // goes out first.  SIGCONT (fg, bg) goes on to them.
  suspend_timer_ = loop_.timer([] { ::raise(SIGSTOP); });
  time_limit_ = loop_.timer([this] { on_time_limit(); });
  if (cfg_.timeout > 0) {
    time_limit_.arm(cfg_.timeout);
    sink_.set_deadline(ctrl::Heartbeats::steady_seconds() + cfg_.timeout);  // a blocked output waits no longer
  }
  signal_event_ = loop_.watch_readable(signals_->fd(), [this] {
    for (int sig : signals_->take()) on_signal(sig);
  });
  sink_.while_blocked(cfg_.heartbeat_interval, [this] { workers_->keep_alive(); }, signals_->fd());
  sink_.when_closed([this](Stream s) { loop_.post([this, s] { on_output_closed(s); }); });
  ::signal(SIGPIPE, SIG_IGN);
  grace_timer_ = loop_.timer([this] {
    logger("exec")->info("kill grace of {} s is over: SIGKILL", cfg_.kill_grace);
    workers_->signal_all(SIGKILL);
    kill_timer_.arm(kAfterKillTimeout);
  });
  window_timer_ = loop_.timer([this] {
    if (state_ == State::Restarting || state_ == State::Failing) stop_workers(SIGTERM);
  });
  kill_timer_ = loop_.timer([this] {
    say("timed out waiting for " + std::to_string(workers_->live()) +
        " killed process(es) to exit; giving up");
    finish(state_ == State::Interrupted ? interrupt_status_ : exit_status_ ? exit_status_ : 1);
  });
  last_call_ = loop_.timer([this] {
    last_call_.disarm();
    on_last_call();
  });
  join_timer_ = loop_.timer([this] { on_join_timeout(); });
  hold_timer_ = loop_.timer([this] {
    std::optional<Failure> f = std::move(held_);
    held_.reset();
    if (f && state_ == State::Running) on_rank_failed(std::move(*f));
    if (workers_->live() == 0 && state_ != State::Running && state_ != State::Done)
      on_all_stopped();
  });
  wait_notice_ = loop_.timer([this] { on_wait_notice(); });
  if (cfg_.join_mode()) start_gathering();
  workers_->prepare([this] {
    if (state_ != State::Preparing) return;
    std::string late;
    for (int i = 0; i < static_cast<int>(membership_.size()); ++i) {
      if (workers_->node_ready(i)) {
        membership_.ready(i);
      } else if (membership_.node(i).state == Membership::State::Starting) {
        membership_.late(i);  // an elastic job's: it joins once ready, as an arrival
        late += (late.empty() ? "" : ", ") + membership_.node(i).host;
        if (first_arrival_ < 0) first_arrival_ = ctrl::Heartbeats::steady_seconds();
      }
    }
    if (!late.empty())
      say("starting without node(s) " + late + ", not ready yet: they join when they are");
    auto watch = [this] {  // the hostfile and the discovery command, from now on
      if (!NodeSources::wanted(cfg_) || state_ == State::Done || sources_) return;
      if (cfg_.hosts.empty())  // the first nodes came from the hostfile or the command
        for (const auto& n : base_map_.nodes) listed_.insert(n.host);
      sources_ = std::make_unique<NodeSources>(
          loop_, cfg_, [this](const std::vector<HostSlots>& h) { on_hosts(h); });
    };
    if (gathering_) {  // below MIN already (first nodes lost): the sources may bring more
      watch();
      return gather();
    }
    start_generation();
    watch();
  });
  if (state_ != State::Done) loop_.run();
  sink_.flush();
  sources_.reset();  // a discovery command still running is killed
  workers_->end_job(exit_status_);
  workers_.reset();  // stops daemons and reaps what is left before the status is returned
  return exit_status_;
}

void JobController::start_generation() {
  held_.reset();  // (of the generation before)
  hold_timer_.disarm();
  GenerationInfo gen;
  gen.job_id = job_id_;
  gen.run_id = cfg_.run_id;
  gen.role_name = cfg_.torch_logs.role;
  gen.generation = generation_;
  gen.restart_count = restarts_ + scale_events_;  // torchrun counts membership changes too
  gen.max_restarts = cfg_.max_restarts;
  std::vector<int> next = membership_.next_generation();
  bool whole = next.size() == base_map_.nodes.size();
  for (size_t i = 0; whole && i < next.size(); ++i) whole = next[i] == static_cast<int>(i);
  // By the nodes, not the slots: a lost node's slot may have another node now.
  if (!whole || !membership_.is_generation(next) || !resized_in(next).empty()) {
    // The first generation on all the job's nodes runs the job's map as it was made (--map-by
    // node places ranks round robin); a re-formed one numbers each node's ranks in turn.
    map_ = whole && generation_ == 0 ? base_map_ : reform_map(base_map_, next);
    workers_->use_map(map_);
  }
  for (int s : next) resized_.erase(membership_.node(s).host);
  membership_.set_generation(next);
  members_ = std::move(next);
  gen.master_addr = workers_->master_addr();
  gen.master_port = workers_->master_port();
  gen.agent_store = workers_->hosts_store();
  gen.dc_token = auth::to_hex(auth::random_bytes(kDcTokenBytes));
  state_ = State::Running;
  exited_ok_ = 0;
  failure_.reset();
  logger("exec")->info("generation {}: {} ranks on {} node(s), MASTER_ADDR={} MASTER_PORT={}",
                       generation_, map_.world_size, map_.nodes.size(), gen.master_addr,
                       gen.master_port);
  try {
    // Join mode: the nodes that joined print their own ranks' output; here, the host's node's
    // (the first of the job's map, when this generation has it).
    int printed = -1;
    if (cfg_.join_mode()) {
      printed = static_cast<int>(map_.nodes.size());
      for (size_t i = 0; i < map_.nodes.size(); ++i)
        if (map_.nodes[i].host == base_map_.nodes.at(0).host) printed = static_cast<int>(i);
    }
    sink_.start_generation(generation_, gen.restart_count, map_, printed);
    timeline_.reformed = ctrl::Heartbeats::steady_seconds();
    if (timeline_.detect < 0) timeline_.detect = timeline_.stopped = timeline_.reformed;
    workers_->start(gen);
    // The job's stdin ended in an earlier generation: this one's ends too (nodes that joined
    // since were not told).
    if (stdin_eof_) workers_->stdin_close_all();
    if (!workers_->reports_running()) on_running(generation_);
    if (workers_->stdin_backlog() == 0) on_stdin_drained();
  } catch (const Error& e) {
    say(std::string("cannot start the workers: ") + e.what());
    exit_status_ = 1;
    enter_failing();
    stop_workers(SIGTERM);
    if (workers_->live() == 0) on_all_stopped();
  }
}

// One line per generation: the times from the change that led to it (for the first one, from
// its start) to the old generation stopped, the new one started, and every worker running.
void JobController::on_running(int generation) {
  if (generation != generation_ || timeline_.detect < 0) return;
  double now = ctrl::Heartbeats::steady_seconds();
  auto ms = [this](double t) { return static_cast<long>((t - timeline_.detect) * 1000 + 0.5); };
  if (generation == 0)
    logger("exec")->info("generation 0: all workers running {} ms after its start", ms(now));
  else
    logger("exec")->info(
        "generation {} timeline: detected 0 ms -> stopped {} ms -> re-formed {} ms -> all "
        "workers running {} ms",
        generation, ms(timeline_.stopped), ms(timeline_.reformed), ms(now));
  timeline_ = Timeline{};
}

void JobController::say(const std::string& line) { sink_.message("pytorch_exec: " + line + "\n"); }

void JobController::on_output(int generation, int rank, Stream s, std::string_view lines) {
  sink_.write(generation, rank, s, lines);
}

void JobController::on_spawned_output(int generation, int spawn, int rank, Stream s,
                                      std::string_view lines) {
  sink_.write(generation, rank, s, lines, spawn);
}

void JobController::on_exit(const WorkerExit& e) {
  if (state_ == State::Running) {
    if (e.stopped || !is_failure(e.status, e.exec_errno, e.pmix_unfinalized)) {
      if (e.spawn == 0) ++exited_ok_;
      // Done when every rank has exited well and no spawned process (MPI_Comm_spawn) is left.
      if (exited_ok_ == map_.world_size && workers_->live() == 0) finish(0);
      return;
    }
    Failure f;
    f.rank = e.rank;
    f.spawn = e.spawn;
    f.pid = e.pid;
    f.host = e.spawn ? "" : workers_->host_of_rank(e.rank);
    f.status = e.status;
    f.exec_errno = e.exec_errno;
    f.bind_failed = e.bind_failed;
    f.program = cfg_.program;
    f.unfinalized = e.pmix_unfinalized;
    f.error = e.error;
    if (e.aborted) {  // a spawned process's MPI_Abort
      f.aborted = true;
      f.status = e.abort_status;
      f.abort_message = e.abort_message;
    }
    // (a job that may lose nodes and go on: --nnodes MIN:MAX with MAX > 1)
    if (cfg_.nnodes_max > 1 && !e.aborted && e.exec_errno == 0 && WIFSIGNALED(e.status) &&
        WTERMSIG(e.status) == SIGKILL && !f.host.empty()) {
      if (!held_) {
        held_ = std::move(f);
        hold_timer_.arm(kSigkillHold);
      }
      return;
    }
    on_rank_failed(take_held(std::move(f)));
  }
  if (workers_->live() == 0 && state_ != State::Running && state_ != State::Done) on_all_stopped();
}

void JobController::on_abort(int generation, int rank, pid_t pid, int status,
                             const std::string& msg) {
  if (state_ != State::Running || generation != generation_) return;
  Failure f;
  f.rank = rank;
  f.pid = pid;
  f.host = workers_->host_of_rank(rank);
  f.status = status;
  f.program = cfg_.program;
  f.aborted = true;
  f.abort_message = msg;
  on_rank_failed(take_held(std::move(f)));
}

// The failure to report: a held one (a SIGKILLed rank, held_) came first; `f` otherwise.
Failure JobController::take_held(Failure f) {
  if (!held_) return f;
  Failure first = std::move(*held_);
  held_.reset();
  hold_timer_.disarm();
  return first;
}

// The first failure of a generation: restart the group while the budget lasts (a program that
// cannot be executed or bound is not retried), else stop everything and report it.
void JobController::on_rank_failed(Failure f) {
  failure_ = std::move(f);
  timeline_ = Timeline{};
  timeline_.detect = ctrl::Heartbeats::steady_seconds();
  if (restarts_ < cfg_.max_restarts && failure_->exec_errno == 0) {
    say(describe_failure(*failure_) + "; restarting all " + std::to_string(map_.world_size) +
        " ranks (restart " + std::to_string(restarts_ + 1) + " of " +
        std::to_string(cfg_.max_restarts) + ")");
    state_ = State::Restarting;
  } else {
    enter_failing();
  }
  // The others hear of it (a PMIx event) and get --failure-window seconds before they stop.
  const Failure& failed = *failure_;
  bool aborted = failed.aborted || (failed.exec_errno == 0 && WIFSIGNALED(failed.status));
  workers_->notify_failure(generation_, failed.spawn, failed.rank, failure_exit_code(failed),
                           aborted);
  if (cfg_.failure_window > 0) {
    window_timer_.arm(cfg_.failure_window);
    return;
  }
  stop_workers(SIGTERM);
}

// A daemon could not be started or went away.  An elastic job (--nnodes MIN:MAX) stops every
// survivor and re-forms on the nodes that are left while at least MIN are; otherwise everything
// else is stopped and the job fails, naming the node.
void JobController::on_node_lost(const std::string& host, const std::string& why) {
  on_nodes_lost(host, why, {});
}

void JobController::on_nodes_lost(const std::string& host, const std::string& why,
                                  const std::vector<std::string>& below) {
  if (state_ == State::Done) return;
  // A rank of a lost node killed a moment before (held_): the node's loss, not its failure.
  if (held_ && (held_->host == host ||
                std::find(below.begin(), below.end(), held_->host) != below.end())) {
    held_.reset();
    hold_timer_.disarm();
  }
  // The nodes below a lost relay leave the membership first (those still in it), so that the
  // group re-forms once, on the nodes really left, and the report names them all.
  std::vector<std::string> gone;
  bool members_below = false, spawn_below = false, arriving_below = false;
  for (const auto& h : below) {
    int slot = membership_.find(h);
    if (slot < 0 || membership_.node(slot).state == Membership::State::Lost) continue;
    gone.push_back(h);
    arriving_below = arriving_below || arriving(slot);
    members_below = members_below || in_group(slot);
    spawn_below = spawn_below || spawn_only(h);
    take_out(h, slot);
  }
  std::string all = why;
  if (!gone.empty())
    all += "; and with it the node(s) below it in the control tree: " + join(gone, ", ");
  if (arriving_below) loop_.post([this] { on_last_call(); });  // none waits for them
  if (spawn_only(host) || spawn_below) {  // spawned processes are gone: a failure, no re-forming
    if (spawn_only(host))
      membership_.lost(membership_.find(host), ctrl::Heartbeats::steady_seconds());
    return fail_with_node(host, all);
  }
  std::string cannot;
  if (cfg_.nnodes_min > 0 && (cannot = reform_without(host, all, members_below)).empty()) return;
  fail_with_node(host, all);
  if (!cannot.empty()) say(cannot);
}

// In the group that runs, or is about to start.
bool JobController::in_group(int slot) const {
  return contains(state_ == State::Preparing ? membership_.next_generation() : members_, slot);
}

// A node that joins the running job and is not ready yet.
bool JobController::arriving(int slot) const {
  const Membership::Node& n = membership_.node(slot);
  return n.state == Membership::State::Starting && !n.initial;
}

// A lost node leaves the membership: kept out for its cool-down, or for good when it was taken
// out of the node source.
void JobController::take_out(const std::string& host, int slot) {
  if (host == retiring_) return membership_.retire(slot);
  double out = membership_.lost(slot, ctrl::Heartbeats::steady_seconds());
  logger("exec")->info("node {} is kept out for {} s (cool-down)", host, out);
}

// The node is there, its workers could not be started: no re-forming helps.
void JobController::on_start_failed(const std::string& host, const std::string& why) {
  if (state_ != State::Done) fail_with_node(host, why);
}

// "" when the job goes on without `host` (or already did), else why it cannot.
std::string JobController::reform_without(const std::string& host, const std::string& why,
                                          bool members_below) {
  int slot = membership_.find(host);
  if (slot < 0) return "";  // already gone
  bool member = members_below || in_group(slot);
  // A rank's failure just before (its peer went away) does not end an elastic job; a signal
  // or a failure of another kind does.
  if (state_ == State::Interrupted || (state_ == State::Failing && !failure_))
    return "the job is ending";
  if (gathering_ && state_ == State::Preparing &&
      !membership_.node(slot).initial) {  // join mode, before the first
                                                         // generation: the others wait on
    membership_.lost(slot, ctrl::Heartbeats::steady_seconds());
    say("node " + host + " left before the job started: " + why);
    loop_.post([this] { gather(); });
    return "";
  }
  bool arrives = arriving(slot);
  take_out(host, slot);
  if (!member) {  // a spare, or a node that had not joined yet: nothing to re-form
    say((arrives ? "arriving node " : "spare node ") + host + ": " + why);
    if (arrives) loop_.post([this] { on_last_call(); });  // the others need not wait for it
    return "";
  }
  int left = membership_.left();
  if (left < cfg_.nnodes_min && !gathering_) {
    std::string below = std::to_string(left) + " node(s) left, --nnodes needs at least " +
                        std::to_string(cfg_.nnodes_min);
    // Nothing can bring another node: a static list (-H, an allocation) without sources.
    if (!NodeSources::wanted(cfg_) && !cfg_.join_mode()) return below;
    const char* wait = state_ == State::Preparing ? ": waiting up to "
                                                  : ": stopping the others and waiting up to ";
    say("node " + host + ": " + why + "; " + below + wait + seconds_text(cfg_.join_timeout) +
        " s for more (--join-timeout)");
    gather_called_ = false;
    start_gathering();
  } else if (left < cfg_.nnodes_min) {
    return "";  // waiting for more already
  }
  if (cfg_.max_scale_events >= 0 && scale_events_ >= cfg_.max_scale_events)
    return "no scale events left (--max-scale-events " + std::to_string(cfg_.max_scale_events) +
           ")";
  bool spare = cfg_.nnodes_max > 0 && left >= cfg_.nnodes_max;  // one was idle before
  if (!gathering_)
    say("node " + host + ": " + why + "; " +
        (state_ == State::Preparing ? "starting" : "re-forming the group") + " on " +
        (spare ? std::to_string(cfg_.nnodes_max) + " node(s), a spare taking its place"
               : "the " + std::to_string(left) + " node(s) left"));
  if (state_ == State::Preparing) return "";  // starts without it once the others are ready
  if (state_ != State::Reforming) {  // a loss while re-forming keeps the first detection
    timeline_ = Timeline{};
    timeline_.detect = ctrl::Heartbeats::steady_seconds();
  }
  state_ = State::Reforming;  // a failure seen while it went down was the loss: not a restart
  failure_.reset();
  stop_workers(SIGTERM);
  if (workers_->live() == 0) on_all_stopped();
  return "";
}

// Hosts the node sources list: those not in the job, and not kept out, get a slot and a
// daemon; those listed before and no longer leave the job.
void JobController::on_hosts(const std::vector<HostSlots>& hosts) {
  if (state_ != State::Running && state_ != State::Restarting && state_ != State::Reforming &&
      !(state_ == State::Preparing && gathering_))
    return;
  std::set<std::string> now;
  for (const auto& h : hosts) now.insert(h.host);
  std::vector<std::string> gone;
  for (const auto& h : listed_)
    if (!now.count(h)) gone.push_back(h);
  listed_ = std::move(now);
  for (const auto& h : gone) on_unlisted(h);
  for (const auto& h : hosts) {
    if (resize(h.host, h.slots)) continue;
    int ranks = cfg_.npernode > 0 ? cfg_.npernode : h.slots;
    std::string why = admit(h.host, ranks, ranks, false);
    if (!why.empty()) say("node " + h.host + ": " + why);
  }
}

// A host of the job listed again: with other slots than it was listed with (and the ranks
// follow the slots: no -n, no -N), its node runs that many ranks from the next generation,
// which comes after a last call, as for an arrival.  False: not a node of the job.
bool JobController::resize(const std::string& host, int slots) {
  int slot = membership_.find(host);
  if (slot < 0 || membership_.node(slot).spawn_only) return false;
  NodeMap& node = base_map_.nodes.at(static_cast<size_t>(slot));
  if (node.slots == slots || cfg_.np_given || cfg_.npernode > 0) return true;
  logger("exec")->info("node {} is listed with {} slot(s) now (it had {}); last call {} s", host,
                       slots, node.slots, cfg_.last_call);
  set_node(base_map_, static_cast<size_t>(slot), host, slots);
  resized_.insert(host);
  if (first_arrival_ < 0) first_arrival_ = ctrl::Heartbeats::steady_seconds();
  if (!last_call_.pending()) last_call_.arm(cfg_.last_call);
  return true;
}

// The hosts of `slots` listed with other slots since the last generation ("" if none).
std::string JobController::resized_in(const std::vector<int>& slots) const {
  std::string hosts;
  for (int s : slots)
    if (resized_.count(membership_.node(s).host))
      hosts += (hosts.empty() ? "" : ", ") + membership_.node(s).host;
  return hosts;
}

// A host that its node source listed and no longer does leaves the job as a lost node does
// (the group re-forms without it, or the job fails below --nnodes MIN), with no cool-down: its
// daemon is stopped, and listed again it is admitted as any new host.
void JobController::on_unlisted(const std::string& host) {
  int slot = membership_.find(host);
  if (slot < 0 || membership_.node(slot).spawn_only) return;
  logger("exec")->info("node {} is no longer listed by its node source: it leaves the job", host);
  retiring_ = host;
  workers_->remove_node(slot, "no longer listed by its node source");
  retiring_.clear();
}

// A host of the job's list without ranks, for MPI_Comm_spawn: a node of its own (not a member
// of any generation) and a daemon.  "" when it is started (or starting), else why not.
std::string JobController::on_spawn_host(const std::string& host) {
  if (state_ != State::Running) return "the job is ending";
  auto it = std::find_if(base_map_.spawn_hosts.begin(), base_map_.spawn_hosts.end(),
                         [&host](const NodeMap& n) { return n.host == host; });
  if (it == base_map_.spawn_hosts.end()) return "not a host of the job's list";
  if (membership_.find(host) >= 0) return "";  // its daemon is starting
  std::string why = admit(host, 0, it->slots, true);
  if (why.empty() && membership_.find(host) < 0) return "no daemon could be started there";
  return why;
}

// Gives an offered host a slot and starts its daemon (RemoteWorkers::add_node); "" when it is
// starting or was in the job already, else the error (a host kept out is logged only).
std::string JobController::admit(const std::string& host, int ranks, int slots, bool spawn_only,
                                 long order, std::string* kept_out) {
  Membership::Offer o =
      membership_.offer(host, ranks, ctrl::Heartbeats::steady_seconds(), spawn_only, order);
  if (o.slot < 0) {
    // Once per host: a host refused for want of room is said (the user can raise --tree-radix);
    // a cool-down is logged (-v).
    if (!o.why.empty() && kept_out_[host].empty())
      logger("exec")->log(o.full ? spdlog::level::warn : spdlog::level::info, "node {}: {}", host,
                          kept_out_[host] = o.why);
    if (kept_out) *kept_out = o.why;
    return spawn_only ? o.why : "";
  }
  kept_out_.erase(host);
  if (spawn_only) {
    logger("exec")->info("node {}: starting its daemon for spawned processes", host);
  } else {
    logger("exec")->info("node {} arrives with {} rank(s): starting its daemon; last call {} s",
                         host, ranks, cfg_.last_call);
    if (first_arrival_ < 0) first_arrival_ = ctrl::Heartbeats::steady_seconds();
    if (!last_call_.pending()) last_call_.arm(cfg_.last_call);
  }
  set_node(base_map_, static_cast<size_t>(o.slot), host, ranks);
  base_map_.nodes[static_cast<size_t>(o.slot)].slots = slots;
  try {
    workers_->add_node(o.slot);
  } catch (const Error& e) {
    membership_.lost(o.slot, ctrl::Heartbeats::steady_seconds());
    return e.what();
  }
  return "";
}

// Join mode: a node that started by itself asks to join; it is an arrival like any other (a last
// call, MAX, spares, cool-downs), but for its fixed place under a static rendezvous.
ctrl::Verdict JobController::on_join(const std::string& host, int slots, int node_rank) {
  if (state_ == State::Done || state_ == State::Failing || state_ == State::Interrupted)
    return {"the job is ending"};
  if (slots < 1) return {"a node must bring at least one rank (--nproc-per-node)"};
  long order = -1;
  if (cfg_.rdzv_static) {
    if (node_rank < 1 || node_rank >= cfg_.nnodes_max)
      return {"static rendezvous: --node-rank must be 1.." + std::to_string(cfg_.nnodes_max - 1) +
              " (node 0 hosts the job)"};
    for (size_t s = 0; s < membership_.size(); ++s)
      if (membership_.node(static_cast<int>(s)).state != Membership::State::Lost &&
          membership_.node(static_cast<int>(s)).order == node_rank)
        return {"node rank " + std::to_string(node_rank) + " is taken by " +
                membership_.node(static_cast<int>(s)).host};
    order = node_rank;
  }
  if (membership_.find(host) >= 0) return {"node '" + host + "' is in the job already"};
  std::string kept_out;
  std::string why = admit(host, slots, slots, false, order, &kept_out);
  if (!kept_out.empty()) return {kept_out, true};
  if (!why.empty()) return {why};
  logger("exec")->info("node {} joins with {} rank(s)", host, slots);
  return {};
}

// Join mode, before the first generation: it starts once MIN nodes are there and the last call
// (armed by the first arrival, or once MIN are there) is over, at once with MAX nodes; within
// the join timeout.
void JobController::gather() {
  if (!gathering_) return;
  bool reforming = state_ == State::Reforming;  // below MIN after a loss, the others stopped
  if (!(state_ == State::Preparing || (reforming && workers_->live() == 0))) return;
  int have = membership_.left();
  bool full = have >= cfg_.nnodes_max;
  if (have >= cfg_.nnodes_min && !full && !gather_called_) {  // torchrun's last call
    gather_called_ = true;
    if (!last_call_.pending()) last_call_.arm(cfg_.last_call);
  }
  if (have < cfg_.nnodes_min || membership_.starting() > 0 || (last_call_.pending() && !full)) {
    logger("exec")->info("waiting for nodes: {} of at least {} (at most {})", have,
                         cfg_.nnodes_min, cfg_.nnodes_max);
    return;
  }
  gathering_ = false;
  join_timer_.disarm();
  last_call_.disarm();
  first_arrival_ = -1;  // the arrivals so far are in the (next) generation
  if (!reforming) {
    say(cfg_.join_mode() ? "rendezvous " + cfg_.rdzv_id + " complete: " + std::to_string(have) +
                               " node(s)"
                         : std::to_string(have) + " node(s) ready: starting");
    start_generation();
    return;
  }
  say("re-forming the group on " + std::to_string(std::min(have, cfg_.nnodes_max)) + " node(s)");
  next_generation();
}

// The group stopped for a restart (a failure) or a re-forming (membership): the next generation.
void JobController::next_generation() {
  ++(state_ == State::Restarting ? restarts_ : scale_events_);
  ++generation_;
  sink_.clear_tails();
  start_generation();
}

void JobController::start_gathering() {
  gathering_ = true;
  join_timer_.arm(cfg_.join_timeout);
  gather_deadline_ = ctrl::Heartbeats::steady_seconds() + cfg_.join_timeout;
  if (cfg_.join_timeout > kWaitNotice) wait_notice_.arm(kWaitNotice);
}

void JobController::on_wait_notice() {
  if (!gathering_ || (state_ != State::Preparing && state_ != State::Reforming)) return;
  double left = gather_deadline_ - ctrl::Heartbeats::steady_seconds();
  if (left < 1) return;
  say("waiting for nodes: " + std::to_string(membership_.left()) + " of at least " +
      std::to_string(cfg_.nnodes_min) + " here" +
      (cfg_.join_mode() ? " (rendezvous " + (cfg_.rdzv_id == "none" ? "" : cfg_.rdzv_id + " ") +
                              "at " + cfg_.rdzv_host + ":" + std::to_string(cfg_.rdzv_port) + ")"
                        : std::string()) +
      "; giving up in " + std::to_string(static_cast<long>(left + 0.5)) + " s (--join-timeout)");
  if (left > kWaitNoticeEvery) wait_notice_.arm(kWaitNoticeEvery);
}

void JobController::on_join_timeout() {
  if (!gathering_ || (state_ != State::Preparing && state_ != State::Reforming)) return;
  gathering_ = false;
  say("only " + std::to_string(membership_.left()) + " of at least " +
      std::to_string(cfg_.nnodes_min) + " node(s) " +
      (state_ == State::Preparing ? "joined" : "left or arrived") + " within the join timeout of " +
      seconds_text(cfg_.join_timeout) + " s (--join-timeout)");
  exit_status_ = 1;
  enter_failing();
  stop_workers(SIGTERM);
  if (workers_->live() == 0) on_all_stopped();
}

// Before any of its processes ran: its spawns fail (SpawnRelay says why), the job goes on.
void JobController::on_spawn_host_lost(const std::string& host, const std::string& why) {
  logger("exec")->info("node {} (for spawned processes) lost: {}", host, why);
  if (spawn_only(host))
    membership_.lost(membership_.find(host), ctrl::Heartbeats::steady_seconds());
}

bool JobController::spawn_only(const std::string& host) const {
  int slot = membership_.find(host);
  return slot >= 0 && membership_.node(slot).spawn_only;
}

// A new node's daemon is ready: it joins when the last call is over (others may come
// meanwhile), at the next generation if one is starting anyway, or waits as a spare.
void JobController::on_node_ready(const std::string& host) {
  int slot = membership_.find(host);
  if (slot < 0) return;
  membership_.ready(slot);
  // From the loop, not from inside the workers' report of the node (it is not done with it).
  if (gathering_) return loop_.post([this] { gather(); });
  if (membership_.node(slot).spawn_only) {
    logger("exec")->info("node {} is ready for spawned processes", host);
    return;
  }
  if (!contains(membership_.next_generation(), slot))
    logger("exec")->info("node {} is ready: it waits as a spare ({} nodes in use)", host,
                         members_.size());
  else if (state_ != State::Running)
    logger("exec")->info("node {} is ready: it joins the next generation", host);
  else if (last_call_.pending())
    logger("exec")->info("node {} is ready: it joins when the last call is over", host);
  else
    logger("exec")->info("node {} is ready: the last call is over", host);
  // With MAX nodes ready no other can join this generation: the last call ends now (as
  // torchrun's rendezvous completes at its max_nodes).
  if (state_ == State::Running && last_call_.pending() && membership_.starting() == 0 &&
      static_cast<int>(membership_.next_generation().size()) >= cfg_.nnodes_max) {
    logger("exec")->info("{} node(s) ready, --nnodes MAX: the last call ends now", cfg_.nnodes_max);
    last_call_.disarm();
  }
  // The last call may have ended waiting for this node to start (a spare too): the others join.
  if (state_ == State::Running && !last_call_.pending()) on_last_call();
}

// The last call (--last-call after the first arrival) is over: the arrivals that are ready join
// in one re-forming, once every arrival still starting is ready or lost.
void JobController::on_last_call() {
  if (gathering_) return gather();
  if (state_ != State::Running || last_call_.pending()) return;
  std::vector<int> next = membership_.next_generation();
  std::string resized = resized_in(next);
  if (next == members_ && resized.empty()) return;
  if (int n = membership_.starting()) {
    logger("exec")->info("last call over: waiting for {} more node(s) to start", n);
    return;
  }
  std::string names;
  for (int s : next)
    if (!contains(members_, s)) names += (names.empty() ? "" : ", ") + membership_.node(s).host;
  for (size_t s = 0; s < membership_.size(); ++s)
    if (membership_.node(static_cast<int>(s)).state == Membership::State::Ready &&
        !contains(next, static_cast<int>(s)))
      logger("exec")->info("node {} waits as a spare", membership_.node(static_cast<int>(s)).host);
  std::string what = names.empty() ? "" : "node(s) " + names + " joined; ";
  if (!resized.empty()) what += "node(s) " + resized + " listed with other slots; ";
  if (cfg_.max_scale_events >= 0 && scale_events_ >= cfg_.max_scale_events) {
    say(what + "not re-forming: no scale events left (--max-scale-events " +
        std::to_string(cfg_.max_scale_events) + ")");
    return;
  }
  say(what + "re-forming the group on " + std::to_string(next.size()) + " node(s)");
  timeline_ = Timeline{};
  timeline_.detect = first_arrival_ >= 0 ? first_arrival_ : ctrl::Heartbeats::steady_seconds();
  first_arrival_ = -1;
  state_ = State::Reforming;
  failure_.reset();
  stop_workers(SIGTERM);
  if (workers_->live() == 0) on_all_stopped();
}

void JobController::fail_with_node(const std::string& host, const std::string& why) {
  say("node " + host + ": " + why);
  if (!exit_status_) exit_status_ = 1;
  failure_.reset();
  if (state_ == State::Preparing) {
    finish(exit_status_);
    return;
  }
  enter_failing();
  stop_workers(SIGTERM);
  if (workers_->live() == 0) on_all_stopped();
}

void JobController::stop_workers(int sig) {
  window_timer_.disarm();
  workers_->signal_all(sig);
  if (workers_->live() > 0 && !grace_timer_.pending() && !kill_timer_.pending())
    grace_timer_.arm(cfg_.kill_grace);
}

void JobController::on_all_stopped() {
  window_timer_.disarm();
  grace_timer_.disarm();
  kill_timer_.disarm();
  switch (state_) {
    case State::Restarting:
    case State::Reforming:
      timeline_.stopped = ctrl::Heartbeats::steady_seconds();
      if (gathering_) return gather();  // below MIN: the group re-forms when more are there
      return next_generation();
    case State::Failing:
      if (failure_) {
        std::string report = failure_report(
            *failure_, failure_->spawn ? std::vector<std::string>{}
                                       : sink_.stderr_tail(failure_->rank, kTailLines));
        sink_.message(report);
        if (restarts_ > 0 && restarts_ == cfg_.max_restarts)
          say("no restarts left (" + std::to_string(restarts_) + " used)");
        finish(failure_exit_code(*failure_));
      } else {
        finish(exit_status_ ? exit_status_ : 1);
      }
      return;
    case State::Interrupted:
      finish(interrupt_status_);
      return;
    default:
      return;
  }
}

namespace {

// "'s 4 processes", "'s 1 process", "" (none): what a stop reaches, after "stopping the job".
std::string job_processes(size_t live) {
  if (!live) return "";
  return "'s " + std::to_string(live) + (live == 1 ? " process" : " processes");
}

}  // namespace

// --timeout: the job's time is up, whatever it is doing (gathering nodes, running, restarting).
// A job that is already failing ends as it would have; only a --failure-window still running
// is cut short.
void JobController::on_time_limit() {
  if (state_ == State::Failing && window_timer_.pending()) {
    say("the job's time limit of " + seconds_text(cfg_.timeout) + " s was reached (" +
        cfg_.timeout_from + ") during the --failure-window: stopping the job" +
        job_processes(workers_->live()));
    sink_.set_deadline(0);
    stop_workers(SIGTERM);
    return;
  }
  if (state_ == State::Done || state_ == State::Interrupted || state_ == State::Failing) return;
  size_t live = workers_->live();
  say("the job's time limit of " + seconds_text(cfg_.timeout) + " s was reached (" +
      cfg_.timeout_from + "): stopping the job" +
      job_processes(live));
  sink_.set_deadline(0);
  interrupt(SIGTERM, SIGTERM, kTimeLimitStatus);
}

void JobController::on_signal(int sig) {
  if (sig == SIGUSR1 || sig == SIGUSR2 || sig == SIGCONT) {
    workers_->signal_all(sig);
    return;
  }
  if (sig == SIGTSTP) {
    if (state_ == State::Done || state_ == State::Interrupted) return;
    logger("exec")->info("SIGTSTP: stopping {} processes, then pytorch_exec", workers_->live());
    workers_->signal_all(SIGTSTP);
    suspend_timer_.arm(source_.local ? 0 : kSuspendDelay);
    return;
  }
  if (state_ == State::Done) return;
  if (state_ == State::Interrupted) {
    say("second signal: killing all processes now");
    grace_timer_.disarm();
    workers_->signal_all(SIGKILL);
    if (!kill_timer_.pending()) kill_timer_.arm(kAfterKillTimeout);
    return;
  }
  // One line, so that the job's end says why (other nodes of a join-mode job point here).
  size_t live = workers_->live();
  say("signal " + std::to_string(sig) + " (" + ::strsignal(sig) + "): stopping the job" +
      job_processes(live));
  interrupt(sig, sig);
}

// The job ends with a failure once its ranks are stopped; its output no longer holds it up.
void JobController::enter_failing() {
  state_ = State::Failing;
  sink_.stop_waiting();
}

// The ranks are sent `send`; once they are gone, pytorch_exec exits with `status` (-1: 128 +
// `sig`).
void JobController::interrupt(int sig, int send, int status) {
  sink_.stop_waiting();
  interrupt_status_ = status >= 0 ? status : 128 + sig;
  state_ = State::Interrupted;
  grace_timer_.disarm();
  stop_workers(send);
  if (workers_->live() == 0) on_all_stopped();
}

// Nobody reads the job's output any more (`pytorch_exec ... | head`): the job ends as a shell
// pipeline's writer does on SIGPIPE (exit 141), its ranks stopped with SIGTERM, as Open MPI's
// mpirun aborts the job.  A job that is already stopping goes on as it was.
void JobController::on_output_closed(Stream s) {
  if (state_ == State::Done || state_ == State::Interrupted || state_ == State::Failing) return;
  say(std::string("the standard ") + (s == Stream::Out ? "output" : "error") +
      " of the job was closed (broken pipe): stopping the job");
  interrupt(SIGPIPE, SIGTERM);
}

void JobController::finish(int status) {
  exit_status_ = status;
  state_ = State::Done;
  stdin_event_ = Event();
  loop_.stop();
}

void JobController::setup_stdin(bool local) {
  if (cfg_.stdin_mode == StdinMode::None) return;
  struct stat st;
  if (::fstat(0, &st) != 0) return;                           // closed: /dev/null
  if (S_ISCHR(st.st_mode) && !::isatty(0) && !local) return;  // /dev/null and the like
  if (S_ISREG(st.st_mode) && !local) {
    stdin_how_ = StdinHow::Forward;  // a file cannot be polled: read it piece by piece
    stdin_file_ = true;
    loop_.post([this] { on_stdin_readable(); });
    return;
  }
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
  if (state_ == State::Preparing) {  // nobody to give it to yet: resumed by start_generation
    stdin_event_.disarm();
    stdin_paused_ = true;
    return;
  }
  char buf[65536];
  ssize_t n = ::read(0, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    stdin_eof_ = true;
    stdin_event_ = Event();
    workers_->stdin_close_all();
    return;
  }
  std::string_view data(buf, static_cast<size_t>(n));
  if (cfg_.stdin_mode == StdinMode::All) {
    for (int r = 0; r < map_.world_size; ++r) workers_->stdin_write(r, data);
  } else {
    workers_->stdin_write(cfg_.stdin_rank, data);
  }
  if (workers_->stdin_backlog() > kStdinBacklogLimit) {
    stdin_event_.disarm();
    stdin_paused_ = true;
  } else if (stdin_file_) {
    loop_.post([this] {
      if (!stdin_eof_ && state_ != State::Done) on_stdin_readable();
    });
  }
}

void JobController::on_stdin_drained() {
  if (stdin_how_ != StdinHow::Forward || stdin_eof_ || !stdin_paused_) return;
  stdin_paused_ = false;
  if (stdin_file_)
    loop_.post([this] {
      if (!stdin_eof_ && state_ != State::Done) on_stdin_readable();
    });
  else
    stdin_event_ = loop_.watch_readable(0, [this] { on_stdin_readable(); });
}

}  // namespace pe
