#include "exec/node/worker_env.hpp"

#include <pytorch_exec/version.h>

#include <sys/stat.h>

#include <cstring>
#include <type_traits>

namespace pe {

EnvMap environment_from(char** envp) {
  EnvMap env;
  for (char** e = envp; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    env.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  return env;
}

EnvMap worker_environment(const EnvMap& base,
                          const std::vector<std::pair<std::string, std::string>>& exports,
                          const std::string& prefix, const JobMap& map, int rank,
                          const GenerationInfo& gen, const RankLocality& where) {
  EnvMap env = base;
  for (const auto& [k, v] : exports) env[k] = v;
  if (!prefix.empty()) {
    auto first = [&env](const char* k, const std::string& dir) {
      auto it = env.find(k);
      env[k] = it == env.end() || it->second.empty() ? dir : dir + ":" + it->second;
    };
    first("PATH", prefix + "/bin");
    first("LD_LIBRARY_PATH", prefix + "/lib");
    struct stat st;
    if (::stat((prefix + "/lib64").c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      first("LD_LIBRARY_PATH", prefix + "/lib64");
  }
  const RankLocation& loc = map.ranks.at(static_cast<size_t>(rank));
  const NodeMap& node = map.nodes.at(static_cast<size_t>(loc.node));
  auto set = [&env](const char* k, const std::string& v) { env[k] = v; };
  auto seti = [&env](const char* k, long v) { env[k] = std::to_string(v); };
  const long local_size = static_cast<long>(node.ranks.size());
  const long nnodes = static_cast<long>(map.nodes.size());

  // torchrun.
  seti("RANK", rank);
  seti("WORLD_SIZE", map.world_size);
  seti("LOCAL_RANK", loc.local_rank);
  seti("LOCAL_WORLD_SIZE", local_size);
  seti("GROUP_RANK", node.node_rank);
  seti("GROUP_WORLD_SIZE", nnodes);
  set("ROLE_NAME", gen.role_name);
  seti("ROLE_RANK", rank);
  seti("ROLE_WORLD_SIZE", map.world_size);
  set("MASTER_ADDR", gen.master_addr);
  seti("MASTER_PORT", gen.master_port);
  // As torchrun: the store on MASTER_ADDR:MASTER_PORT is the launcher's, every rank a client.
  if (gen.agent_store)
    set("TORCHELASTIC_USE_AGENT_STORE", "True");
  else
    env.erase("TORCHELASTIC_USE_AGENT_STORE");
  seti("TORCHELASTIC_RESTART_COUNT", gen.restart_count);
  seti("TORCHELASTIC_MAX_RESTARTS", gen.max_restarts);
  set("TORCHELASTIC_RUN_ID", gen.run_id.empty() ? gen.job_id : gen.run_id);
  // As torchrun: with more than one rank on the node (one rank keeps OpenMP's own choice).
  if (!env.count("OMP_NUM_THREADS") && local_size > 1) set("OMP_NUM_THREADS", "1");
  // NCCL errors and timeouts end the process (and so start a restart) rather than leave it hung.
  if (!env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING")) set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  // As mpirun does on an oversubscribed node: MPI waits yield the processor instead of spinning,
  // and Open MPI is told that the node is oversubscribed.  A user's own setting wins.
  if (gen.oversubscribed) {
    for (const char* k : {"OMPI_MCA_mpi_yield_when_idle", "OMPI_MCA_mpi_oversubscribe",
                          "OMPI_MCA_rmaps_base_oversubscribe"})
      if (!env.count(k)) set(k, "1");
  }

  // Open MPI's names.
  seti("OMPI_COMM_WORLD_RANK", rank);
  seti("OMPI_COMM_WORLD_SIZE", map.world_size);
  seti("OMPI_COMM_WORLD_LOCAL_RANK", loc.local_rank);
  seti("OMPI_COMM_WORLD_LOCAL_SIZE", local_size);
  // mpirun's node rank: the process's number among the job's processes on its node.
  seti("OMPI_COMM_WORLD_NODE_RANK", loc.local_rank);

  // SLURM's per-task names, where the ranks run in a SLURM job (its daemons' srun step, or the
  // shell of an allocation): what srun would give each task, had it started the ranks as one
  // step, not the daemon's own task (programs that read them for their rank, as Lightning's
  // SLURMEnvironment does, took every rank of a node for one).
  if (env.count("SLURM_JOB_ID") || env.count("SLURM_JOBID")) {
    seti("SLURM_PROCID", rank);
    seti("SLURM_LOCALID", loc.local_rank);
    seti("SLURM_NODEID", node.node_rank);
    seti("SLURM_NTASKS", map.world_size);
    seti("SLURM_NPROCS", map.world_size);
    seti("SLURM_STEP_NUM_TASKS", map.world_size);
    seti("SLURM_STEP_NUM_NODES", nnodes);
    std::string gtids, per_node;
    for (int r : node.ranks) gtids += (gtids.empty() ? "" : ",") + std::to_string(r);
    set("SLURM_GTIDS", gtids);
    // SLURM's "2(x3),1": the ranks per node, runs of one count folded.
    for (size_t i = 0, j; i < map.nodes.size(); i = j) {
      size_t n = map.nodes[i].ranks.size();
      for (j = i + 1; j < map.nodes.size() && map.nodes[j].ranks.size() == n; ++j) {
      }
      per_node += (per_node.empty() ? "" : ",") + std::to_string(n) +
                  (j - i > 1 ? "(x" + std::to_string(j - i) + ")" : "");
    }
    set("SLURM_TASKS_PER_NODE", per_node);
    set("SLURM_STEP_TASKS_PER_NODE", per_node);
  }

  // Ours.
  set(PYTORCH_EXEC_ENV_JOBID, gen.job_id);
  seti(PYTORCH_EXEC_ENV_GENERATION, gen.generation);
  seti(PYTORCH_EXEC_ENV_NODEID, node.node_rank);
  seti(PYTORCH_EXEC_ENV_DOMAIN, where.domain);
  // The DataChannel's job token (its store and transport admit only ranks that know it); the
  // environment, not argv, so that other users cannot read it.
  if (!gen.dc_token.empty()) set("PYTORCH_DC_TOKEN", gen.dc_token);
  auto join = [](const auto& v) {
    std::string s;
    for (const auto& x : v) {
      if (!s.empty()) s += ',';
      if constexpr (std::is_same_v<std::decay_t<decltype(x)>, int>)
        s += std::to_string(x);
      else
        s += x;
    }
    return s;
  };
  // Absent when there is nothing to say (and never inherited from an outer launch).
  auto set_or_erase = [&env](const char* k, const std::string& v) {
    if (v.empty())
      env.erase(k);
    else
      env[k] = v;
  };
  set_or_erase("PYTORCH_EXEC_GPU", join(where.gpus));
  set_or_erase("PYTORCH_EXEC_NIC", join(where.nics));
  set_or_erase("PYTORCH_EXEC_CPUS", where.cpus);
  return env;
}

std::vector<std::string> to_envp(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<std::string> with_local_rank(std::vector<std::string> argv, int local_rank) {
  static const std::string kMacro = "${local_rank}";
  for (size_t i = 1; i < argv.size(); ++i)
    for (size_t at = 0; (at = argv[i].find(kMacro, at)) != std::string::npos;) {
      std::string n = std::to_string(local_rank);
      argv[i].replace(at, kMacro.size(), n);
      at += n.size();
    }
  return argv;
}

}  // namespace pe
