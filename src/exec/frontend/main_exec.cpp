// pytorch_exec: the front end.
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <cstdio>
#include <iostream>
#include <optional>
#include <random>

#include <pytorch_exec/version.h>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/ctrl/messages.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/cli.hpp"
#include "exec/daemon/daemon.hpp"
#include "exec/frontend/direct_launch.hpp"
#include "exec/frontend/job.hpp"
#include "exec/frontend/node_sources.hpp"
#include "exec/node/node_plan.hpp"
#include "pmix_rdzv/pmix_server.hpp"

extern char** environ;

namespace {

constexpr double kFirstDiscoveryTimeout = 30;  // seconds
// Appended to a usage error found after the options were validated (environment_note).
std::string g_usage_note;

int fail(const std::string& msg, int status) {
  std::fprintf(stderr, "pytorch_exec: %s\n", msg.c_str());
  return status;
}

// The job's first nodes: -H, --hostfile, else what --host-discovery prints now, else SLURM's or
// this machine.
pe::Allocation first_nodes(const pe::LaunchConfig& cfg, const pe::EnvMap& env,
                           const std::string& host) {
  if (cfg.host_discovery.empty() || !cfg.hosts.empty() || !cfg.hostfile.empty())
    return pe::find_allocation(cfg.hosts, cfg.hostfile, env, host, cfg.hostfile_option);
  pe::Allocation a;
  a.source = "--host-discovery";
  a.limited = true;
  a.nodes = pe::run_discovery(cfg.host_discovery, kFirstDiscoveryTimeout);  // none: make_map waits
  return a;
}

pe::JobMap make_map(const pe::LaunchConfig& cfg, const pe::EnvMap& env, const std::string& host) {
  pe::Allocation alloc = first_nodes(cfg, env, host);
  if (!cfg.rankfile.empty())  // its hosts are the nodes where no list gives them
    alloc = pe::rankfile_allocation(std::move(alloc), cfg.rankfile, cfg.rankfile_name, host);
  bool sources = cfg.nnodes_min > 0 && cfg.hosts.empty() && pe::NodeSources::wanted(cfg);
  if (cfg.nolocal) alloc = pe::without_local_host(std::move(alloc), host, sources);
  // An elastic job's hostfile or discovery command may list more later: it waits for them, as
  // torchrun does.
  if (sources && static_cast<int>(alloc.nodes.size()) < cfg.nnodes_min && !cfg.dry_run)
    alloc.nodes = pe::wait_for_hosts(cfg, alloc.source, alloc.nodes.size());
  if (cfg.display_allocation) std::cout << pe::format_allocation(alloc) << std::flush;
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
  if (!cfg.rankfile.empty()) {
    pe::JobMap map = pe::map_rankfile(alloc, cfg.rankfile, cfg.rankfile_name, host);
    map.spawn_hosts = pe::hosts_without_ranks(listed, map);
    return map;
  }
  if (!alloc.limited) {
    if (cfg.npernode > 0 && cfg.np_given && cfg.np > cfg.npernode)
      throw pe::UsageError("-n " + std::to_string(cfg.np) + " with -N " +
                           std::to_string(cfg.npernode) + " needs " +
                           std::to_string((cfg.np + cfg.npernode - 1) / cfg.npernode) +
                           " nodes; " + alloc.source + " is one");
    return pe::map_single_node(alloc.nodes[0].host,
                               cfg.npernode > 0 && !cfg.np_given ? cfg.npernode : cfg.np);
  }
  pe::MapRequest req;
  req.np = cfg.np_given ? cfg.np : 0;
  req.by_node = cfg.map_by == pe::topo::MapBy::Node;
  req.npernode = cfg.npernode;
  req.npernode_option = cfg.per_node_option;
  req.oversubscribe = cfg.oversubscribe;
  pe::JobMap map = pe::map_job(alloc, req);
  map.spawn_hosts = pe::hosts_without_ranks(listed, map);
  return map;
}

// --dry-run of a job on other nodes: their placement is shown when --topology-file describes them.
int print_dry_run(const pe::LaunchConfig& cfg, const pe::JobMap& map, const std::string& host) {
  std::vector<pe::NodePlan> plans;
  std::vector<const pe::NodePlan*> ptrs;
  for (size_t i = 0; i < map.nodes.size(); ++i) {
    const auto& node = map.nodes[i];
    bool known = !cfg.topology_file.empty() || pe::is_local_host(node.host, host);
    plans.push_back(known ? pe::plan_node(pe::placement_for(cfg, map, static_cast<int>(i)),
                                          static_cast<int>(node.ranks.size()))
                          : pe::NodePlan{});
  }
  for (auto& p : plans) ptrs.push_back(p.topology ? &p : nullptr);
  std::cout << pe::format_job_map(map, ptrs);
  return 0;
}

// Join mode, the endpoint on this machine: the rendezvous port, claimed (a socket listening
// there, kept for the front end's control plane, so that of two pytorch_exec started together
// exactly one hosts), or nothing when another listens there (the rendezvous host: this one
// joins).  Two started in the same instant can both bind (SO_REUSEADDR) and then both fail to
// listen: as long as nobody listens, each tries again after a random pause (up to ~2 s; then it
// joins, a port held by some other program).  An invalid socket when the port cannot be bound
// for another reason (the front end's own bind says why).
std::optional<pe::UniqueFd> claim_port(int port) {
  std::minstd_rand rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(port));
  for (int attempt = 0;; ++attempt) {
    try {
      return pe::listen_tcp("0.0.0.0", port, nullptr);
    } catch (const pe::SystemError& e) {
      if (e.code() != EADDRINUSE) return pe::UniqueFd();
    }
    if (attempt == 100 || pe::port_has_listener(port)) return std::nullopt;
    ::usleep(static_cast<useconds_t>(2000 + rng() % 20000));
  }
}

