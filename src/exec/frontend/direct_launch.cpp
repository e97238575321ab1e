#include "exec/frontend/direct_launch.hpp"

#include <fcntl.h>
#include <pmix.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "common/unique_fd.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/cli.hpp"
#include "pytorch_exec/version.h"

namespace pe {
namespace {

std::string get(const EnvMap& env, const char* k) {
  auto it = env.find(k);
  return it == env.end() ? std::string() : it->second;
}

int get_int(const EnvMap& env, const char* k) {
  auto v = parse_int(get(env, k), 0, 1 << 30);
  if (!v)
    throw Error(std::string("direct launch: ") + k + " is missing or not a number ('" +
                get(env, k) + "')");
  return static_cast<int>(*v);
}

constexpr const char* kTokenKey = "pytorch_exec.dc_token";
constexpr const char* kMasterKey = "pytorch_exec.master";
constexpr size_t kDcTokenBytes = 16;  // as a launched job's
// How long the tasks wait for each other in the fence: srun starts them within moments, but a
// busy node may be late.
constexpr double kTokenTimeout = 60.0;

void pmix_check(pmix_status_t rc, const char* what) {
  if (rc != PMIX_SUCCESS) throw Error(std::string(what) + " failed: " + PMIx_Error_string(rc));
}

void put_string(const char* key, const std::string& value) {
  pmix_value_t v;
  PMIX_VALUE_LOAD(&v, value.c_str(), PMIX_STRING);
  pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
  PMIX_VALUE_DESTRUCT(&v);
  pmix_check(rc, "PMIx_Put");
}

std::string get_string(const pmix_proc_t& from, const char* key, const char* what) {
  pmix_value_t* val = nullptr;
  pmix_check(PMIx_Get(&from, key, nullptr, 0, &val), what);
  std::string s = val->type == PMIX_STRING && val->data.string ? val->data.string : "";
  PMIX_VALUE_RELEASE(val);
  return s;
}

// The PMIx client's part (in the child process): rank 0 puts a fresh token and its node, a
// fence that collects the data, every task gets rank 0's.
StepShared exchange(double timeout, const std::string& node) {
  pmix_proc_t me;
  pmix_check(PMIx_Init(&me, nullptr, 0), "PMIx_Init");
  struct Finalize {
    ~Finalize() { PMIx_Finalize(nullptr, 0); }
  } finalize;
  if (me.rank == 0) {
    put_string(kTokenKey, auth::to_hex(auth::random_bytes(kDcTokenBytes)));
    put_string(kMasterKey, node);
  }
  pmix_check(PMIx_Commit(), "PMIx_Commit");
  int secs = std::max(1, static_cast<int>(timeout));
  bool collect = true;
  pmix_info_t info[2];
  PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
  pmix_proc_t all;
  PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
  pmix_status_t rc = PMIx_Fence(&all, 1, info, 2);
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  pmix_check(rc, "PMIx_Fence");
  pmix_proc_t rank0;
  PMIX_LOAD_PROCID(&rank0, me.nspace, 0);
  StepShared out;
  out.token = get_string(rank0, kTokenKey, "PMIx_Get of rank 0's token");
  if (out.token.size() != 2 * kDcTokenBytes) throw Error("rank 0's token is malformed");
  out.master = get_string(rank0, kMasterKey, "PMIx_Get of rank 0's node");
  if (out.master.empty() || out.master.find('\n') != std::string::npos)
    throw Error("rank 0's node name is malformed");
  return out;
}

}  // namespace

StepShared step_shared(double timeout, const std::string& node) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe", errno);
  UniqueFd rd(fds[0]), wr(fds[1]);
  pid_t pid = ::fork();
  if (pid < 0) throw SystemError("fork", errno);
  if (pid == 0) {  // the PMIx client, not this process: see direct_launch.hpp
    rd.reset();
    std::string out;
    try {
      ::setenv("PMIX_GDS_MODULE", "ds12", 1);
      StepShared got = exchange(timeout, node);
      out = "+" + got.token + "\n" + got.master;
    } catch (const std::exception& e) {
      out = std::string("-") + e.what();
    }
    write_all(wr.get(), out.data(), out.size());
    ::_exit(0);
  }
  wr.reset();
  // Its answer, within the fence's timeout and a little more (PMIx_Init has none of its own).
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(timeout + 5));
  std::string got;
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    struct pollfd p {
      rd.get(), POLLIN, 0
    };
    int n = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      timed_out = true;
      break;
    }
    char buf[256];
    ssize_t r = ::read(rd.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || got.size() > 4096) break;
    got.append(buf, static_cast<size_t>(r));
  }
  if (timed_out) ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    throw Error("no answer through SLURM's PMIx server within " +
                std::to_string(static_cast<int>(timeout + 5)) + " s");
  if (got.empty() || got[0] != '+')
    throw Error(got.size() > 1 ? got.substr(1) : "the PMIx client process failed");
  auto nl = got.find('\n');
  if (nl == std::string::npos) throw Error("the PMIx client process's answer is malformed");
  return StepShared{got.substr(1, nl - 1), got.substr(nl + 1)};
}

