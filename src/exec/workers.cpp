#include "exec/workers.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "common/log.hpp"
#include "common/net.hpp"
#include "common/unique_fd.hpp"

namespace pe {

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
  return ns;
}

bool oversubscribed_here(size_t local_ranks) {
  long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
  return ncpu > 0 && local_ranks > static_cast<size_t>(ncpu);
}

std::vector<WorkerSpec> node_worker_specs(const LaunchConfig& cfg, const EnvMap& env,
                                          const JobMap& map, int node, const NodePlan& plan,
                                          const GenerationInfo& gen, StdinHow stdin_how) {
  std::vector<WorkerSpec> specs;
  std::vector<std::string> argv{cfg.program_arg0};
  argv.insert(argv.end(), cfg.args.begin(), cfg.args.end());
  const auto& ranks = map.nodes.at(static_cast<size_t>(node)).ranks;
  for (size_t lr = 0; lr < ranks.size(); ++lr) {
    int rank = ranks[lr];
    WorkerSpec w;
    w.rank = rank;
    w.spawn.path = cfg.program;
    w.spawn.argv = argv;
    const auto& where = plan.ranks.at(lr);
    w.spawn.envp = to_envp(worker_environment(env, cfg.exports, map, rank, gen, locality_of(where)));
    w.spawn.cpus = where.os_cpus;
    w.spawn.wdir = cfg.wdir;
    bool gets_stdin = cfg.stdin_mode == StdinMode::All ||
                      (cfg.stdin_mode == StdinMode::OneRank && rank == cfg.stdin_rank);
    if (gets_stdin && stdin_how == StdinHow::Forward) w.spawn.stdin_pipe = true;
    if (gets_stdin && stdin_how == StdinHow::Direct) w.spawn.stdin_fd = 0;
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

LocalWorkers::LocalWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg,
                           const EnvMap& env, const JobMap& map, const std::string& job_id,
                           StdinHow stdin_how)
    : cfg_(cfg), env_(env), map_(map), stdin_how_(stdin_how), plan_(plan_node(cfg, map.world_size)) {
  if (cfg_.display_topology) {
    std::string t = topo::format_topology(*plan_.topology, plan_.analysis);
    write_all(1, t.data(), t.size());
  }
  if (cfg_.dry_run) return;
  agent_ = std::make_unique<NodeAgent>(loop, listener, &modex_, "pytorch_exec." + job_id,
                                       plan_.topology->raw());
}

LocalWorkers::~LocalWorkers() = default;

int LocalWorkers::master_port() { return find_free_port(master_addr()); }

std::string LocalWorkers::host_of_rank(int rank) const {
  return map_.nodes.at(static_cast<size_t>(map_.ranks.at(static_cast<size_t>(rank)).node)).host;
}

std::string LocalWorkers::format_map() const { return format_job_map(map_, {&plan_}); }

void LocalWorkers::start(const GenerationInfo& gen) {
  auto specs = node_worker_specs(cfg_, env_, map_, 0, plan_, gen, stdin_how_);
  // "All" on a file: every rank reads it from the start, through its own open file description.
  std::vector<UniqueFd> own_stdin;
  if (stdin_how_ == StdinHow::Direct && cfg_.stdin_mode == StdinMode::All) {
    for (auto& w : specs) {
      own_stdin.emplace_back(::open("/proc/self/fd/0", O_RDONLY | O_CLOEXEC));
      w.spawn.stdin_fd = own_stdin.back().get();
    }
  }
  if (cfg_.report_bindings) {
    std::string r = binding_report(map_, 0, plan_, gen.generation);
    write_all(2, r.data(), r.size());
  }
  auto ns = namespace_for(map_, 0, gen);
  agent_->start(gen.generation, std::move(specs), &ns);
}

}  // namespace pe
