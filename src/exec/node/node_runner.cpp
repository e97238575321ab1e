#include "exec/node/node_runner.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.hpp"
#include "common/net.hpp"
#include "common/unique_fd.hpp"

namespace pe {

NodeJob node_job_for(const LaunchConfig& cfg, const JobMap& map, const std::string& job_id,
                     int node, EnvMap env, bool replace_env, StdinHow stdin_how) {
  NodeJob j;
  j.job_id = job_id;
  j.node = node;
  j.map = map;
  j.tree_radix = cfg.tree_radix;
  j.verbosity = cfg.verbosity;
  j.program = cfg.program;
  j.program_arg0 = cfg.program_arg0;
  j.args = cfg.args;
  j.wdir = cfg.remote_wdir;
  j.exports = cfg.exports;
  j.prefix = cfg.prefix;
  j.env = std::move(env);
  j.replace_env = replace_env;
  j.placement = placement_for(cfg, map, node);
  j.report_bindings = cfg.report_bindings;
  j.oversubscribe = cfg.oversubscribe;
  j.stdin_mode = cfg.stdin_mode;
  j.stdin_rank = cfg.stdin_rank;
  j.stdin_how = stdin_how;
  j.stdout_tty = cfg.stdout_tty;
  j.tty_rows = cfg.tty_rows;
  j.tty_cols = cfg.tty_cols;
  return j;
}

std::string namespace_name(const std::string& job_id, int generation) {
  return "pytorch_exec." + job_id + "." + std::to_string(generation);
}

pmix::NamespaceInfo namespace_for(const JobMap& map, int node, const GenerationInfo& gen) {
  pmix::NamespaceInfo ns;
  ns.nspace = namespace_name(gen.job_id, gen.generation);
  ns.world_size = map.world_size;
  for (const auto& n : map.nodes) {
    ns.hosts.push_back(n.host);
    ns.node_ranks.push_back(n.ranks);
  }
  ns.this_node = node;
  ns.oversubscribed = gen.oversubscribed;
  // As mpirun: the universe is the allocation's slots (room for MPI_Comm_spawn), where they
  // are limited.
  int slots = 0;
  for (const auto& n : map.nodes) slots = n.slots > 0 && slots >= 0 ? slots + n.slots : -1;
  ns.universe_size = std::max(slots, map.world_size);
  return ns;
}

bool oversubscribed_here(size_t local_ranks) {
  long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
  return ncpu > 0 && local_ranks > static_cast<size_t>(ncpu);
}

namespace {

// A worker's stdout as the job asks (a pseudo-terminal or a pipe).
void set_stdout(const NodeJob& job, SpawnSpec& s) {
  s.stdout_tty = job.stdout_tty;
  s.tty_rows = static_cast<unsigned short>(job.tty_rows);
  s.tty_cols = static_cast<unsigned short>(job.tty_cols);
}

}  // namespace


std::vector<WorkerSpec> node_worker_specs(const NodeJob& job, const EnvMap& base,
                                          const NodePlan& plan, const GenerationInfo& gen) {
  std::vector<WorkerSpec> specs;
  std::vector<std::string> argv{job.program_arg0};
  argv.insert(argv.end(), job.args.begin(), job.args.end());
  const auto& ranks = job.map.nodes.at(static_cast<size_t>(job.node)).ranks;
  for (size_t lr = 0; lr < ranks.size(); ++lr) {
    int rank = ranks[lr];
    WorkerSpec w;
    w.rank = rank;
    w.spawn.path = job.program;
    w.spawn.argv = with_local_rank(argv, static_cast<int>(lr));
    const auto& where = plan.ranks.at(lr);
    w.spawn.envp =
        to_envp(worker_environment(base, job.exports, job.prefix, job.map, rank, gen, locality_of(where)));
    w.spawn.cpus = where.os_cpus;
    w.spawn.wdir = job.wdir;
    set_stdout(job, w.spawn);
    bool gets_stdin = job.stdin_mode == StdinMode::All ||
                      (job.stdin_mode == StdinMode::OneRank && rank == job.stdin_rank);
    if (gets_stdin && job.stdin_how == StdinHow::Forward) w.spawn.stdin_pipe = true;
    if (gets_stdin && job.stdin_how == StdinHow::Direct) w.spawn.stdin_fd = 0;
    specs.push_back(std::move(w));
  }
  return specs;
}

std::string binding_report(const JobMap& map, int node, const NodePlan& plan, int generation) {
  std::string out;
  const NodeMap& n = map.nodes.at(static_cast<size_t>(node));
  for (size_t lr = 0; lr < n.ranks.size(); ++lr)
    out += "pytorch_exec: generation " + std::to_string(generation) + " rank " +
           std::to_string(n.ranks[lr]) + " on " + n.host + ": " +
           topo::describe_placement(plan.ranks.at(lr)) + "\n";
  return out;
}

NodeRunner::NodeRunner(NodeJob job)
    : job_(std::move(job)),
      plan_(plan_node(
          job_.placement,
          static_cast<int>(job_.map.nodes.at(static_cast<size_t>(job_.node)).ranks.size()))) {}

NodeRunner::~NodeRunner() = default;

void NodeRunner::open(EventLoop& loop, AgentListener& listener, pmix::ModexRouter* router,
                      const std::string& server_nspace, EnvMap env) {
  env_ = std::move(env);
  agent_ =
      std::make_unique<NodeAgent>(loop, listener, router, server_nspace, plan_.topology->raw());
  agent_->on_spawn_request(
      [this](pmix::SpawnRequest req, pmix::SpawnDone done) { spawn_here(std::move(req), done); });
}

void NodeRunner::spawn_via(std::function<void(pmix::SpawnRequest, pmix::SpawnDone)> forward) {
  agent_->on_spawn_request([this, forward](pmix::SpawnRequest req, pmix::SpawnDone done) {
    try {
      resolve_spawn(req);
    } catch (const SpawnError& e) {
      return done(e.what(), "");
    }
    forward(std::move(req), std::move(done));
  });
}

void NodeRunner::resolve_spawn(pmix::SpawnRequest& req) const {
  auto path = env_.find("PATH");
  for (auto& app : req.apps) {
    if (app.cwd.empty()) app.cwd = job_.wdir;
    app.cmd = resolve_spawn_program(app.cmd, app.cwd, path == env_.end() ? "" : path->second);
  }
}

// A single-node job: this node is the whole job.
void NodeRunner::spawn_here(pmix::SpawnRequest req, pmix::SpawnDone done) {
  std::string who = "MPI_Comm_spawn from rank " + std::to_string(req.parent_rank);
  try {
    resolve_spawn(req);
    SpawnJob sj = plan_spawn(req, job_.map, {static_cast<int>(agent_->live())}, job_.oversubscribe);
    sj.generation = gen_.generation;
    sj.number = ++spawned_;
    sj.nspace = spawn_namespace(namespace_name(gen_.job_id, gen_.generation), sj.number);
    start_spawned(sj);
    done("", sj.nspace);
  } catch (const std::exception& e) {
    std::string line = "pytorch_exec: " + who + ": " + e.what() + "\n";
    write_all(2, line.data(), line.size());
    done(e.what(), "");
  }
}

void NodeRunner::start_spawned(const SpawnJob& sj) {
  const std::string& me = job_.map.nodes.at(static_cast<size_t>(job_.node)).host;
  pmix::NamespaceInfo ns;
  ns.nspace = sj.nspace;
  ns.world_size = sj.map.world_size;
  ns.this_node = -1;
  for (size_t i = 0; i < sj.map.nodes.size(); ++i) {
    ns.hosts.push_back(sj.map.nodes[i].host);
    ns.node_ranks.push_back(sj.map.nodes[i].ranks);
    if (sj.map.nodes[i].host == me) ns.this_node = static_cast<int>(i);
  }
  ns.universe_size = sj.universe_size;
  ns.parent_nspace = sj.parent_nspace;
  ns.parent_rank = sj.parent_rank;
  ns.appnum = sj.appnum;
  std::vector<WorkerSpec> specs;
  if (ns.this_node >= 0) {
    const auto& ranks = ns.node_ranks[static_cast<size_t>(ns.this_node)];
    // The programs were found on the asking node; this one may not have them.
    for (int rank : ranks)
      resolve_spawn_program(sj.apps.at(static_cast<size_t>(sj.appnum.at(static_cast<size_t>(rank)))).cmd, "", "");
    ns.oversubscribed = oversubscribed_here(agent_->live() + ranks.size());
    GenerationInfo gen = gen_;
    gen.oversubscribed = ns.oversubscribed;
    for (int rank : ranks) {
      const auto& app = sj.apps.at(static_cast<size_t>(sj.appnum.at(static_cast<size_t>(rank))));
      EnvMap base = env_;
      for (const auto& var : app.env) {
        auto eq = var.find('=');
        if (eq != std::string::npos) base[var.substr(0, eq)] = var.substr(eq + 1);
      }
      WorkerSpec w;
      w.rank = rank;
      w.spawn.path = app.cmd;
      w.spawn.argv = app.argv;
      w.spawn.envp = to_envp(worker_environment(base, job_.exports, job_.prefix, sj.map, rank, gen));
      w.spawn.wdir = app.cwd.empty() ? job_.wdir : app.cwd;
      set_stdout(job_, w.spawn);
      specs.push_back(std::move(w));
    }
  }
  agent_->start_spawned(gen_.generation, sj.number, std::move(specs), ns);
}

void NodeRunner::start_idle(GenerationInfo gen, const JobMap& map) {
  gen_ = gen;
  spawned_ = 0;
  auto ns = namespace_for(map, -1, gen);
  agent_->start(gen.generation, {}, &ns);
}

void NodeRunner::remap(JobMap map, int node) {
  size_t mine = job_.map.nodes.at(static_cast<size_t>(job_.node)).ranks.size();
  size_t now = map.nodes.at(static_cast<size_t>(node)).ranks.size();
  // Its host listed with other slots (elastic): its ranks are placed anew.
  if (now != mine) place_again(plan_, job_.placement, static_cast<int>(now));
  job_.map = std::move(map);
  job_.node = node;
}

void NodeRunner::start(GenerationInfo gen) {
  gen_ = gen;
  spawned_ = 0;
  const auto& ranks = job_.map.nodes.at(static_cast<size_t>(job_.node)).ranks;
  gen.oversubscribed = oversubscribed_here(ranks.size());
  auto specs = node_worker_specs(job_, env_, plan_, gen);
  // "All" from a file: every rank reads it from the start, through its own open file description.
  std::vector<UniqueFd> own_stdin;
  if (job_.stdin_how == StdinHow::Direct && job_.stdin_mode == StdinMode::All) {
    for (auto& w : specs) {
      own_stdin.emplace_back(::open("/proc/self/fd/0", O_RDONLY | O_CLOEXEC));
      w.spawn.stdin_fd = own_stdin.back().get();
    }
  }
  if (job_.report_bindings) {
    std::string r = binding_report(job_.map, job_.node, plan_, gen.generation);
    write_all(2, r.data(), r.size());
  }
  auto ns = namespace_for(job_.map, job_.node, gen);
  agent_->start(gen.generation, std::move(specs), &ns);
}

}  // namespace pe
