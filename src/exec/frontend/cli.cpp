#include "exec/frontend/cli.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <sstream>
#include <tuple>

#include "common/error.hpp"
#include "common/strings.hpp"
#include "exec/frontend/cli_detail.hpp"
#include "exec/frontend/option_table.hpp"
#include "exec/frontend/rdzv_options.hpp"
#include "exec/frontend/stdio.hpp"

namespace pe {

using namespace cli_detail;

namespace {

// Every option, once: names, --help group and text, and the RawOptions member it is stored in.
// Names follow mpirun/prterun where one exists, torchrun's otherwise.
const OptionDef<RawOptions> kOptions[] = {
    {"np", 'n', "Processes", "N",
     "number of processes to start (also -np and, as mpirun's, -c); default: the number of "
     "processors",
     &RawOptions::np, 'c'},
    {"nproc-per-node", 0, "Processes", "N|auto|gpu|cpu",
     "processes per node (torchrun's name): as -N with -H, --hostfile or in a SLURM allocation; "
     "on one machine and in join mode the same as -n; auto: one per GPU, else per processor",
     &RawOptions::nproc_per_node},
    {"host", 'H', "Processes", "HOST[:SLOTS],...",
     "run on these hosts (one slot per mention unless :SLOTS; duplicates add up, as do several "
     "-H)",
     &RawOptions::host_args},
    {"hostfile", 0, "Processes", "FILE",
     "run on the hosts of an Open MPI hostfile (\"host slots=N\" or \"host:N\" lines)",
     &RawOptions::hostfile},
    {"machinefile", 0, "Processes", "FILE", "as mpirun's: the same as --hostfile",
     &RawOptions::machinefile},
    {"npernode", 'N', "Processes", "N", "ranks per node", &RawOptions::npernode},
    {"launch-agent", 0, "Processes", "CMD",
     "start each node's pytorch_execd with CMD, {host} standing for the node (appended when "
     "absent); default: srun in a SLURM allocation, else ssh",
     &RawOptions::launch_agent},
    {"tree-radix", 0, "Processes", "N",
     "control-plane fan-out: at most N daemons talk to pytorch_exec, each relaying for N more "
     "(default 32; with --nnodes MIN:MAX at least 2*(MAX+spares), up to 1024, since arriving "
     "nodes talk to pytorch_exec directly)",
     &RawOptions::tree_radix},
    {"heartbeat-interval", 0, "Processes", "SECONDS",
     "every daemon and pytorch_exec send a heartbeat to their neighbours in the control plane "
     "this often (default 1)",
     &RawOptions::heartbeat_interval},
    {"heartbeat-timeout", 0, "Processes", "SECONDS",
     "a daemon silent this long (a frozen host, a cut link) is lost, as if it had died "
     "(default 3)",
     &RawOptions::heartbeat_timeout},
    {"oversubscribe", 0, "Processes", nullptr,
     "allow more ranks than slots in an allocation or hostfile (on one machine without either, "
     "-n is never limited)",
     &RawOptions::oversubscribe},
    {"nooversubscribe", 0, "Processes", nullptr,
     "as mpirun's: no more ranks than slots (the default)", &RawOptions::nooversubscribe},
    {"pernode", 0, "Processes", nullptr, "as mpirun's: one rank per node (-N 1)",
     &RawOptions::pernode},
    {"npersocket", 0, "Processes", "N",
     "as mpirun's: N ranks per socket of each node (--map-by ppr:N:socket)",
     &RawOptions::npersocket},
    {"map-by", 0, "Mapping and binding", "OBJECT[:PE=n]",
     "where ranks go: domain (default with GPUs: locality domains in order), gpu (GPUs in index "
     "order), numa (NUMA nodes round-robin), slot or node (slots in order); as mpirun, core, "
     "hwthread, l3cache, socket (round-robin over those) or ppr:N:OBJECT (N per node, socket, "
     "numa, l3cache, core or hwthread); :PE=n gives each rank n cores, "
     ":oversubscribe/:nooversubscribe/:nolocal as the options",
     &RawOptions::map_by},
    {"rank-by", 0, "Mapping and binding", "OBJECT",
     "how placed ranks are numbered: in placement order (slot, default), grouped by gpu or "
     "domain, or as mpirun round-robin over numa, core, hwthread, l3cache or socket",
     &RawOptions::rank_by},
    {"bind-to", 0, "Mapping and binding", "LEVEL[:overload-allowed][:if-supported]",
     "bind each rank to none, core, hwthread, l3cache, socket, numa or gpu (the cores near its "
     "GPUs); default: as the --map-by object (the PE cores with PE=n), else the cores near its "
     "GPU when there are GPUs, none otherwise; :overload-allowed lets ranks share a core; "
     "cpu-list[:ordered] with --cpu-list",
     &RawOptions::bind_to},
    {"cpus-per-rank", 0, "Mapping and binding", "N",
     "as mpirun's: N cores per rank, --map-by numa:PE=N (or the --map-by object's PE=N)",
     &RawOptions::cpus_per_rank},
    {"cpus-per-proc", 0, "Mapping and binding", "N", "the same as --cpus-per-rank",
     &RawOptions::cpus_per_proc},
    {"bynode", 0, "Mapping and binding", nullptr,
     "mpirun's older spelling of --map-by node (also --byslot: --map-by slot)",
     &RawOptions::bynode},
    {"byslot", 0, "Mapping and binding", nullptr, "mpirun's older spelling of --map-by slot",
     &RawOptions::byslot},
    {"bind-to-core", 0, "Mapping and binding", nullptr,
     "mpirun's older spelling of --bind-to core (also --bind-to-socket: --bind-to socket)",
     &RawOptions::bind_to_core},
    {"bind-to-socket", 0, "Mapping and binding", nullptr,
     "mpirun's older spelling of --bind-to socket", &RawOptions::bind_to_socket},
    {"use-hwthread-cpus", 0, "Mapping and binding", nullptr,
     "as mpirun's: PE=n and --cpus-per-rank count hardware threads, not cores",
     &RawOptions::use_hwthread_cpus},
    {"gpus-per-rank", 0, "Mapping and binding", "N", "GPUs given to each rank (default 1)",
     &RawOptions::gpus_per_rank},
    {"topology-file", 0, "Mapping and binding", "FILE",
     "an hwloc XML topology to map for instead of this machine (with --dry-run or "
     "--display-topology; also PYTORCH_EXEC_TOPOLOGY_FILE)",
     &RawOptions::topology_file},
    {"display-topology", 0, "Mapping and binding", nullptr,
     "print GPUs, NICs, their paths, locality domains, cpusets and GPU levels",
     &RawOptions::display_topology},
    {"display-map", 0, "Mapping and binding", nullptr,
     "print each rank's node, GPU, domain, NIC and processors, and the GPU levels, before starting",
     &RawOptions::display_map},
    {"display-devel-map", 0, "Mapping and binding", nullptr,
     "as mpirun's: the same as --display-map (which shows all pytorch_exec knows)",
     &RawOptions::display_devel_map},
    {"report-bindings", 0, "Mapping and binding", nullptr,
     "print each rank's binding when it is started", &RawOptions::report_bindings},
    {"display-allocation", 0, "Mapping and binding", nullptr,
     "print the nodes the job may use and their slots, before mapping",
     &RawOptions::display_allocation},
    {"nolocal", 0, "Mapping and binding", nullptr,
     "as mpirun's: start no ranks on this machine, only on the other nodes of -H, --hostfile, the "
     "SLURM allocation or a rankfile",
     &RawOptions::nolocal},
    {"cpu-set", 0, "Mapping and binding", "LIST",
     "as mpirun's: ranks are placed and bound on these processors of each node only: logical "
     "cores (hardware threads with --use-hwthread-cpus), N and N-M ranges, or SOCKET:CORES; on "
     "one machine -n defaults to their hardware threads",
     &RawOptions::cpu_set},
    {"cpu-list", 0, "Mapping and binding", "LIST",
     "as mpirun's: bind every rank to these processors (as --cpu-set's LIST); with --bind-to "
     "cpu-list:ordered, local rank k to the kth of them",
     &RawOptions::cpu_list},
    {"rankfile", 0, "Mapping and binding", "FILE",
     "as mpirun's (also -rf): each rank's node and processors from an Open MPI rankfile, lines "
     "\"rank N=HOST slot=LIST\" (HOST also +nK, the K-th node; LIST as SOCKET:CORES or CORES, "
     "logical, e.g. 1:0-2 or 0,2); -n defaults to its ranks",
     &RawOptions::rankfile},
    {"rf", 0, "Mapping and binding", "FILE", "the same as --rankfile", &RawOptions::rankfile_rf},
    {"dry-run", 0, "Mapping and binding", nullptr, "print the map and start nothing",
     &RawOptions::dry_run},
    {"wdir", 0, "Environment", "DIR", "working directory of every process", &RawOptions::wdir},
    {"x", 'x', "Environment", "VAR[=VALUE]",
     "set VAR in every process, to VALUE or to its value here (repeatable)", &RawOptions::exports},
    {"mca", 0, "Environment", "KEY VALUE",
     "set Open MPI's MCA parameter KEY to VALUE in every process (OMPI_MCA_KEY=VALUE, as mpirun "
     "--mca; repeatable)",
     &RawOptions::mca},
    {"gmca", 0, "Environment", "KEY VALUE", "as mpirun's: the same as --mca", &RawOptions::gmca},
    {"prefix", 0, "Environment", "DIR",
     "as mpirun's: DIR/bin first in every process's PATH and DIR/lib (and DIR/lib64 where a "
     "node has it) first in its LD_LIBRARY_PATH, on each node (an MPI installed in DIR); the "
     "program is looked for in DIR/bin first",
     &RawOptions::prefix},
    {"path", 0, "Environment", "DIR[:DIR...]",
     "as mpirun's: look for the program in these directories before PATH (the workers' PATH "
     "stays as it is)",
     &RawOptions::program_path},
    {"noprefix", 0, "Environment", nullptr,
     "as mpirun's: no --prefix (pytorch_exec adds none by itself)", &RawOptions::noprefix},
    {"allow-run-as-root", 0, "Environment", nullptr,
     "accepted for mpirun's command lines: pytorch_exec runs as root without it",
     &RawOptions::allow_run_as_root},
    {"role", 0, "Environment", "NAME", "the workers' ROLE_NAME, torchrun's --role (default: default)",
     &RawOptions::role},
    {"run-id", 0, "Environment", "ID", "TORCHELASTIC_RUN_ID of the job (default: the job id)",
     &RawOptions::run_id},
    {"tag-output", 0, "Output", nullptr,
     "prefix every line with [G,RANK]<stdout>: or [G,RANK]<stderr>: (G: generation, from 1)",
     &RawOptions::tag_output},
    {"merge-stderr-to-stdout", 0, "Output", nullptr,
     "as mpirun's: the ranks' stderr goes to pytorch_exec's stdout (its own messages stay on "
     "stderr)",
     &RawOptions::merge_stderr},
    {"timestamp-output", 0, "Output", nullptr,
     "prefix every line with the time it was read, [YYYY-MM-DDTHH:MM:SS.uuuuuu]",
     &RawOptions::timestamp_output},
    {"output-filename", 0, "Output", "DIR[:nocopy]",
     "also write each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr (processes of "
     "the Nth MPI_Comm_spawn of generation G: DIR/G.N/rank.R/...); :nocopy writes the files "
     "only; symbolic links and other users' directories are refused",
     &RawOptions::output_filename},
    {"stdin", 0, "Output", "none|all|RANK",
     "where standard input goes: no process, every process, or one rank (default 0)",
     &RawOptions::stdin_target},
    {"log-dir", 0, "Output", "DIR",
     "torchrun's: with --redirects or --tee, each rank's files are "
     "DIR/RUNID_XXXXXX/attempt_N/R/stdout.log and stderr.log (N: TORCHELASTIC_RESTART_COUNT; R: "
     "the local rank, as torchrun, or the rank where one pytorch_exec prints several nodes' "
     "ranks; default DIR: a new TMPDIR/torchelastic_XXXXXX; said at the start)",
     &RawOptions::log_dir},
    {"redirects", 'r', "Output", "STD",
     "torchrun's: these streams go to the --log-dir files only: 0 none, 1 stdout, 2 stderr, "
     "3 both, or per local rank, LOCAL:STD,... (0:3,1:2)",
     &RawOptions::redirects},
    {"tee", 't', "Output", "STD",
     "torchrun's: these streams go to the --log-dir files and to the terminal, where each line "
     "is prefixed with the role and local rank, [default0]: (values as --redirects)",
     &RawOptions::tee},
    {"local-ranks-filter", 0, "Output", "LOCAL,...",
     "torchrun's: only these local ranks' output reaches the terminal (files are written for "
     "all)",
     &RawOptions::local_ranks_filter},
    {"log-line-prefix-template", 0, "Output", "TEMPLATE",
     "torchrun's: the prefix of a tee'd line, with ${role_name}, ${local_rank}, ${rank} and "
     "${hostname} (default [${role_name}${local_rank}]:; also "
     "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)",
     &RawOptions::log_line_prefix_template},
    {"max-restarts", 0, "Failure handling", "N",
     "restart the whole group up to N times when a process fails (default 0)",
     &RawOptions::max_restarts},
    {"kill-grace", 0, "Failure handling", "SECONDS",
     "time between SIGTERM and SIGKILL when stopping processes (default 5)",
     &RawOptions::kill_grace},
    {"shutdown-timeout", 0, "Failure handling", "SECONDS", "torchrun's name for --kill-grace",
     &RawOptions::shutdown_timeout},
    {"timeout", 0, "Failure handling", "SECONDS",
     "as mpirun's: the job's time limit; then its processes are stopped as on SIGTERM and "
     "pytorch_exec exits 124 (also MPIEXEC_TIMEOUT)",
     &RawOptions::timeout},
    {"failure-window", 0, "Failure handling", "SECONDS",
     "when a process fails, tell the others through a PMIx event (PMIX_ERR_PROC_ABORTED or "
     "PMIX_EVENT_PROC_TERMINATED) and give them SECONDS before stopping them (default 0)",
     &RawOptions::failure_window},
    {"nnodes", 0, "Elastic", "N|MIN:MAX",
     "elastic membership: when a node is lost, the group is stopped and re-formed on the nodes "
     "that are left, as long as at least MIN remain (up to MAX nodes of the allocation are used)",
     &RawOptions::nnodes},
    {"spares", 0, "Elastic", "K",
     "start K more nodes of the allocation than --nnodes MAX and keep them idle; a spare takes "
     "a lost node's place at once (default 0)",
     &RawOptions::spares},
    {"max-scale-events", 0, "Elastic", "N",
     "re-form the group after a lost node at most N times (default: no limit; --max-restarts "
     "counts failures only)",
     &RawOptions::max_scale_events},
    {"host-discovery", 0, "Elastic", "CMD",
     "with --nnodes: run CMD (sh -c) every --host-discovery-interval seconds; it prints the "
     "hosts that may be used, one host[:slots] per line; new ones join the job (also the first "
     "nodes when neither -H nor --hostfile is given)",
     &RawOptions::host_discovery},
    {"host-discovery-interval", 0, "Elastic", "SECONDS",
     "seconds between runs of the --host-discovery command (default 1)",
     &RawOptions::host_discovery_interval},
    {"last-call", 0, "Elastic", "SECONDS",
     "a node that arrives while the job runs is admitted SECONDS after it arrived (once its "
     "daemon is ready), with every other node that arrived meanwhile, in one re-forming "
     "(default 1)",
     &RawOptions::last_call},
    {"host-cooldown", 0, "Elastic", "SECONDS",
     "a host whose node was lost is not admitted again for SECONDS, doubled on each further "
     "loss (default 10)",
     &RawOptions::host_cooldown},
    {"nnodes-multiple", 0, "Elastic", "K",
     "with --nnodes: every generation has a multiple of K nodes (a data-parallel degree); "
     "MIN is rounded up and MAX down to one, the nodes beyond stand by as spares",
     &RawOptions::nnodes_multiple},
    {"join-timeout", 0, "Elastic", "SECONDS",
     "when fewer than MIN nodes are left (or before the start: join mode, or a hostfile or "
     "discovery command that lists fewer), wait up to SECONDS for more to arrive from the "
     "hostfile, the discovery command or join mode, then fail (default 600; also --rdzv-conf "
     "join_timeout)",
     &RawOptions::join_timeout},
    {"rdzv-endpoint", 0, "Join mode", "HOST[:PORT]",
     "join mode, as torchrun: run pytorch_exec on every node; the one whose address is HOST "
     "hosts the job (the front end, listening on PORT, default 29400) and runs its node's "
     "workers, the others join it as its node daemons (also PET_RDZV_ENDPOINT)",
     &RawOptions::rdzv_endpoint},
    {"rdzv-id", 0, "Join mode", "ID",
     "the job's name, the same on every node; TORCHELASTIC_RUN_ID (default: none)",
     &RawOptions::rdzv_id},
    {"rdzv-backend", 0, "Join mode", "c10d|static",
     "c10d (default with --rdzv-endpoint): nodes join in any order; static (default with "
     "--master-addr): --nnodes N nodes with fixed --node-rank",
     &RawOptions::rdzv_backend},
    {"rdzv-conf", 0, "Join mode", "KEY=VALUE,...",
     "join_timeout (seconds to wait for MIN nodes or for the host, default 600), "
     "last_call_timeout (as --last-call), read_timeout (each connection attempt, default 60), "
     "is_host, keep_alive_interval, keep_alive_max_attempt (the heartbeat)",
     &RawOptions::rdzv_conf},
    {"rdzv-host", 0, "Join mode", nullptr,
     "this node hosts the job whatever HOST's address (default: it does when HOST is one of its "
     "addresses)",
     &RawOptions::rdzv_host},
    {"rdzv-secret-file", 0, "Join mode", "FILE",
     "the job's secret, the same on every node: the first line of FILE (mode 0600); else "
     "PYTORCH_EXEC_RDZV_SECRET",
     &RawOptions::rdzv_secret_file},
    {"rdzv-insecure", 0, "Join mode", nullptr,
     "run join mode without a secret: anyone who knows the id can join (a warning is printed)",
     &RawOptions::rdzv_insecure},
    {"node-rank", 0, "Join mode", "N",
     "static rendezvous: this node's fixed place (GROUP_RANK); node 0 hosts the job",
     &RawOptions::node_rank},
    {"master-addr", 0, "Join mode", "HOST",
     "static rendezvous (torchrun's default): the host of node rank 0 (the endpoint is "
     "HOST:--master-port)",
     &RawOptions::master_addr},
    {"master-port", 0, "Join mode", "PORT",
     "static rendezvous: its port (default 29500); on one node (alone, or with --nnodes 1), as "
     "with torchrun: the workers' MASTER_PORT",
     &RawOptions::master_port},
    {"standalone", 0, "Join mode", nullptr,
     "torchrun's single-node mode: accepted; pytorch_exec runs on this machine",
     &RawOptions::standalone},
    {"module", 'm', "Join mode", nullptr,
     "torchrun's -m: PROGRAM is a Python module, run as python3 -m PROGRAM ARGS",
     &RawOptions::module},
    {"no-python", 0, "Join mode", nullptr,
     "torchrun's --no-python: run PROGRAM itself (as always; a .py script not with python3 "
     "either)",
     &RawOptions::no_python},
    {"monitor-interval", 0, "Join mode", "SECONDS",
     "torchrun's: accepted; pytorch_exec learns of a worker's exit at once",
     &RawOptions::monitor_interval},
    {"start-method", 0, "Join mode", "spawn|fork|forkserver",
     "torchrun's: accepted; every worker is a new process running PROGRAM",
     &RawOptions::start_method},
    {"signals-to-handle", 0, "Join mode", "SIG,...",
     "torchrun's: accepted; SIGINT, SIGTERM, SIGHUP, SIGQUIT stop the job, SIGUSR1 and SIGUSR2 "
     "are forwarded, whatever the list",
     &RawOptions::signals_to_handle},
    {"verbose", 'v', "Debugging", nullptr,
     "log more: -v info, -vv debug, -vvv trace (PYTORCH_EXEC_LOG sets levels per subsystem)",
     &RawOptions::verbosity},
    {"quiet", 'q', "Debugging", nullptr,
     "as mpirun's: no warnings from pytorch_exec (errors and the reports of failed ranks stay)",
     &RawOptions::quiet},
    {"debug-devel", 'd', "Debugging", nullptr, "as mpirun's -d: log at debug level, as -vv",
     &RawOptions::debug_devel},
    {"version", 0, "Debugging", nullptr, "print the version and exit", &RawOptions::version},
    {"help", 'h', "Debugging", nullptr, "print this help and exit", &RawOptions::help},
};

const std::vector<std::string> kGroups = {"Processes", "Mapping and binding", "Environment",
                                          "Output",    "Failure handling",    "Elastic",
                                          "Join mode", "Debugging"};

}  // namespace

int cli_detail::parse_count(const std::string& opt, const std::string& v, long long min,
                            const std::string& expected) {
  auto n = parse_int(v, min, INT_MAX);
  if (!n) {
    std::string what = !expected.empty() ? expected
                       : min > 0         ? std::string("a positive integer")
                                         : "a non-negative integer";
    throw UsageError(opt + ": expected " + what + ", got '" + v + "'");
  }
  return static_cast<int>(*n);
}

namespace {

// --heartbeat-interval, --heartbeat-timeout.
void validate_heartbeat(const RawOptions& raw, LaunchConfig& c) {
  if (raw.heartbeat_interval)
    c.heartbeat_interval = positive_seconds("--heartbeat-interval", *raw.heartbeat_interval);
  if (raw.heartbeat_timeout)
    c.heartbeat_timeout = positive_seconds("--heartbeat-timeout", *raw.heartbeat_timeout);
  if (c.heartbeat_timeout <= c.heartbeat_interval)
    throw UsageError("--heartbeat-timeout must be longer than --heartbeat-interval");
}

}  // namespace

bool cli_detail::several_nodes(const RawOptions& raw, const ValidationContext& ctx) {
  bool allocation = !raw.rdzv_endpoint && !raw.master_addr &&
                    (ctx.env.count("SLURM_JOB_NODELIST") || ctx.env.count("SLURM_NODELIST"));
  return raw.hosts || raw.hostfile || allocation;
}

namespace {

// -n, --nproc-per-node, -H, --hostfile, -N.
void validate_counts(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  c.np = ctx.default_np;
  c.np_given = raw.np.has_value();
  if (raw.np) c.np = parse_count("-n", *raw.np, 1);
  if (raw.hosts && raw.hostfile) throw UsageError("give either -H or --hostfile, not both");
  if (raw.hosts) {
    if (raw.hosts->empty()) throw UsageError("-H: the host list is empty");
    c.hosts = *raw.hosts;
  }
  if (raw.hostfile) {
    if (raw.hostfile_is_machinefile) c.hostfile_option = "--machinefile";
    if (raw.hostfile->empty()) throw UsageError(c.hostfile_option + ": the file name is empty");
    c.hostfile = *raw.hostfile;
  }
  if (raw.npernode) c.npernode = parse_count("-N", *raw.npernode, 1);
  if (raw.tree_radix) c.tree_radix = parse_count("--tree-radix", *raw.tree_radix, 1);
  validate_heartbeat(raw, c);
  if (raw.launch_agent) {
    auto words = split_words(*raw.launch_agent);  // '""' is one empty word: no program either
    if (words.empty() || words[0].empty()) throw UsageError("--launch-agent: the command is empty");
    c.launch_agent = *raw.launch_agent;
  }
  if (raw.nproc_per_node) {
    // torchrun's auto (one per GPU, else per processor), gpu and cpu, on this machine.
    const std::string& v = *raw.nproc_per_node;
    int gpus = (v == "auto" || v == "gpu") && ctx.gpu_count ? ctx.gpu_count() : 0;
    if (v == "gpu" && gpus == 0) throw UsageError("--nproc-per-node gpu: this machine has no GPUs");
    int per_node = v == "auto" || v == "gpu" || v == "cpu"
                       ? (gpus > 0 && v != "cpu" ? gpus : ctx.default_np)
                       : parse_count("--nproc-per-node", v, 1, "a positive integer, auto, gpu or cpu");
    c.nproc_per_node = per_node;
    // Per node wherever there are nodes: -H, --hostfile, a SLURM allocation (not in join mode,
    // where each node's pytorch_exec runs its own).
    if (several_nodes(raw, ctx) || raw.npernode) {
      if (raw.npernode && c.npernode != per_node)
        throw UsageError("-N and --nproc-per-node disagree");
      c.npernode = per_node;  // ranks per node of the allocation
    } else {
      if (raw.np && per_node != c.np)
        throw UsageError("-n " + std::to_string(c.np) + " and --nproc-per-node " +
                         std::to_string(per_node) + " disagree on a single node");
      c.np = per_node;
      c.np_given = true;
    }
  }
}

// -x VAR[=VALUE]: VAR alone takes its value from the launching environment.  --mca KEY VALUE:
// OMPI_MCA_KEY=VALUE, after them.
void validate_exports(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  for (const auto& x : raw.exports) {
    auto eq = x.find('=');
    std::string name = x.substr(0, eq);
    if (!is_env_name(name))
      throw UsageError("-x: '" + name + "' is not a valid environment variable name (in '" + x +
                       "')");
    if (eq != std::string::npos) {
      c.exports.emplace_back(name, x.substr(eq + 1));
      continue;
    }
    auto it = ctx.env.find(name);
    if (it == ctx.env.end())
      throw UsageError("-x: " + name + " is not set here (use -x " + name + "=VALUE)");
    c.exports.emplace_back(name, it->second);
  }
  for (const auto& [option, list] : {std::pair{"--mca", &raw.mca}, {"--gmca", &raw.gmca}})
    for (const auto& m : *list) {
      std::string key = m.substr(0, m.find('\0')), value = m.substr(m.find('\0') + 1);
      if (key.empty() || !is_env_name("OMPI_MCA_" + key))
        throw UsageError(std::string(option) + ": '" + printable(key) +
                         "' is not an MCA parameter name");
      c.exports.emplace_back("OMPI_MCA_" + key, value);
    }
}

// -q, -d, -v: how much pytorch_exec says (-1: errors only).
int validate_verbosity(const RawOptions& raw) {
  if (raw.quiet && (raw.verbosity > 0 || raw.debug_devel))
    throw UsageError("-q (no warnings) and " + std::string(raw.debug_devel ? "-d" : "-v") +
                     " (more logging) disagree: give one");
  if (raw.quiet) return -1;
  return raw.debug_devel ? std::max(raw.verbosity, 2) : raw.verbosity;
}

// mpirun's --prefix DIR (--noprefix: none).  Each node reads DIR by its name: absolute.
void validate_prefix(const RawOptions& raw, LaunchConfig& c) {
  if (!raw.prefix) return;
  if (raw.noprefix) throw UsageError("--prefix and --noprefix disagree: give one");
  const std::string& p = *raw.prefix;
  if (p.empty() || p[0] != '/')
    throw UsageError("--prefix: '" + printable(p) +
                     "' is not an absolute path (each node looks for it by that name)");
  c.prefix = p;
  while (c.prefix.size() > 1 && c.prefix.back() == '/') c.prefix.pop_back();
}

// torchrun's --log-dir, --redirects, --tee, --local-ranks-filter, --log-line-prefix-template,
// --role.
void validate_torch_logs(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  TorchLogs& t = c.torch_logs;
  if (raw.log_dir) {
    if (raw.log_dir->empty()) throw UsageError("--log-dir: the directory name is empty");
    t.log_dir = *raw.log_dir;
  }
  for (auto [given, name, field] : {std::tuple{&raw.redirects, "--redirects", &t.redirects},
                                    std::tuple{&raw.tee, "--tee", &t.tee}}) {
    if (!*given) continue;
    auto v = parse_std_streams(**given);
    if (!v)
      throw UsageError(std::string(name) +
                       ": expected 0, 1 (stdout), 2 (stderr), 3 (both) or LOCAL_RANK:STD,... "
                       "(0:3,1:2), got '" +
                       **given + "'");
    *field = *v;
  }
  if (raw.local_ranks_filter && !raw.local_ranks_filter->empty()) {  // "": none, as torchrun
    for (const auto& l : split(*raw.local_ranks_filter, ',')) {
      auto n = parse_int(l, 0, INT_MAX);
      if (!n)
        throw UsageError("--local-ranks-filter: expected local ranks separated by commas (0,1), "
                         "got '" + *raw.local_ranks_filter + "'");
      t.console_ranks.push_back(static_cast<int>(*n));
    }
  }
  if (raw.log_line_prefix_template)
    t.prefix_template = *raw.log_line_prefix_template;
  else if (auto it = ctx.env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); it != ctx.env.end())
    t.prefix_template = it->second;
  if (raw.role) t.role = *raw.role;  // may be empty, as torchrun's
  if (t.files() && raw.output_filename)
    throw UsageError("--output-filename and --redirects/--tee both put the ranks' output in "
                     "files: give one");
  if (raw.monitor_interval) positive_seconds("--monitor-interval", *raw.monitor_interval);
  if (raw.signals_to_handle)
    for (const auto& s : split(*raw.signals_to_handle, ','))
      if (s.size() < 4 || s.compare(0, 3, "SIG") != 0 || !std::all_of(s.begin() + 3, s.end(), [](char ch) {
            return (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
          }))
        throw UsageError("--signals-to-handle: expected signal names separated by commas "
                         "(SIGTERM,SIGUSR1), got '" + *raw.signals_to_handle + "'");
  if (raw.start_method && *raw.start_method != "spawn" && *raw.start_method != "fork" &&
      *raw.start_method != "forkserver")
    throw UsageError("--start-method: expected spawn, fork or forkserver, got '" +
                     *raw.start_method + "'");
}

void validate_output(const RawOptions& raw, LaunchConfig& c) {
  c.tag_output = raw.tag_output;
  c.merge_stderr = raw.merge_stderr;
  c.timestamp_output = raw.timestamp_output;
  if (raw.output_filename) {
    std::string dir = *raw.output_filename;
    const std::string nocopy = ":nocopy";
    if (dir.size() >= nocopy.size() &&
        dir.compare(dir.size() - nocopy.size(), nocopy.size(), nocopy) == 0) {
      dir.resize(dir.size() - nocopy.size());
      c.output_copy = false;
    }
    if (dir.empty()) throw UsageError("--output-filename: the directory name is empty");
    c.output_dir = dir;
  }
}

// --stdin none|all|RANK (after the process count is known).
void validate_stdin(const RawOptions& raw, LaunchConfig& c) {
  if (raw.stdin_target) {
    const std::string& s = *raw.stdin_target;
    if (s == "none") {
      c.stdin_mode = StdinMode::None;
    } else if (s == "all") {
      c.stdin_mode = StdinMode::All;
    } else if (auto r = parse_int(s, 0, INT_MAX)) {
      if (*r >= c.np && c.np_given)  // otherwise checked against the job map (check_stdin_rank)
        throw UsageError("--stdin: rank " + s + " does not exist (the job has " +
                         std::to_string(c.np) + " ranks)");
      c.stdin_mode = StdinMode::OneRank;
      c.stdin_rank = static_cast<int>(*r);
    } else {
      throw UsageError("--stdin: expected none, all or a rank number, got '" + s + "'");
    }
  }
}

void validate_failure_handling(const RawOptions& raw, const ValidationContext& ctx,
                               LaunchConfig& c) {
  if (raw.kill_grace && raw.shutdown_timeout)
    throw UsageError("--kill-grace and --shutdown-timeout are one option: give one");
  // torchrun's variable for its default, where neither option is given.
  std::optional<std::string> from_env;
  auto env = ctx.env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  if (!raw.kill_grace && !raw.shutdown_timeout && env != ctx.env.end() && !env->second.empty())
    from_env = env->second;
  for (auto [given, name] : {std::pair{&raw.kill_grace, "--kill-grace"},
                             std::pair{&raw.shutdown_timeout, "--shutdown-timeout"},
                             std::pair{static_cast<const std::optional<std::string>*>(&from_env),
                                       "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}}) {
    if (!*given) continue;
    auto g = parse_seconds(**given);
    if (!g)
      throw UsageError(std::string(name) + ": expected a non-negative number of seconds, got '" +
                       **given + "'");
    c.kill_grace = *g;
  }
  if (raw.failure_window) {
    auto w = parse_seconds(*raw.failure_window);
    if (!w)
      throw UsageError("--failure-window: expected a non-negative number of seconds, got '" +
                       *raw.failure_window + "'");
    c.failure_window = *w;
  }
  if (raw.max_restarts) c.max_restarts = parse_count("--max-restarts", *raw.max_restarts, 0);
  // The job's time limit: --timeout, else mpirun's MPIEXEC_TIMEOUT (0: none).
  auto env_limit = ctx.env.find("MPIEXEC_TIMEOUT");
  std::optional<std::string> limit = raw.timeout;
  const char* limit_name = "--timeout";
  if (!limit && env_limit != ctx.env.end() && !env_limit->second.empty()) {
    limit = env_limit->second;
    limit_name = "MPIEXEC_TIMEOUT";
  }
  if (limit) {
    auto t = parse_seconds(*limit);
    if (!t || *t > 1e9)
      throw UsageError(std::string(limit_name) + ": expected a number of seconds, got '" + *limit +
                       "'");
    c.timeout = *t;
    c.timeout_from = limit_name;
  }
}

// --host-discovery, --host-discovery-interval, --last-call, --host-cooldown, --join-timeout.
void validate_arrivals(const RawOptions& raw, LaunchConfig& c) {
  const std::pair<const std::optional<std::string>*, const char*> need_nnodes[] = {
      {&raw.host_discovery, "--host-discovery"},
      {&raw.host_discovery_interval, "--host-discovery-interval"},
      {&raw.last_call, "--last-call"},
      {&raw.host_cooldown, "--host-cooldown"},
      {&raw.join_timeout, "--join-timeout"}};
  for (const auto& [given, name] : need_nnodes)
    if (*given && !raw.nnodes) throw UsageError(std::string(name) + " needs --nnodes MIN:MAX");
  if (raw.host_discovery) {
    if (raw.host_discovery->empty()) throw UsageError("--host-discovery: the command is empty");
    c.host_discovery = *raw.host_discovery;
  }
  if (raw.host_discovery_interval)
    c.discovery_interval =
        positive_seconds("--host-discovery-interval", *raw.host_discovery_interval);
  if (raw.last_call) {
    auto s = parse_seconds(*raw.last_call);
    if (!s || *s > 3600)
      throw UsageError("--last-call: '" + *raw.last_call +
                       "' is not a number of seconds in [0, 3600]");
    c.last_call = *s;
  }
  if (raw.host_cooldown) {
    auto s = parse_seconds(*raw.host_cooldown);
    if (!s)
      throw UsageError("--host-cooldown: '" + *raw.host_cooldown + "' is not a number of seconds");
    c.host_cooldown = *s;
  }
  if (raw.join_timeout) c.join_timeout = positive_seconds("--join-timeout", *raw.join_timeout);
}

// --nnodes N or MIN:MAX (torchrun's spelling), --max-scale-events N.
void validate_elastic(const RawOptions& raw, LaunchConfig& c) {
  if (raw.max_scale_events) {
    if (!raw.nnodes) throw UsageError("--max-scale-events needs --nnodes MIN:MAX");
    c.max_scale_events = parse_count("--max-scale-events", *raw.max_scale_events, 0);
  }
  if (raw.nnodes_multiple && !raw.nnodes)
    throw UsageError("--nnodes-multiple needs --nnodes MIN:MAX");
  if (raw.spares) {
    if (!raw.nnodes) throw UsageError("--spares needs --nnodes MIN:MAX");
    c.spares = parse_count("--spares", *raw.spares, 0);
  }
  validate_arrivals(raw, c);
  if (!raw.nnodes) return;
  const std::string& v = *raw.nnodes;
  auto colon = v.find(':');
  auto lo = parse_int(v.substr(0, colon), 1, INT_MAX);
  auto hi = colon == std::string::npos ? lo : parse_int(v.substr(colon + 1), 1, INT_MAX);
  if (!lo || !hi || *lo > *hi)
    throw UsageError("--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got '" + v + "'");
  c.nnodes_min = static_cast<int>(*lo);
  c.nnodes_max = static_cast<int>(*hi);
  if (raw.nnodes_multiple) {
    int k = parse_count("--nnodes-multiple", *raw.nnodes_multiple, 1);
    int lo_k = (c.nnodes_min + k - 1) / k * k, hi_k = c.nnodes_max / k * k;
    if (lo_k > hi_k)
      throw UsageError("--nnodes " + v + " has no multiple of --nnodes-multiple " +
                       std::to_string(k));
    c.nnodes_multiple = k;
    c.nnodes_min = lo_k;
    c.nnodes_max = hi_k;
  }
  // Nodes that arrive while the job runs talk to the front end directly (the relays of the tree
  // take no arrivals): unless --tree-radix says otherwise, the front end takes twice MAX plus
  // the spares (arrivals beyond MAX wait as spares), up to kFlatElasticNodes.
  constexpr long kFlatElasticNodes = 1024;
  if (!raw.tree_radix)
    c.tree_radix = static_cast<int>(std::max<long>(
        c.tree_radix, std::min(2L * (c.nnodes_max + static_cast<long>(c.spares)), kFlatElasticNodes)));
}

// The program as execvp would find it here; as typed for a dry run (nothing is started) or when
// the context says not to look.
std::string program_path(const LaunchConfig& c, const ValidationContext& ctx) {
  if (c.dry_run || !ctx.find_program) return c.program_arg0;
  auto path = ctx.env.find("PATH");
  std::string dirs = path != ctx.env.end() ? path->second : "/usr/bin:/bin";
  if (!c.prefix.empty()) dirs = c.prefix + "/bin:" + dirs;  // as the workers' PATH
  if (!c.program_path.empty()) dirs = c.program_path + ":" + dirs;  // --path, before PATH
  return resolve_program(c.program_arg0, c.wdir, dirs, true);
}

// A Python script that is no program to run: with python3, its arguments after it.
bool as_python_script(LaunchConfig& c, const ValidationContext& ctx) {
  auto path = ctx.env.find("PATH");
  auto python = python_for_script(c.program_arg0, c.wdir,
                                  path != ctx.env.end() ? path->second : "/usr/bin:/bin");
  if (!python) return false;
  c.program = *python;
  c.args.insert(c.args.begin(), c.program_arg0);
  c.program_arg0 = "python3";
  return true;
}

}  // namespace

RawOptions parse_command_line(int argc, const char* const* argv) {
  std::vector<std::string> command;
  RawOptions r = parse_into(kOptions, argc, argv, command);
  // "--" before the program: what follows is the program's, ':' included.
  auto at = static_cast<size_t>(argc) - command.size();
  r.after_dashdash = !command.empty() && at >= 2 && std::string(argv[at - 1]) == "--";
  if (!r.host_args.empty()) {
    bool empty = std::any_of(r.host_args.begin(), r.host_args.end(),
                             [](const std::string& h) { return h.empty(); });
    r.hosts = empty ? std::string() : join(r.host_args, ",");  // "": refused as empty
  }
  r.command = std::move(command);
  if (r.machinefile) {
    if (r.hostfile) throw UsageError("give either --hostfile or --machinefile, not both");
    r.hostfile = std::move(r.machinefile);
    r.hostfile_is_machinefile = true;
  }
  if (r.rankfile_rf) {
    if (r.rankfile) throw UsageError("give either --rankfile or -rf, not both");
    r.rankfile = std::move(r.rankfile_rf);
  }
  return r;
}

std::string help_text() {
  std::ostringstream os;
  os << "Usage: pytorch_exec [options] PROGRAM [ARGS...]\n"
     << "Start PROGRAM as a group of ranks with the torchrun and Open MPI environment,\n"
     << "forward their output, and stop or restart the whole group when one fails.\n\n"
     << describe_options(syntax_of(kOptions), "Options", kGroups) << "\n"
     << "Like torchrun's agent, pytorch_exec hosts torch's store on MASTER_ADDR:MASTER_PORT\n"
     << "(TORCHELASTIC_USE_AGENT_STORE=True: every rank is a client; a new store each generation).\n"
     << "See pytorch_exec(1) for the worker environment and exit statuses.\n";
  return os.str();
}

namespace {
LaunchConfig validate_raw(const RawOptions& raw, const ValidationContext& ctx);
}  // namespace

LaunchConfig validate_options(const RawOptions& typed, const ValidationContext& ctx) {
  RawOptions raw = with_pet_environment(typed, ctx.env);
  if (raw.module && raw.no_python) throw UsageError("-m and --no-python exclude each other");
  if (raw.module && !raw.command.empty())  // torchrun's -m MODULE ARGS
    raw.command.insert(raw.command.begin(), {"python3", "-m"});
  try {
    LaunchConfig c = validate_raw(raw, ctx);
    c.from_environment = raw.from_environment;
    return c;
  } catch (const UsageError& e) {
    throw UsageError(e.what() + environment_note(raw.from_environment));
  }
}

std::string environment_note(const std::vector<std::string>& from_environment) {
  if (from_environment.empty()) return "";
  return " (with " + join(from_environment, ", ") + " from the environment)";
}

namespace {

LaunchConfig validate_raw(const RawOptions& raw, const ValidationContext& ctx) {
  LaunchConfig c;
  c.verbosity = validate_verbosity(raw);
  c.display_allocation = raw.display_allocation;
  validate_counts(raw, ctx, c);
  validate_mapping(raw, ctx, c);
  validate_rankfile(raw, c);
  validate_cpu_lists(raw, ctx, c);
  if (raw.command.empty() && raw.display_topology && !raw.dry_run && !raw.display_map) {
    c.display_only = true;  // pytorch_exec --display-topology: print and exit
    return c;
  }
  // Before the program's check: an option that took the program for its value says so.
  validate_exports(raw, ctx, c);
  validate_prefix(raw, c);
  if (raw.program_path) {
    if (raw.program_path->empty()) throw UsageError("--path: the directory list is empty");
    c.program_path = *raw.program_path;
  }
  validate_stdin(raw, c);
  if (raw.command.empty())
    throw UsageError("no program given (usage: pytorch_exec [options] PROGRAM [ARGS...])");
  if (raw.command[0].empty()) throw UsageError("the program name is empty");
  c.program_arg0 = raw.command[0];
  c.args.assign(raw.command.begin() + 1, raw.command.end());
  // mpirun's MPMD form, "-n 1 a : -n 2 b": not run as one program with ":" among its arguments
  // (after "--" it is the program's: pytorch_exec -- sh -c :).
  if (!raw.after_dashdash &&
      std::find(raw.command.begin(), raw.command.end(), ":") != raw.command.end())
    throw UsageError("':' separates programs on mpirun's command line (MPMD), which pytorch_exec "
                     "does not run: start one program that branches on RANK (after --, a ':' "
                     "is the program's)");
  if (raw.wdir) {
    if (raw.wdir->empty()) throw UsageError("--wdir: the directory name is empty");
    c.wdir = *raw.wdir;
  }
  // Daemons on other nodes start elsewhere: a relative --wdir is this directory's.
  if (!raw.wdir)
    c.remote_wdir = ctx.cwd;
  else
    c.remote_wdir = c.wdir[0] == '/' || ctx.cwd.empty() ? c.wdir : ctx.cwd + "/" + c.wdir;
  validate_output(raw, c);
  validate_torch_logs(raw, ctx, c);
  validate_failure_handling(raw, ctx, c);
  validate_elastic(raw, c);
  if (raw.run_id) {
    if (raw.run_id->empty()) throw UsageError("--run-id: the id is empty");
    c.run_id = *raw.run_id;
  }
  validate_join(raw, ctx, c);
  c.nolocal = c.nolocal || raw.nolocal;
  if (c.nolocal && c.join_mode())
    throw UsageError("--nolocal: in join mode each node's pytorch_exec runs that node's ranks; "
                     "start none on this machine");
  // Last: the other mistakes are usage errors.  A job whose launcher starts the ranks looks for
  // the program here (join mode under srun too); a direct launch's task does, as it execs.
  ValidationContext look = ctx;
  look.find_program = ctx.find_program && (!ctx.step_task || c.join_mode());
  try {
    c.program = program_path(c, look);
  } catch (const ProgramError&) {
    if (raw.no_python || !as_python_script(c, look)) throw;
  }
  return c;
}

// 0 when `path` is an executable regular file, else the errno-like reason.
int check_executable(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EISDIR;
  if (::access(path.c_str(), X_OK) != 0) return EACCES;
  return 0;
}

}  // namespace

void check_stdin_rank(const LaunchConfig& c, int world_size) {
  if (c.stdin_mode == StdinMode::OneRank && c.stdin_rank >= world_size)
    throw UsageError("--stdin: rank " + std::to_string(c.stdin_rank) +
                     " does not exist (the job has " + std::to_string(world_size) + " ranks)");
}

namespace {

// `path` from the directory this process runs in, when it is relative: the workers start in
// --wdir, where a relative one would name another file, or none.
std::string from_here(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[4096];
  if (!::getcwd(cwd, sizeof cwd)) throw SystemError("getcwd", errno);
  return std::string(cwd) + "/" + path;
}

}  // namespace

std::optional<std::string> python_for_script(const std::string& script, const std::string& wdir,
                                             const std::string& path_env) {
  if (script.size() < 4 || script.compare(script.size() - 3, 3, ".py") != 0) return std::nullopt;
  std::string file = script[0] == '/' || wdir.empty() ? script : wdir + "/" + script;
  struct stat st;
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  try {
    return resolve_program("python3", "", path_env);
  } catch (const Error&) {
    return std::nullopt;  // no python3: the script's own error stands
  }
}

std::string resolve_program(const std::string& program, const std::string& wdir,
                            const std::string& path_env, bool then_wdir) {
  if (!wdir.empty()) {
    struct stat st;
    if (::stat(wdir.c_str(), &st) != 0)
      throw UsageError("--wdir: directory '" + wdir + "' does not exist");
    if (!S_ISDIR(st.st_mode)) throw UsageError("--wdir: '" + wdir + "' is not a directory");
  }
  if (program.find('/') != std::string::npos) {
    std::string path = program;
    if (program[0] != '/' && !wdir.empty()) path = wdir + "/" + program;
    int err = check_executable(path);
    if (err == ENOENT || err == ENOTDIR)
      throw ProgramError("program '" + program + "' not found" +
                             (program[0] != '/' && !wdir.empty() ? " in --wdir " + wdir : ""),
                         127);
    if (err == EISDIR) throw ProgramError("program '" + program + "' is a directory", 126);
    if (err) throw ProgramError("program '" + program + "' is not executable", 126);
    return from_here(path);
  }
  bool seen_non_exec = false;
  auto dirs = split(path_env, ':');
  if (then_wdir) dirs.push_back(wdir.empty() ? "." : wdir);  // as mpirun and srun look
  for (const auto& dir : dirs) {
    std::string path = (dir.empty() ? "." : dir) + "/" + program;
    int err = check_executable(path);
    if (err == 0) return from_here(path);
    if (err == EACCES) seen_non_exec = true;
  }
  std::string where = then_wdir ? (wdir.empty() ? "PATH or this directory" : "PATH or --wdir " + wdir) : "PATH";
  if (seen_non_exec)
    throw ProgramError("program '" + program + "' is in " + where + " but not executable", 126);
  throw ProgramError("program '" + program + "' not found in " + where, 127);
}

}  // namespace pe