// Join mode: whether HOST of the endpoint is this machine (one of its IPv4 addresses, or
// loopback).  A name that does not resolve is not.
bool endpoint_is_here(const std::string& host) {
  struct addrinfo hints {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  std::vector<std::string> mine = pe::local_ipv4_addresses();
  bool here = false;
  for (auto* a = res; a && !here; a = a->ai_next) {
    char buf[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<struct sockaddr_in*>(a->ai_addr);
    if (!::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf)) continue;
    std::string addr = buf;
    here = addr.rfind("127.", 0) == 0 || std::find(mine.begin(), mine.end(), addr) != mine.end();
  }
  ::freeaddrinfo(res);
  return here;
}

// Join mode's key: from --rdzv-secret-file, else PYTORCH_EXEC_RDZV_SECRET (removed from the
// environment at once: workers never see it), else none (--rdzv-insecure, with a warning).
std::string join_key(const pe::LaunchConfig& cfg, pe::EnvMap& env) {
  std::string secret;
  if (const char* s = std::getenv(pe::kRdzvSecretVariable)) {
    secret = s;
    std::memset(const_cast<char*>(s), 0, secret.size());
    ::unsetenv(pe::kRdzvSecretVariable);
  }
  env.erase(pe::kRdzvSecretVariable);
  if (!cfg.rdzv_secret_file.empty()) secret = pe::auth::secret_from_file(cfg.rdzv_secret_file);
  if (cfg.rdzv_insecure)
    std::fprintf(stderr,
                 "pytorch_exec: warning: --rdzv-insecure: any process that can reach %s:%d and "
                 "knows the id '%s' can join this job and run programs here\n",
                 cfg.rdzv_host.c_str(), cfg.rdzv_port, cfg.rdzv_id.c_str());
  else if (secret.empty())
    throw pe::UsageError("the job's secret is empty");
  std::string key = pe::auth::rdzv_key(secret, cfg.rdzv_id);
  secret.assign(secret.size(), '\0');
  return key;
}

// Join mode on a node that does not host the job: it becomes a node daemon of the host's front
// end, in this process, and exits with the job's status.
int join_as_node(const pe::LaunchConfig& cfg, std::string key, const std::string& host) {
  pe::DaemonOptions o;
  o.connect = {{cfg.rdzv_host, cfg.rdzv_port}};
  o.node = host;
  o.secret = std::move(key);
  o.connect_timeout = cfg.rdzv_read_timeout;
  o.heartbeat = pe::ctrl::HeartbeatSettings{cfg.heartbeat_interval, cfg.heartbeat_timeout};
  o.join.slots = cfg.np;
  o.join.node_rank = cfg.rdzv_static ? cfg.node_rank : -1;
  o.join.timeout = cfg.join_timeout;
  o.join.endpoint = cfg.rdzv_host + ":" + std::to_string(cfg.rdzv_port);
  o.join.output = pe::output_options(cfg, cfg.run_id.empty() ? cfg.rdzv_id : cfg.run_id);
  o.join.kill_grace = cfg.kill_grace;
  o.join.time_limit = cfg.timeout;
  o.join.time_limit_from = cfg.timeout_from;
  o.join.stdout_tty = cfg.stdout_tty;
  o.join.tty_rows = cfg.tty_rows;
  o.join.tty_cols = cfg.tty_cols;
  pe::pmix::PmixServer::end_with_process();  // the process ends with the daemon (main)
  pe::Daemon d(std::move(o));
  return d.run();
}

int real_main(int argc, char** argv) {
  // hwloc (loaded by the PMIx server) need not load its X11/GL, OpenCL and libxml2 plugins in
  // this process; workers still see the environment as it was.
  const bool saved_blacklist = std::getenv("HWLOC_PLUGINS_BLACKLIST") != nullptr;
  ::setenv("HWLOC_PLUGINS_BLACKLIST", "hwloc_gl,hwloc_opencl,hwloc_xml_libxml", 0);
  pe::open_closed_stdio();
  pe::raise_fd_limit();
  pe::RawOptions raw = pe::parse_command_line(argc, argv);
  if (raw.help) {
    std::cout << pe::help_text();
    return 0;
  }
  if (raw.version) {
    std::cout << "pytorch_exec " << PYTORCH_EXEC_VERSION_STRING << " (control protocol "
              << pe::ctrl::kProtocolVersion << ")\n";
    return 0;
  }
  pe::ValidationContext ctx;
  ctx.env = pe::environment_from(environ);
  if (!saved_blacklist) ctx.env.erase("HWLOC_PLUGINS_BLACKLIST");
  long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
  ctx.default_np = ncpu > 0 ? static_cast<int>(ncpu) : 1;
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd)) ctx.cwd = cwd;
  const bool step_task = pe::is_step_task(ctx.env, ::getpid());
  ctx.find_program = true;
  ctx.step_task = step_task;
  ctx.is_here = endpoint_is_here;
  // The GPUs torch would see (CUDA_VISIBLE_DEVICES, as SLURM's --gres sets it), of this
  // machine or of a dry run's --topology-file.
  ctx.gpu_count = [file = raw.topology_file.value_or(""), &env = ctx.env] {
    int n = 0;
    try {
      n = static_cast<int>(pe::topo::load_topology(pe::topo::LoadOptions{file})->gpus().size());
    } catch (const std::exception&) {
      return 0;
    }
    auto visible = env.find("CUDA_VISIBLE_DEVICES");
    if (visible == env.end() || !file.empty()) return n;
    int listed = 0;
    for (const auto& d : pe::split(visible->second, ','))
      if (!d.empty() && d[0] != '-') ++listed;  // "-1": none (and nothing after it)
      else break;
    return std::min(n, listed);
  };
  // This machine (or the dry run's --topology-file) as the ranks will see it: within --cpu-set.
  auto counted = [file = raw.topology_file.value_or("")](const std::string& set, bool hw) {
    auto t = pe::topo::load_topology(pe::topo::LoadOptions{file});
    if (!set.empty()) pe::topo::restrict_to(*t, set, hw);
    return t;
  };
  ctx.count_objects = [counted, set = raw.cpu_set.value_or(""),
                       hw = raw.use_hwthread_cpus](pe::topo::MapBy kind) {
    try {
      return pe::topo::count_objects(*counted(set, hw), kind);
    } catch (const pe::topo::TopologyError& e) {
      throw pe::UsageError(e.what());  // (the topology is needed to count the objects)
    }
  };
  ctx.count_cpu_set = [counted](const std::string& list, bool hwthreads) {
    return counted(list, hwthreads)->pu_count();
  };
  pe::LaunchConfig cfg = pe::validate_options(raw, ctx);
  g_usage_note = pe::environment_note(cfg.from_environment);
  // The ranks' standard output is a pipe to pytorch_exec, so Python would hold their prints back
  // a block at a time where the terminal here shows them at once: with a terminal, the ranks
  // get PYTHONUNBUFFERED=1 unless it is set.
  // A terminal that shows the ranks' stdout: theirs is a pseudo-terminal of its size, so that C
  // programs flush each line as they would run from it (mpirun gives its ranks one).  Not when
  // their stdout goes to files (torchrun's redirected or tee'd ranks write to a file).
  struct winsize ws {};
  if (::isatty(1) && (cfg.output_dir.empty() || cfg.output_copy) && !cfg.torch_logs.files()) {
    cfg.stdout_tty = true;
    if (::ioctl(1, TIOCGWINSZ, &ws) == 0) {
      cfg.tty_rows = ws.ws_row;
      cfg.tty_cols = ws.ws_col;
    }
  }
  if (::isatty(1) && !ctx.env.count("PYTHONUNBUFFERED") &&
      std::none_of(cfg.exports.begin(), cfg.exports.end(),
                   [](const auto& x) { return x.first == "PYTHONUNBUFFERED"; }))
    cfg.exports.emplace_back("PYTHONUNBUFFERED", "1");
  if (cfg.display_only) {
    pe::NodePlan plan = pe::plan_node(pe::placement_of(cfg), 0);
    std::cout << pe::topo::format_topology(*plan.topology, plan.analysis);
    return 0;
  }
  std::string host = pe::local_hostname();
  const char* spec = std::getenv("PYTORCH_EXEC_LOG");
  pe::init_logging(cfg.verbosity, spec ? spec : "", host);
  // A task of `srun --mpi=pmix ... pytorch_exec PROGRAM`: become that rank of the program (in
  // join mode, torchrun's way, each task is its node's launcher instead).
  if (step_task && !cfg.dry_run && !cfg.join_mode())
    pe::direct_exec(cfg, ctx.env, pe::step_identity(ctx.env));
  if (cfg.join_mode() && !cfg.dry_run) {
    pe::LaunchConfig jc = cfg;
    jc.rdzv_key = join_key(cfg, ctx.env);
    // The endpoint's machine hosts the job, unless its port is taken there: then, as torchrun's
    // agents, another pytorch_exec on this machine hosts it and this one joins.
    std::optional<pe::UniqueFd> claimed;
    if (cfg.rdzv_is_host < 0 && endpoint_is_here(cfg.rdzv_host)) claimed = claim_port(cfg.rdzv_port);
    bool hosts = cfg.rdzv_is_host >= 0 ? cfg.rdzv_is_host == 1 : claimed.has_value();
    if (!hosts) return join_as_node(jc, std::move(jc.rdzv_key), host);
    pe::JobMap map = pe::map_single_node(host, cfg.np);
    pe::WorkerSetSource workers =
        pe::workers_for(map, host, true, claimed ? std::move(*claimed) : pe::UniqueFd());
    pe::pmix::PmixServer::end_with_process();  // as below
    pe::JobController job(std::move(jc), std::move(ctx.env), std::move(map), std::move(workers));
    return job.run();
  }
  pe::JobMap map = cfg.join_mode() ? pe::map_single_node(host, cfg.np) : make_map(cfg, ctx.env, host);
  pe::check_stdin_rank(cfg, map.world_size);
  if (cfg.dry_run && (map.nodes.size() > 1 || !pe::is_local_host(map.nodes[0].host, host)))
    return print_dry_run(cfg, map, host);
  pe::WorkerSetSource workers = pe::workers_for(map, host, pe::NodeSources::wanted(cfg));
  // The process ends with the job: the job's PMIx server, when it goes, is left running, and
  // main() ends the process with _exit.
  pe::pmix::PmixServer::end_with_process();
  pe::JobController job(cfg, std::move(ctx.env), std::move(map), std::move(workers));
  return job.run();
}

int run_main(int argc, char** argv) {
  try {
    return real_main(argc, argv);
  } catch (const pe::UsageError& e) {
    return fail(std::string(e.what()) + g_usage_note + " (see pytorch_exec --help)", 2);
  } catch (const pe::ProgramError& e) {
    return fail(e.what(), e.exit_status());
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  } catch (...) {
    return fail("unexpected internal error", 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rc = run_main(argc, argv);
  // PMIx's threads still run (PmixServer::end_with_process): no static destructors beside them.
  if (pe::pmix::PmixServer::ends_with_process()) pe::flush_and_exit(rc);
  return rc;
}
