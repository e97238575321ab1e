// The plain description of one launch, produced by the command line (cli.hpp) and read by the
// job controller.  No behaviour here.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pe {

enum class StdinMode { None, OneRank, All };

struct LaunchConfig {
  int np = 1;                        // total number of ranks
  bool np_given = false;             // -n (or --nproc-per-node on one machine) was given
  std::string hosts;                 // -H
  std::string hostfile;              // --hostfile
  int npernode = 0;                  // -N
  std::string program;               // resolved path of the program
  std::string program_arg0;          // the program as the user typed it (argv[0] of workers)
  std::vector<std::string> args;     // arguments after the program
  bool oversubscribe = false;        // more ranks than slots (allocations, hostfiles)
  bool slurm = false;                // the allocation is SLURM's: daemons are started with srun
  std::string launch_agent;          // --launch-agent "CMD {host}"; empty: ssh (or srun)
  int tree_radix = 32;               // --tree-radix: daemons per relay in the control plane

  // Mapping and binding (strings as on the command line, already checked).
  std::string map_by;                // "" = default
  std::string rank_by;               // "" = slot
  std::string bind_to;               // "" = default
  int gpus_per_rank = 1;
  std::string topology_file;         // "" = this machine
  bool display_topology = false;
  bool display_map = false;          // also implied by dry_run
  bool report_bindings = false;
  bool dry_run = false;
  bool display_only = false;         // --display-topology without a program
  std::string wdir;                  // empty: the current directory
  // -x: variables to set in (or, for multi-node launches, carry to) every worker.
  std::vector<std::pair<std::string, std::string>> exports;

  // Output.
  bool tag_output = false;
  bool timestamp_output = false;
  std::string output_dir;            // --output-filename DIR; empty: none
  bool output_copy = true;           // false with DIR:nocopy

  // Input.
  StdinMode stdin_mode = StdinMode::OneRank;
  int stdin_rank = 0;

  // Failure handling.
  double kill_grace = 5.0;           // seconds between SIGTERM and SIGKILL
  int max_restarts = 0;

  std::string run_id;                // TORCHELASTIC_RUN_ID; empty: the job id
  int verbosity = 0;
};

}  // namespace pe
