// The pytorch_exec command line: one table (kOptions in cli.cpp; see option_table.hpp) names
// every option, its help and its RawOptions member; validation is a separate pure step
// (validate_options) so it is unit-tested without processes.  A new option is a row in kOptions,
// a RawOptions member, its check in validate_options, and its lines in the man page and README.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "exec/frontend/launch_config.hpp"

namespace pe {

// The options as typed, before validation.  Everything is a string so that validation can say
// exactly what was wrong with it.
struct RawOptions {
  bool help = false;
  bool version = false;
  int verbosity = 0;
  std::optional<std::string> np;
  std::optional<std::string> nproc_per_node;
  std::optional<std::string> hosts;  // -H, all of them joined with ','
  std::vector<std::string> host_args;  // each -H (given more than once, they add up, as mpirun's)
  std::optional<std::string> hostfile;
  std::optional<std::string> machinefile;  // mpirun's name for --hostfile
  bool hostfile_is_machinefile = false;    // it was given as --machinefile
  std::optional<std::string> npernode;  // -N
  std::optional<std::string> launch_agent;
  std::optional<std::string> tree_radix;
  std::optional<std::string> heartbeat_interval;
  std::optional<std::string> heartbeat_timeout;
  std::optional<std::string> wdir;
  std::vector<std::string> exports;
  std::vector<std::string> mca;  // KEY, a NUL byte, VALUE
  std::vector<std::string> gmca;  // mpirun's --gmca: the same as --mca
  std::optional<std::string> prefix;  // mpirun's --prefix DIR
  bool noprefix = false;
  bool quiet = false;        // -q
  bool debug_devel = false;  // mpirun's -d
  bool display_allocation = false;
  bool nolocal = false;
  std::optional<std::string> rankfile;     // --rankfile
  std::optional<std::string> rankfile_rf;  // -rf (mpirun's short name), merged into rankfile
  std::optional<std::string> cpu_set;   // mpirun's --cpu-set
  std::optional<std::string> cpu_list;  // mpirun's --cpu-list
  bool after_dashdash = false;   // the program came after "--"
  bool allow_run_as_root = false;
  bool oversubscribe = false;
  bool display_topology = false;
  bool display_map = false;
  bool display_devel_map = false;          // mpirun's: --display-map
  std::optional<std::string> program_path;  // mpirun's --path
  bool report_bindings = false;
  bool dry_run = false;
  std::optional<std::string> map_by;
  std::optional<std::string> rank_by;
  std::optional<std::string> bind_to;
  std::optional<std::string> gpus_per_rank;
  std::optional<std::string> cpus_per_rank;  // -c
  std::optional<std::string> cpus_per_proc;
  std::optional<std::string> npersocket;
  bool pernode = false;
  bool nooversubscribe = false;
  bool use_hwthread_cpus = false;
  bool bynode = false, byslot = false;                // mpirun's older --map-by spellings
  bool bind_to_core = false, bind_to_socket = false;  // and --bind-to
  std::optional<std::string> topology_file;
  bool tag_output = false;
  bool merge_stderr = false;  // --merge-stderr-to-stdout
  bool timestamp_output = false;
  std::optional<std::string> output_filename;
  std::optional<std::string> stdin_target;
  std::optional<std::string> log_dir;  // torchrun's logs
  std::optional<std::string> redirects;
  std::optional<std::string> tee;
  std::optional<std::string> local_ranks_filter;
  std::optional<std::string> log_line_prefix_template;
  std::optional<std::string> role;
  std::optional<std::string> monitor_interval;  // torchrun's, accepted
  std::optional<std::string> start_method;      // torchrun's, accepted
  std::optional<std::string> signals_to_handle;  // torchrun's, accepted
  std::optional<std::string> shutdown_timeout;  // torchrun's --kill-grace
  std::optional<std::string> timeout;           // mpirun's --timeout
  std::optional<std::string> kill_grace;
  std::optional<std::string> failure_window;
  std::optional<std::string> max_restarts;
  std::optional<std::string> nnodes;
  std::optional<std::string> max_scale_events;
  std::optional<std::string> spares;
  std::optional<std::string> host_discovery;
  std::optional<std::string> host_discovery_interval;
  std::optional<std::string> last_call;
  std::optional<std::string> join_timeout;
  std::optional<std::string> nnodes_multiple;
  std::optional<std::string> host_cooldown;
  std::optional<std::string> run_id;
  // Join mode (torchrun's names).
  std::optional<std::string> rdzv_endpoint;
  std::optional<std::string> rdzv_id;
  std::optional<std::string> rdzv_backend;
  std::optional<std::string> rdzv_conf;
  bool rdzv_host = false;
  std::optional<std::string> rdzv_secret_file;
  bool rdzv_insecure = false;
  std::optional<std::string> node_rank;
  std::optional<std::string> master_addr;
  std::optional<std::string> master_port;
  bool standalone = false;
  bool module = false;     // -m: the program is a Python module
  bool no_python = false;  // --no-python
  std::vector<std::string> command;  // PROGRAM ARGS...
  std::vector<std::string> from_environment;  // "PET_X=v" that with_pet_environment applied
};

// torchrun's rule for the Kubeflow training operator's variables: an option not on the command
// line takes its value from PET_<NAME> (PET_NNODES, PET_NPROC_PER_NODE, PET_RDZV_ENDPOINT,
// PET_RDZV_ID, PET_RDZV_BACKEND, PET_RDZV_CONF, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT,
// PET_MAX_RESTARTS, PET_STANDALONE).  Empty variables are ignored, and all of them when -H,
// --hostfile or --host-discovery name the nodes; PET_NPROC_PER_NODE when -n or -N gives the
// count.  Those applied are listed in `from_environment` (for error messages).
RawOptions with_pet_environment(RawOptions raw, const std::map<std::string, std::string>& env);
// " (with PET_NNODES=2 from the environment)" for a usage error, so that it names what the user
// did not type; "" for none.
std::string environment_note(const std::vector<std::string>& from_environment);

// The variable that holds join mode's secret when --rdzv-secret-file is not given.
inline constexpr const char* kRdzvSecretVariable = "PYTORCH_EXEC_RDZV_SECRET";

// Parses argv (argv[0] is pytorch_exec itself).  Throws UsageError for unknown options, missing
// values and the like.  Options end at the first word that is not an option or an option's value,
// or after "--"; everything from there on is the program and its arguments.
RawOptions parse_command_line(int argc, const char* const* argv);

// The --help text, grouped.
std::string help_text();

// What validation needs to know about the world, so the function stays pure (but for
// find_program).
struct ValidationContext {
  std::map<std::string, std::string> env;  // the launching environment (-x VAR, PYTORCH_EXEC_*)
  int default_np = 1;                      // -n when not given
  std::string cwd;                         // the directory pytorch_exec runs in ("" if unknown)
  // Look for the program here (resolve_program, with env's PATH).  Without, and for a dry run,
  // the LaunchConfig's program is as typed.
  bool find_program = false;
  // This process is a task of an srun step: a direct launch's, which looks for the program with
  // the workers' PATH as it execs, unless in join mode (it starts the ranks itself).
  bool step_task = false;
  // This machine's GPUs, for --nproc-per-node auto and gpu (counted only then); none if unset.
  std::function<int()> gpu_count;
  // How many objects of a kind (socket, numa, l3cache, core, hwthread) this machine (or a dry
  // run's --topology-file) has, for --map-by ppr:N:OBJECT; unset: 1.
  std::function<int(topo::MapBy)> count_objects;
  // How many processors (hardware threads) --cpu-set LIST leaves on this machine (or the dry
  // run's --topology-file); unset: not counted (-n keeps default_np).
  std::function<int(const std::string& list, bool hwthreads)> count_cpu_set;
  // Whether a host name or address is this machine (a rendezvous endpoint); unset: only
  // localhost and 127.x are.
  std::function<bool(const std::string&)> is_here;
};

// Checks every value and fills the LaunchConfig, which is final: nothing changes it later.
// Throws UsageError with one sentence naming the option and the bad value, or resolve_program's
// errors (after every other check).
LaunchConfig validate_options(const RawOptions& raw, const ValidationContext& ctx);

// --stdin RANK against the job's size once it is mapped (-n may come from the allocation).
void check_stdin_rank(const LaunchConfig& c, int world_size);

// Finds the program as execvp would (PATH search for a bare name, relative to `wdir` for a
// relative path; `then_wdir`: a bare name not in PATH in `wdir`, else this directory, as mpirun
// and srun find it) and checks it can be executed.  Throws ProgramError (127 not found,
// 126 not executable) or UsageError (missing --wdir).
std::string resolve_program(const std::string& program, const std::string& wdir,
                            const std::string& path_env, bool then_wdir = false);

// torchrun's `train.py`: a Python script (.py, a file relative to `wdir`) that is no program to
// run (not executable, or not in PATH) runs with the python3 of `path_env`, as torchrun runs
// its own Python; that python3, or none (not a script, or no python3).
std::optional<std::string> python_for_script(const std::string& script, const std::string& wdir,
                                             const std::string& path_env);

}  // namespace pe
