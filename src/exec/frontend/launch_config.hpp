// The plain description of one launch, produced by the command line (validate_options in cli.hpp)
// and read by the job controller.  Nothing changes it after validation: what is settled later
// (the allocation's nodes, the job's size) is in the JobMap.  No behaviour here.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "topology/placement_choices.hpp"

namespace pe {

// A line of an Open MPI rankfile: "rank N=HOST slot=LIST" (HOST may be +nK, the allocation's
// K-th node; slot= may be left out: anywhere on HOST, unbound; "slots=" is the same).
struct RankfileLine {
  int rank = 0;
  std::string host;
  std::string slots;
  int line = 0;
};

enum class StdinMode { None, OneRank, All };

// torchrun's --redirects / --tee value: the streams of each local rank, 1 stdout, 2 stderr,
// 3 both ("3", or "0:1,1:2" per local rank).
struct StdStreams {
  int all = 0;                 // local ranks not in by_local
  std::map<int, int> by_local;
  int of(int local_rank) const {
    auto it = by_local.find(local_rank);
    return it != by_local.end() ? it->second : all;
  }
  bool any() const {
    if (all) return true;
    for (const auto& [l, v] : by_local)
      if (v) return true;
    return false;
  }
};

// torchrun's per-rank log files and console filter (--log-dir, --redirects, --tee,
// --local-ranks-filter, --log-line-prefix-template, --role).
struct TorchLogs {
  std::string log_dir;  // --log-dir; empty: a new torchelastic_XXXXXX in TMPDIR when needed
  StdStreams redirects, tee;
  std::vector<int> console_ranks;  // --local-ranks-filter; empty: every local rank
  std::string prefix_template;     // of tee'd lines on the terminal; empty: "[${role_name}${local_rank}]:"
  std::string role = "default";    // --role: ROLE_NAME
  bool files() const { return redirects.any() || tee.any(); }
};

struct LaunchConfig {
  int np = 1;                       // ranks asked for (-n, else the default); an allocation
                                    // decides when not given: the job's size is the JobMap's
  bool np_given = false;            // -n (or --nproc-per-node on one machine) was given
  std::string hosts;                // -H
  std::string hostfile;             // --hostfile
  int npernode = 0;                 // -N
  int nproc_per_node = 0;           // --nproc-per-node as given (0: not): -N or -n, see cli.cpp
  std::string program;              // resolved path of the program (as typed for a dry run)
  std::string program_arg0;         // the program as the user typed it (argv[0] of workers)
  std::vector<std::string> args;    // arguments after the program
  bool oversubscribe = false;       // more ranks than slots (allocations, hostfiles)
  std::string launch_agent;         // --launch-agent "CMD {host}"; empty: ssh (or srun)
  int tree_radix = 32;              // --tree-radix: daemons per relay in the control plane
  double heartbeat_interval = 1.0;  // seconds between heartbeats on the control plane's links
  double heartbeat_timeout = 3.0;   // a daemon silent this long is lost

  // Mapping and binding.
  topo::MapBy map_by = topo::MapBy::Default;
  topo::RankBy rank_by = topo::RankBy::Slot;
  topo::BindTo bind_to = topo::BindTo::Default;
  int gpus_per_rank = 1;
  int ppr = 0;                                 // --map-by ppr:N:OBJECT (npernode follows)
  topo::MapBy ppr_object = topo::MapBy::Node;
  int pe = 0;                                  // --map-by ...:PE=n, --cpus-per-rank: cores per rank
  bool bind_overload = false;                  // --bind-to LEVEL:overload-allowed
  bool hwthread_cpus = false;                  // --use-hwthread-cpus
  std::string hostfile_option = "--hostfile";  // or mpirun's --machinefile, for messages
  std::string cpu_set;                         // --cpu-set LIST: the processors ranks may use
  std::string cpu_list;                        // --cpu-list LIST: each rank bound to LIST
  bool cpu_list_ordered = false;               // --bind-to cpu-list:ordered: one each
  std::string mapping_option;   // the option that chose map_by: "--map-by", "--cpus-per-rank", ...
  std::string per_node_option;  // how ranks per node were given other than -N ("--pernode",
                                // "--map-by ppr:2:socket (2 per socket)"); for messages
  std::string topology_file;  // "" = this machine
  bool display_topology = false;
  bool display_map = false;  // also implied by dry_run
  bool report_bindings = false;
  bool dry_run = false;
  bool display_only = false;  // --display-topology without a program
  std::vector<std::string> from_environment;  // PET_X=v taken for options (environment_note)
  std::string wdir;           // --wdir; empty: the current directory
  std::string remote_wdir;    // where workers on other nodes start: --wdir, else the
                              // directory pytorch_exec runs in (empty if unknown)
  // -x: variables to set in (or, for multi-node launches, carry to) every worker.
  std::vector<std::pair<std::string, std::string>> exports;
  // --prefix DIR: DIR/bin first in every worker's PATH and DIR/lib (and DIR/lib64, where that
  // node has it) first in LD_LIBRARY_PATH, on the worker's node; empty: none.
  std::string prefix;
  std::string program_path;  // mpirun's --path: looked in for the program before PATH
  bool display_allocation = false;  // print the nodes and their slots before mapping
  bool nolocal = false;             // no ranks on this machine (mpirun's --nolocal)
  // --rankfile FILE: one line per rank, by rank (empty: none).
  std::vector<RankfileLine> rankfile;
  std::string rankfile_name;

