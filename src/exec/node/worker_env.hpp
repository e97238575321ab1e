// The environment of every worker (pytorch_exec(1), THE WORKER ENVIRONMENT): the torchrun
// names, the Open MPI names and PYTORCH_EXEC_*.  A pure function of the launching environment,
// the job map and the generation.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exec/frontend/job_map.hpp"

namespace pe {

using EnvMap = std::map<std::string, std::string>;

// Per-generation facts shared by every rank.
struct GenerationInfo {
  std::string job_id;
  std::string run_id;
  int generation = 0;     // PYTORCH_EXEC_GENERATION
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
  int max_restarts = 0;
  std::string master_addr;
  int master_port = 0;
  bool agent_store = false;  // pytorch_exec serves torch's store there: TORCHELASTIC_USE_AGENT_STORE
  std::string role_name = "default";
  std::string dc_token;         // PYTORCH_DC_TOKEN: a fresh secret per generation (hex), "": none
  bool oversubscribed = false;  // more ranks on the node than processors
};

// Where one rank runs on its node (from topology placement).
struct RankLocality {
  int domain = 0;
  std::vector<int> gpus;          // GPU indexes
  std::vector<std::string> nics;  // nearest NICs
  std::string cpus;               // bound processors (hwloc list syntax), "" when unbound
};

EnvMap environment_from(char** envp);

// The environment of global rank `rank`: `base` (the launching environment), then `exports`
// (-x), then `prefix` (--prefix: PREFIX/bin first in PATH, PREFIX/lib first in LD_LIBRARY_PATH,
// PREFIX/lib64 before it where this machine has that directory; "": nothing), then the variables
// pytorch_exec owns.  OMP_NUM_THREADS is set to 1 unless `base` or `exports` set it.
EnvMap worker_environment(const EnvMap& base,
                          const std::vector<std::pair<std::string, std::string>>& exports,
                          const std::string& prefix, const JobMap& map, int rank,
                          const GenerationInfo& gen,
                          const RankLocality& where = RankLocality{});

// torchrun's macro: "${local_rank}" in the program's arguments (argv[1...]) is the rank's local
// rank ("$$" stays as it is).
std::vector<std::string> with_local_rank(std::vector<std::string> argv, int local_rank);

// "NAME=VALUE" strings for execve.
std::vector<std::string> to_envp(const EnvMap& env);

}  // namespace pe