namespace {
// Whether process `pid`'s standard input is a terminal.
bool stdin_is_terminal(const std::string& pid) {
  char target[64];
  ssize_t n = ::readlink(("/proc/" + pid + "/fd/0").c_str(), target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::strncmp(target, "/dev/pts/", 9) == 0 || std::strncmp(target, "/dev/tty", 8) == 0;
}
}  // namespace

bool is_step_task(const EnvMap& env, long self) {
  // A step that srun starts from that shell has SLURM_PTY_PORT too (srun passes the environment
  // on), but its task is this process itself or, with a wrapper, a program without a terminal.
  std::string task = get(env, "SLURM_TASK_PID");
  bool typed_in_pty_shell = env.count("SLURM_PTY_PORT") && task != std::to_string(self) &&
                            stdin_is_terminal(task);
  return env.count("SLURM_PROCID") && !env.count(PYTORCH_EXEC_ENV_JOBID) &&
         is_task_step_id(get(env, "SLURM_STEP_ID")) && !typed_in_pty_shell;
}

StepIdentity step_identity(const EnvMap& env) {
  StepIdentity id;
  id.source = env.count("PMIX_RANK") ? "PMIx" : "SLURM";
  id.rank = get_int(env, env.count("PMIX_RANK") ? "PMIX_RANK" : "SLURM_PROCID");
  if (env.count("PMIX_RANK") && get(env, "SLURM_PROCID") != get(env, "PMIX_RANK"))
    throw Error("direct launch: PMIX_RANK " + get(env, "PMIX_RANK") + " and SLURM_PROCID " +
                get(env, "SLURM_PROCID") + " disagree");
  id.size = get_int(env, "SLURM_NTASKS");
  id.local_rank = get_int(env, "SLURM_LOCALID");
  id.node = get_int(env, "SLURM_NODEID");
  auto nodes =
      expand_hostlist(get(env, "SLURM_STEP_NODELIST").empty() ? get(env, "SLURM_JOB_NODELIST")
                                                              : get(env, "SLURM_STEP_NODELIST"));
  id.nnodes = static_cast<int>(nodes.size());
  // srun's default block distribution: this node's ranks follow each other.
  auto counts = expand_counts("SLURM_STEP_TASKS_PER_NODE", get(env, "SLURM_STEP_TASKS_PER_NODE"));
  if (counts.size() != nodes.size() || id.node >= static_cast<int>(counts.size()))
    throw Error("direct launch: SLURM_STEP_TASKS_PER_NODE does not match SLURM_STEP_NODELIST");
  // This node's tasks: SLURM_GTIDS lists them whatever the distribution (-m cyclic, arbitrary);
  // without it, srun's default block distribution.
  if (std::string gtids = get(env, "SLURM_GTIDS"); !gtids.empty()) {
    for (const auto& t : split(gtids, ',')) {
      auto r = parse_int(t, 0, 1 << 30);
      if (!r) throw Error("direct launch: SLURM_GTIDS is malformed ('" + gtids + "')");
      id.local_peers.push_back(static_cast<int>(*r));
    }
    if (static_cast<int>(id.local_peers.size()) != counts[static_cast<size_t>(id.node)])
      throw Error("direct launch: SLURM_GTIDS does not match SLURM_STEP_TASKS_PER_NODE");
  } else {
    int first = id.rank - id.local_rank;
    for (int i = 0; i < counts[static_cast<size_t>(id.node)]; ++i)
      id.local_peers.push_back(first + i);
  }
  // Task 0 runs on the step's first node (block and cyclic; step_shared tells for any).
  if (!nodes.empty()) id.master_host = nodes[0];
  if (id.local_peers.empty() || id.local_rank >= static_cast<int>(id.local_peers.size()) ||
      id.local_peers[static_cast<size_t>(id.local_rank)] != id.rank)
    throw Error("direct launch: this task's local rank does not match its node's ranks");
  if (id.rank >= id.size || id.node >= id.nnodes)
    throw Error("direct launch: inconsistent rank or node id");
  id.job_id = get(env, "SLURM_JOB_ID");
  id.step_id = get(env, "SLURM_STEP_ID");
  return id;
}

JobMap step_map(const StepIdentity& id) {
  JobMap m;
  m.world_size = id.size;
  m.nodes.resize(static_cast<size_t>(id.nnodes));
  for (int i = 0; i < id.nnodes; ++i) m.nodes[static_cast<size_t>(i)].node_rank = i;
  m.nodes[static_cast<size_t>(id.node)].ranks = id.local_peers;
  m.ranks.assign(static_cast<size_t>(id.size), RankLocation{});
  for (size_t lr = 0; lr < id.local_peers.size(); ++lr)
    m.ranks.at(static_cast<size_t>(id.local_peers[lr])) =
        RankLocation{id.node, static_cast<int>(lr)};
  return m;
}

int step_master_port(const std::string& job_id, const std::string& step_id) {
  // FNV-1a over "job.step": spreads consecutive steps over the range.
  uint32_t h = 2166136261u;
  for (char c : job_id + "." + step_id) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  // Outside the ephemeral range: no outgoing connection on the node takes it by chance.
  return port_outside_ephemeral(h);
}

void direct_exec(const LaunchConfig& cfg, const EnvMap& env, const StepIdentity& id) {
  if (!cfg.rankfile.empty())
    throw UsageError("--rankfile does not apply under srun (srun decides the ranks and their "
                     "processors: --distribution=arbitrary, --cpu-bind=map_cpu)");
  if (cfg.np_given && cfg.np != id.size)
    throw UsageError("-n " + std::to_string(cfg.np) + " does not match the SLURM step's " +
                     std::to_string(id.size) + " tasks (under srun, srun decides the ranks)");
  if (!cfg.per_node_option.empty())
    throw UsageError(cfg.per_node_option +
                     " does not apply under srun (srun decides the ranks: --ntasks-per-node, "
                     "--ntasks-per-socket)");
  if (!cfg.hosts.empty() || !cfg.hostfile.empty() || !cfg.launch_agent.empty() ||
      (cfg.npernode && !cfg.nproc_per_node))
    throw UsageError(
        "-H, --hostfile, -N and --launch-agent do not apply under srun (srun decides the ranks)");
  int here = static_cast<int>(id.local_peers.size());
  if (cfg.nproc_per_node && cfg.nproc_per_node != here)
    throw UsageError("--nproc-per-node " + std::to_string(cfg.nproc_per_node) +
                     " does not match the SLURM step's " + std::to_string(here) +
                     " tasks on this node (under srun, srun decides the ranks: "
                     "--ntasks-per-node; or run pytorch_exec once per node with --rdzv-endpoint)");
  if (cfg.nnodes_min && (cfg.nnodes_min != cfg.nnodes_max || cfg.nnodes_max != id.nnodes))
    throw UsageError("--nnodes " + std::to_string(cfg.nnodes_min) +
                     (cfg.nnodes_min != cfg.nnodes_max ? ":" + std::to_string(cfg.nnodes_max)
                                                       : std::string()) +
                     " does not apply to the SLURM step's " + std::to_string(id.nnodes) +
                     " node(s) (an elastic job needs pytorch_exec to supervise it: run it under "
                     "salloc/sbatch, not srun)");
  if (cfg.max_restarts > 0)
    throw UsageError(
        "--max-restarts needs pytorch_exec to supervise the job: run it under salloc/sbatch, not "
        "srun");
  // What pytorch_exec does to the ranks' output, input and placement when it starts them: each
  // task of an srun step is one rank that runs the program itself, and srun does these.
  const std::pair<bool, const char*> not_here[] = {
      {cfg.tag_output, "--tag-output (srun --label)"},
      {cfg.timestamp_output, "--timestamp-output"},
      {cfg.merge_stderr, "--merge-stderr-to-stdout (srun --error)"},
      {!cfg.output_dir.empty(), "--output-filename (srun --output)"},
      {cfg.torch_logs.files(), "--redirects/--tee (srun --output)"},
      {!cfg.torch_logs.console_ranks.empty(), "--local-ranks-filter"},
      // (MPIEXEC_TIMEOUT, exported for a script's mpirun steps, is not for srun's tasks)
      {cfg.timeout > 0 && cfg.timeout_from == "--timeout", "--timeout (srun --time)"},
      {cfg.stdin_mode != StdinMode::OneRank || cfg.stdin_rank != 0, "--stdin (srun --input)"},
      {cfg.bind_to != topo::BindTo::Default, "--bind-to (srun --cpu-bind)"},
      {!cfg.cpu_set.empty(), "--cpu-set (srun --cpu-bind=mask_cpu)"},
      {!cfg.cpu_list.empty(), "--cpu-list (srun --cpu-bind=map_cpu)"},
      {cfg.nolocal, "--nolocal (srun --exclude)"},
      {cfg.display_allocation, "--display-allocation"},
      {cfg.report_bindings, "--report-bindings (srun --cpu-bind=verbose)"},
      {cfg.map_by != topo::MapBy::Default, "(srun --distribution, --cpus-per-task)"}};
  for (const auto& [given, option] : not_here)
    if (given)
      throw UsageError((option[0] == '(' ? cfg.mapping_option + " " : "") + option +
                       " does not apply under srun: each task runs the program itself");
  GenerationInfo gen;
  gen.job_id = "slurm." + id.job_id + "." + id.step_id;
  gen.run_id = cfg.run_id;
  gen.role_name = cfg.torch_logs.role;
  gen.master_addr = id.master_host;
  gen.master_port = step_master_port(id.job_id, id.step_id);
  JobMap map = step_map(id);
  EnvMap out = worker_environment(env, cfg.exports, cfg.prefix, map, id.rank, gen);
  auto path = out.count("PATH") ? out["PATH"] : std::string("/usr/bin:/bin");
  std::string program, arg0 = cfg.program_arg0;
  std::vector<std::string> args = cfg.args;
  try {
    program = resolve_program(cfg.program_arg0, cfg.wdir, path, true);
  } catch (const ProgramError&) {
    auto python = python_for_script(cfg.program_arg0, cfg.wdir, path);
    if (!python) throw;
    program = *python;
    args.insert(args.begin(), cfg.program_arg0);
    arg0 = "python3";
  }
  if (!cfg.wdir.empty() && ::chdir(cfg.wdir.c_str()) != 0)
    throw SystemError("chdir " + cfg.wdir, errno);
  // Under PMIx the tasks agree on rank 0's node (MASTER_ADDR) and on the DataChannel's token:
  // without one, its store and transport admit anyone who can reach them.  The token is always
  // made, unless the user gave one (an empty one too: that opts out); whether the program will
  // use the DataChannel is not known here, and it costs one fence (see README).  Without PMIx
  // (--mpi=none) there is no private channel to agree on anything.
  if (id.source == "PMIx") {
    auto t0 = std::chrono::steady_clock::now();
    std::string node = get(env, "SLURMD_NODENAME");
    try {
      StepShared shared = step_shared(kTokenTimeout, node.empty() ? local_hostname() : node);
      gen.master_addr = out["MASTER_ADDR"] = shared.master;
      if (!out.count("PYTORCH_DC_TOKEN")) out["PYTORCH_DC_TOKEN"] = shared.token;
      logger("exec")->info(
          "direct launch: token and rank 0's node agreed through PMIx in {:.1f} ms",
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    } catch (const Error& e) {
      logger("exec")->warn(
          "direct launch: nothing agreed through PMIx ({}): MASTER_ADDR is the step's first "
          "node, and there is no DataChannel token (set PYTORCH_DC_TOKEN to one secret in "
          "every task)",
          e.what());
    }
  }
  logger("exec")->info(
      "direct launch ({}): rank {} of {}, local {} of {}, node {} of {}, master {}:{}", id.source,
      id.rank, id.size, id.local_rank, id.local_peers.size(), id.node, id.nnodes, gen.master_addr,
      gen.master_port);
  std::vector<std::string> argv{arg0};
  argv.insert(argv.end(), args.begin(), args.end());
  argv = with_local_rank(std::move(argv), id.local_rank);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  auto envp = to_envp(out);
  for (auto& e : envp) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  ::execve(program.c_str(), cargv.data(), cenv.data());
  throw ProgramError("cannot execute " + program + ": " + std::strerror(errno),
                     errno == ENOENT ? 127 : 126);
}

}  // namespace pe