  // Output.
  bool tag_output = false;
  bool timestamp_output = false;
  std::string output_dir;   // --output-filename DIR; empty: none
  bool output_copy = true;  // false with DIR:nocopy
  TorchLogs torch_logs;
  bool merge_stderr = false;  // --merge-stderr-to-stdout
  // pytorch_exec's stdout is a terminal that shows the ranks' stdout: theirs is a
  // pseudo-terminal of its size (NodeJob::stdout_tty).
  bool stdout_tty = false;
  int tty_rows = 0, tty_cols = 0;

  // Input.
  StdinMode stdin_mode = StdinMode::OneRank;
  int stdin_rank = 0;

  // Failure handling.
  double kill_grace = 5.0;      // seconds between SIGTERM and SIGKILL
  double timeout = 0;           // --timeout: seconds the job may run; 0: no limit
  std::string timeout_from;     // "--timeout" or "MPIEXEC_TIMEOUT"
  double failure_window = 0.0;  // seconds between the failure event and stopping the others
  int max_restarts = 0;

  // Elastic membership (--nnodes MIN:MAX): 0 when not elastic.
  int nnodes_min = 0;
  int nnodes_max = 0;
  int nnodes_multiple = 1;          // --nnodes-multiple K: generations of a multiple of K nodes
  int max_scale_events = -1;        // -1: no limit
  int spares = 0;                   // nodes started beyond nnodes_max, idle until one is lost
  std::string host_discovery;       // --host-discovery CMD: prints host[:slots] lines
  double discovery_interval = 1.0;  // seconds between its runs
  double last_call = 1.0;           // seconds an arrival waits for others to join with it
  double host_cooldown = 10.0;      // a lost host is kept out this long, doubled each time

  // Join mode (torchrun's way, as in a Kubernetes PyTorchJob): every node runs its own
  // pytorch_exec with --rdzv-endpoint HOST[:PORT] (or the static --master-addr); the one on HOST
  // is the front end and runs its node's workers, the others join it as its node daemons.
  std::string rdzv_host;           // empty: not join mode
  int rdzv_port = 29400;
  std::string rdzv_id = "none";    // the job's name: part of the control plane's key
  bool rdzv_static = false;        // static rendezvous: node ranks fixed by --node-rank
  int rdzv_is_host = -1;           // --rdzv-host or is_host=: 1, 0; -1: HOST is an address here
  int node_rank = -1;              // --node-rank; -1: none (places by arrival)
  double join_timeout = 600;       // seconds for MIN nodes to join, or to reach the host
  double rdzv_read_timeout = 60;   // seconds for one connection attempt and handshake
  std::string rdzv_secret_file;    // --rdzv-secret-file; else PYTORCH_EXEC_RDZV_SECRET
  bool rdzv_insecure = false;      // no secret: a fixed key derived from the id alone
  std::string rdzv_key;            // the control plane's key (auth::rdzv_key), set by main
  bool join_mode() const { return !rdzv_host.empty(); }
  // torchrun's single-node runs (--master-port, or --master-addr with --nnodes 1): the workers'
  // MASTER_PORT on this machine; 0: chosen by pytorch_exec.
  int master_port = 0;

  std::string run_id;  // TORCHELASTIC_RUN_ID; empty: the job id (join mode: the rdzv id)
  int verbosity = 0;
};

}  // namespace pe
