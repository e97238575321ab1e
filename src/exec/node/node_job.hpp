// NodeJob: everything one node needs to run its part of a job, and nothing else.  The front end
// builds one per node from its validated LaunchConfig (node_job_for); a pytorch_execd receives
// it as one control message (control_codec.hpp); on one machine the front end uses it in
// process.  Both then hand it to a NodeRunner (node_runner.hpp).  No behaviour here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "exec/frontend/job_map.hpp"
#include "exec/frontend/launch_config.hpp"
#include "exec/node/worker_env.hpp"
#include "topology/placement_choices.hpp"

namespace pe {

// How the workers' standard input is provided on their node.
enum class StdinHow { DevNull, Forward, Direct };

// What the command line asked for about placement (strings as validated).
struct PlacementRequest {
  topo::MapBy map_by = topo::MapBy::Default;
  topo::RankBy rank_by = topo::RankBy::Slot;
  topo::BindTo bind_to = topo::BindTo::Default;
  int gpus_per_rank = 1;
  std::string topology_file;  // "" = this machine
  int ppr = 0;                // --map-by ppr:N:OBJECT
  topo::MapBy ppr_object = topo::MapBy::Node;
  int pe = 0;                                // --map-by ...:PE=n, --cpus-per-rank n
  bool bind_overload = false;                // --bind-to LEVEL:overload-allowed
  bool hwthread_cpus = false;                // --use-hwthread-cpus
  std::vector<std::string> places{};         // --rankfile: slot=LIST by local rank (empty: none)
  static constexpr size_t kMaxPlace = 4096;  // bytes of one slot list in the Job message
  std::string cpu_set{};                     // --cpu-set LIST ("": the whole node)
  std::string cpu_list{};                    // --cpu-list LIST ("": none)
  bool cpu_list_ordered = false;             // --bind-to cpu-list:ordered
};

struct NodeJob {
  std::string job_id;
  int node = 0;  // index into map.nodes
  JobMap map;
  int tree_radix = 32;
  int verbosity = 0;

  // The program, as every rank runs it.
  std::string program;       // resolved path
  std::string program_arg0;  // as typed: the workers' argv[0]
  std::vector<std::string> args;
  std::string wdir;  // --wdir, else the launcher's current directory
  std::vector<std::pair<std::string, std::string>> exports;  // -x
  std::string prefix;                                        // --prefix DIR
  EnvMap env;                                                // carried environment
  bool replace_env = false;  // env is the whole environment (SLURM), else added to the node's

  PlacementRequest placement;
  bool report_bindings = false;
  bool oversubscribe = false;  // MPI_Comm_spawn may place processes beyond the slots

  // Standard input.
  StdinMode stdin_mode = StdinMode::OneRank;
  int stdin_rank = 0;
  StdinHow stdin_how = StdinHow::DevNull;

  // Standard output: a pseudo-terminal of this size where pytorch_exec's output is a terminal
  // (as the program would have run from it; C's stdio then flushes each line), else a pipe.
  bool stdout_tty = false;
  int tty_rows = 0, tty_cols = 0;
};

// Node `node`'s job.  `env` is what the node's workers start from (on another node: what is
// carried there, see `replace_env`).
NodeJob node_job_for(const LaunchConfig& cfg, const JobMap& map, const std::string& job_id,
                     int node, EnvMap env, bool replace_env, StdinHow stdin_how);

}  // namespace pe
