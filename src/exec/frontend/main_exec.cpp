// pytorch_exec: the front end.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include <pytorch_exec/version.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/cli.hpp"
#include "exec/frontend/direct_launch.hpp"
#include "exec/frontend/job.hpp"
#include "exec/frontend/node_sources.hpp"
#include "exec/node/node_plan.hpp"

extern char** environ;

namespace {

constexpr double kFirstDiscoveryTimeout = 30;  // seconds

int fail(const std::string& msg, int status) {
  std::fprintf(stderr, "pytorch_exec: %s\n", msg.c_str());
  return status;
}

// The job's first nodes: -H, --hostfile, else what --host-discovery prints now, else SLURM's or
// this machine.
pe::Allocation first_nodes(const pe::LaunchConfig& cfg, const pe::EnvMap& env,
                           const std::string& host) {
  if (cfg.host_discovery.empty() || !cfg.hosts.empty() || !cfg.hostfile.empty())
    return pe::find_allocation(cfg.hosts, cfg.hostfile, env, host);
  pe::Allocation a;
  a.source = "--host-discovery";
  a.limited = true;
  a.nodes = pe::run_discovery(cfg.host_discovery, kFirstDiscoveryTimeout);
  if (a.nodes.empty()) throw pe::UsageError("--host-discovery: the command printed no hosts");
  return a;
}

pe::JobMap make_map(const pe::LaunchConfig& cfg, const pe::EnvMap& env, const std::string& host) {
  pe::Allocation alloc = first_nodes(cfg, env, host);
  const pe::Allocation listed = alloc;  // hosts beyond an elastic job's nodes: for spawns
  if (cfg.nnodes_min > 0) {  // elastic: at least MIN of the allocation's nodes, at most MAX
    if (static_cast<int>(alloc.nodes.size()) < cfg.nnodes_min)
      throw pe::UsageError("--nnodes " + std::to_string(cfg.nnodes_min) + ":" +
                           std::to_string(cfg.nnodes_max) + " needs at least " +
                           std::to_string(cfg.nnodes_min) + " nodes; " + alloc.source + " has " +
                           std::to_string(alloc.nodes.size()));
    size_t most = static_cast<size_t>(cfg.nnodes_max) + static_cast<size_t>(cfg.spares);
    if (alloc.nodes.size() > most) alloc.nodes.resize(most);
  }
  if (!alloc.limited)
    return pe::map_single_node(alloc.nodes[0].host,
                               cfg.npernode > 0 && !cfg.np_given ? cfg.npernode : cfg.np);
  pe::MapRequest req;
  req.np = cfg.np_given ? cfg.np : 0;
  req.by_node = cfg.map_by == pe::topo::MapBy::Node;
  req.npernode = cfg.npernode;
  req.oversubscribe = cfg.oversubscribe;
  pe::JobMap map = pe::map_job(alloc, req);
  map.spawn_hosts = pe::hosts_without_ranks(listed, map);
  return map;
}

// --dry-run of a job on other nodes: their placement is shown when --topology-file describes them.
int print_dry_run(const pe::LaunchConfig& cfg, const pe::JobMap& map, const std::string& host) {
  std::vector<pe::NodePlan> plans;
  std::vector<const pe::NodePlan*> ptrs;
  for (const auto& node : map.nodes) {
    bool known = !cfg.topology_file.empty() || pe::is_local_host(node.host, host);
    plans.push_back(known
                        ? pe::plan_node(pe::placement_of(cfg), static_cast<int>(node.ranks.size()))
                        : pe::NodePlan{});
  }
  for (auto& p : plans) ptrs.push_back(p.topology ? &p : nullptr);
  std::cout << pe::format_job_map(map, ptrs);
  return 0;
}

int real_main(int argc, char** argv) {
  // hwloc (loaded by the PMIx server) need not load its X11/GL, OpenCL and libxml2 plugins in
  // this process; workers still see the environment as it was.
  const bool saved_blacklist = std::getenv("HWLOC_PLUGINS_BLACKLIST") != nullptr;
  ::setenv("HWLOC_PLUGINS_BLACKLIST", "hwloc_gl,hwloc_opencl,hwloc_xml_libxml", 0);
  pe::raise_fd_limit();
  pe::RawOptions raw = pe::parse_command_line(argc, argv);
  if (raw.help) {
    std::cout << pe::help_text();
    return 0;
  }
  if (raw.version) {
    std::cout << "pytorch_exec " << PYTORCH_EXEC_VERSION_STRING << "\n";
    return 0;
  }
  pe::ValidationContext ctx;
  ctx.env = pe::environment_from(environ);
  if (!saved_blacklist) ctx.env.erase("HWLOC_PLUGINS_BLACKLIST");
  long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
  ctx.default_np = ncpu > 0 ? static_cast<int>(ncpu) : 1;
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd)) ctx.cwd = cwd;
  ctx.find_program = !pe::is_step_task(ctx.env);  // a step task looks with the workers' PATH
  const pe::LaunchConfig cfg = pe::validate_options(raw, ctx);
  if (cfg.display_only) {
    pe::NodePlan plan = pe::plan_node(pe::placement_of(cfg), 0);
    std::cout << pe::topo::format_topology(*plan.topology, plan.analysis);
    return 0;
  }
  std::string host = pe::local_hostname();
  const char* spec = std::getenv("PYTORCH_EXEC_LOG");
  pe::init_logging(cfg.verbosity, spec ? spec : "", host);
  // A task of `srun --mpi=pmix ... pytorch_exec PROGRAM`: become that rank of the program.
  if (pe::is_step_task(ctx.env) && !cfg.dry_run)
    pe::direct_exec(cfg, ctx.env, pe::step_identity(ctx.env));
  pe::JobMap map = make_map(cfg, ctx.env, host);
  pe::check_stdin_rank(cfg, map.world_size);
  if (cfg.dry_run && (map.nodes.size() > 1 || !pe::is_local_host(map.nodes[0].host, host)))
    return print_dry_run(cfg, map, host);
  pe::WorkerSetSource workers = pe::workers_for(map, host, pe::NodeSources::wanted(cfg));
  pe::JobController job(cfg, std::move(ctx.env), std::move(map), std::move(workers));
  return job.run();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return real_main(argc, argv);
  } catch (const pe::UsageError& e) {
    return fail(std::string(e.what()) + " (see pytorch_exec --help)", 2);
  } catch (const pe::ProgramError& e) {
    return fail(e.what(), e.exit_status());
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  } catch (...) {
    return fail("unexpected internal error", 1);
  }
}
