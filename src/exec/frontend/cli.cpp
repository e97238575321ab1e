#include "exec/frontend/cli.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <climits>
#include <sstream>

#include "common/error.hpp"
#include "common/strings.hpp"

namespace po = boost::program_options;

namespace pe {
namespace {

enum class Kind { Flag, Counted, Value, List };

struct OptDef {
  const char* name;    // long name
  char short_name;     // 0: none
  Kind kind;
  const char* group;
  const char* value_name;
  const char* help;
};

// Every option, once.  Names follow mpirun/prterun where one exists, torchrun's otherwise.
const OptDef kOptions[] = {
    {"np", 'n', Kind::Value, "Processes", "N",
     "number of processes to start (also -np); default: the number of processors"},
    {"nproc-per-node", 0, Kind::Value, "Processes", "N",
     "processes per node (torchrun's name); on one machine the same as -n"},
    {"host", 'H', Kind::Value, "Processes", "HOST[:SLOTS],...",
     "run on these hosts (one slot per mention unless :SLOTS; duplicates add up)"},
    {"hostfile", 0, Kind::Value, "Processes", "FILE",
     "run on the hosts of an Open MPI hostfile (\"host slots=N\" or \"host:N\" lines)"},
    {"npernode", 'N', Kind::Value, "Processes", "N", "ranks per node"},
    {"launch-agent", 0, Kind::Value, "Processes", "CMD",
     "start each node's pytorch_execd with CMD, {host} standing for the node (appended when "
     "absent); default: srun in a SLURM allocation, else ssh"},
    {"tree-radix", 0, Kind::Value, "Processes", "N",
     "control-plane fan-out: at most N daemons talk to pytorch_exec, each relaying for N more "
     "(default 32)"},
    {"oversubscribe", 0, Kind::Flag, "Processes", nullptr,
     "allow more ranks than slots in an allocation or hostfile (on one machine without either, "
     "-n is never limited)"},
    {"map-by", 0, Kind::Value, "Mapping and binding", "slot|node|numa|gpu|domain",
     "where ranks go: locality domains in order (default with GPUs), GPUs in index order, NUMA "
     "nodes round-robin, or slots in order"},
    {"rank-by", 0, Kind::Value, "Mapping and binding", "slot|node|numa|gpu|domain",
     "how placed ranks are numbered: in placement order (slot, default) or grouped by NUMA node, "
     "GPU or domain"},
    {"bind-to", 0, Kind::Value, "Mapping and binding", "none|core|numa|gpu",
     "bind each rank's processors; default: the cores near its GPU when there are GPUs, none "
     "otherwise"},
    {"gpus-per-rank", 0, Kind::Value, "Mapping and binding", "N", "GPUs given to each rank (default 1)"},
    {"topology-file", 0, Kind::Value, "Mapping and binding", "FILE",
     "an hwloc XML topology to map for instead of this machine (with --dry-run or "
     "--display-topology; also PYTORCH_EXEC_TOPOLOGY_FILE)"},
    {"display-topology", 0, Kind::Flag, "Mapping and binding", nullptr,
     "print GPUs, NICs, their paths, locality domains and cpusets"},
    {"display-map", 0, Kind::Flag, "Mapping and binding", nullptr,
     "print each rank's node, GPU, domain, NIC and processors before starting"},
    {"report-bindings", 0, Kind::Flag, "Mapping and binding", nullptr,
     "print each rank's binding when it is started"},
    {"dry-run", 0, Kind::Flag, "Mapping and binding", nullptr,
     "print the map and start nothing"},
    {"wdir", 0, Kind::Value, "Environment", "DIR", "working directory of every process"},
    {"x", 'x', Kind::List, "Environment", "VAR[=VALUE]",
     "set VAR in every process, to VALUE or to its value here (repeatable)"},
    {"run-id", 0, Kind::Value, "Environment", "ID",
     "TORCHELASTIC_RUN_ID of the job (default: the job id)"},
    {"tag-output", 0, Kind::Flag, "Output", nullptr,
     "prefix every line with [G,RANK]<stdout>: or [G,RANK]<stderr>: (G: generation, from 1)"},
    {"timestamp-output", 0, Kind::Flag, "Output", nullptr,
     "prefix every line with the time it was read, [YYYY-MM-DDTHH:MM:SS.uuuuuu]"},
    {"output-filename", 0, Kind::Value, "Output", "DIR[:nocopy]",
     "also write each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr; "
     ":nocopy writes the files only"},
    {"stdin", 0, Kind::Value, "Output", "none|all|RANK",
     "where standard input goes: no process, every process, or one rank (default 0)"},
    {"max-restarts", 0, Kind::Value, "Failure handling", "N",
     "restart the whole group up to N times when a process fails (default 0)"},
    {"kill-grace", 0, Kind::Value, "Failure handling", "SECONDS",
     "time between SIGTERM and SIGKILL when stopping processes (default 5)"},
    {"verbose", 'v', Kind::Counted, "Debugging", nullptr,
     "log more: -v info, -vv debug, -vvv trace (PYTORCH_EXEC_LOG sets levels per subsystem)"},
    {"version", 0, Kind::Flag, "Debugging", nullptr, "print the version and exit"},
    {"help", 'h', Kind::Flag, "Debugging", nullptr, "print this help and exit"},
};

const char* kGroups[] = {"Processes", "Mapping and binding", "Environment", "Output",
                         "Failure handling", "Debugging"};

const OptDef* find_long(const std::string& name) {
  std::string n = name;
  for (char& c : n)
    if (c == '_') c = '-';  // torchrun spells --nproc_per_node, --max_restarts
  for (const auto& o : kOptions)
    if (n == o.name) return &o;
  return nullptr;
}

const OptDef* find_short(char c) {
  for (const auto& o : kOptions)
    if (o.short_name == c) return &o;
  return nullptr;
}

po::options_description describe() {
  po::options_description all("Options", 100, 50);
  for (const char* g : kGroups) {
    po::options_description group(g, 100, 50);
    for (const auto& o : kOptions) {
      if (std::string(o.group) != g) continue;
      std::string names = o.name;
      if (o.short_name) names += std::string(",") + o.short_name;
      switch (o.kind) {
        case Kind::Flag:
        case Kind::Counted:
          group.add_options()(names.c_str(), po::bool_switch(), o.help);
          break;
        case Kind::Value:
          group.add_options()(names.c_str(), po::value<std::string>()->value_name(o.value_name),
                              o.help);
          break;
        case Kind::List:
          group.add_options()(names.c_str(),
                              po::value<std::vector<std::string>>()->composing()->value_name(
                                  o.value_name),
                              o.help);
          break;
      }
    }
    all.add(group);
  }
  return all;
}

// Splits the options part of argv into named options with their values (so Boost never has to
// guess whether "-1" is a value, nor meets "--name=" with an empty value, which its own tokenizer
// rejects before we could name the problem), counts -v, and splits off the command.
struct Prescan {
  std::vector<po::option> options;
  int verbosity = 0;
  std::vector<std::string> command;
};

void take(Prescan& p, const OptDef* o, const std::optional<std::string>& inline_value,
          const std::vector<std::string>& toks, size_t& i, const std::string& spelled) {
  if (o->kind == Kind::Counted) {
    if (inline_value) throw UsageError("option " + spelled + " takes no value");
    ++p.verbosity;
    return;
  }
  if (o->kind == Kind::Flag) {
    if (inline_value) throw UsageError("option " + spelled + " takes no value");
    p.options.emplace_back(o->name, std::vector<std::string>{});
    return;
  }
  std::string value;
  if (inline_value) {
    value = *inline_value;
  } else {
    if (i + 1 >= toks.size()) throw UsageError("option " + spelled + " needs a value");
    value = toks[++i];
  }
  p.options.emplace_back(o->name, std::vector<std::string>{value});
}

Prescan prescan(const std::vector<std::string>& toks) {
  Prescan p;
  size_t i = 0;
  for (; i < toks.size(); ++i) {
    const std::string& t = toks[i];
    if (t == "--") {
      ++i;
      break;
    }
    if (t.size() < 2 || t[0] != '-') break;  // the program
    bool dashdash = t[1] == '-';
    std::string body = t.substr(dashdash ? 2 : 1);
    std::string name = body.substr(0, body.find('='));
    std::optional<std::string> inline_value;
    if (body.find('=') != std::string::npos) inline_value = body.substr(body.find('=') + 1);
    // "--name", and mpirun's single-dash long names ("-np", "-wdir").
    const OptDef* o = (dashdash || name.size() > 1) ? find_long(name) : nullptr;
    if (o) {
      take(p, o, inline_value, toks, i, (dashdash ? "--" : "-") + name);
      continue;
    }
    if (dashdash) throw UsageError("unknown option --" + name);
    // Short options: "-n4", "-n 4", "-vv", "-x FOO=1".
    for (size_t k = 1; k < t.size(); ++k) {
      const OptDef* s = find_short(t[k]);
      if (!s) throw UsageError(std::string("unknown option -") + t[k]);
      if (s->kind == Kind::Value || s->kind == Kind::List) {
        std::optional<std::string> v;
        if (k + 1 < t.size()) v = t.substr(k + 1);
        take(p, s, v, toks, i, std::string("-") + t[k]);
        break;
      }
      take(p, s, std::nullopt, toks, i, std::string("-") + t[k]);
    }
  }
  p.command.assign(toks.begin() + static_cast<long>(std::min(i, toks.size())), toks.end());
  return p;
}

template <typename T>
std::optional<T> get(const po::variables_map& vm, const char* name) {
  if (!vm.count(name)) return std::nullopt;
  return vm[name].as<T>();
}

int parse_count(const std::string& opt, const std::string& v, long long min) {
  auto n = parse_int(v, min, INT_MAX);
  if (!n) {
    throw UsageError(opt + ": expected " +
                     (min > 0 ? std::string("a positive integer") : "a non-negative integer") +
                     ", got '" + v + "'");
  }
  return static_cast<int>(*n);
}

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
    if (raw.hostfile->empty()) throw UsageError("--hostfile: the file name is empty");
    c.hostfile = *raw.hostfile;
  }
  if (raw.npernode) c.npernode = parse_count("-N", *raw.npernode, 1);
  if (raw.tree_radix) c.tree_radix = parse_count("--tree-radix", *raw.tree_radix, 1);
  if (raw.launch_agent) {
    auto words = split_words(*raw.launch_agent);  // '""' is one empty word: no program either
    if (words.empty() || words[0].empty()) throw UsageError("--launch-agent: the command is empty");
    c.launch_agent = *raw.launch_agent;
  }
  if (raw.nproc_per_node) {
    int per_node = parse_count("--nproc-per-node", *raw.nproc_per_node, 1);
    if (raw.hosts || raw.hostfile || raw.npernode) {
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

// -x VAR[=VALUE]: VAR alone takes its value from the launching environment.
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
}

void validate_output(const RawOptions& raw, LaunchConfig& c) {
  c.tag_output = raw.tag_output;
  c.timestamp_output = raw.timestamp_output;
  if (raw.output_filename) {
    std::string dir = *raw.output_filename;
    const std::string nocopy = ":nocopy";
    if (dir.size() >= nocopy.size() && dir.compare(dir.size() - nocopy.size(), nocopy.size(), nocopy) == 0) {
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

void validate_failure_handling(const RawOptions& raw, LaunchConfig& c) {
  if (raw.kill_grace) {
    auto g = parse_seconds(*raw.kill_grace);
    if (!g)
      throw UsageError("--kill-grace: expected a non-negative number of seconds, got '" +
                       *raw.kill_grace + "'");
    c.kill_grace = *g;
  }
  if (raw.max_restarts) c.max_restarts = parse_count("--max-restarts", *raw.max_restarts, 0);
}

void validate_mapping(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  auto one_of = [](const std::string& opt, const std::string& v, std::initializer_list<const char*> ok) {
    for (const char* o : ok)
      if (v == o) return v;
    std::string list;
    for (const char* o : ok) list += (list.empty() ? "" : ", ") + std::string(o);
    throw UsageError(opt + ": expected one of " + list + ", got '" + v + "'");
  };
  if (raw.map_by) c.map_by = one_of("--map-by", *raw.map_by, {"slot", "node", "numa", "gpu", "domain"});
  if (raw.rank_by) c.rank_by = one_of("--rank-by", *raw.rank_by, {"slot", "node", "numa", "gpu", "domain"});
  if (raw.bind_to) c.bind_to = one_of("--bind-to", *raw.bind_to, {"none", "core", "numa", "gpu"});
  if (raw.gpus_per_rank) c.gpus_per_rank = parse_count("--gpus-per-rank", *raw.gpus_per_rank, 1);
  c.display_topology = raw.display_topology;
  c.display_map = raw.display_map || raw.dry_run;
  c.report_bindings = raw.report_bindings;
  c.dry_run = raw.dry_run;
  if (raw.topology_file) {
    if (raw.topology_file->empty()) throw UsageError("--topology-file: the file name is empty");
    c.topology_file = *raw.topology_file;
  } else if (auto it = ctx.env.find("PYTORCH_EXEC_TOPOLOGY_FILE");
             it != ctx.env.end() && !it->second.empty() &&
             (raw.dry_run || (raw.display_topology && raw.command.empty()))) {
    c.topology_file = it->second;  // dry runs only: a real launch maps this machine
  }
  if (!c.topology_file.empty() && !raw.dry_run && !(raw.display_topology && raw.command.empty()))
    throw UsageError("--topology-file describes another machine: use it with --dry-run, or with "
                     "--display-topology and no program");
}

}  // namespace

RawOptions parse_command_line(int argc, const char* const* argv) {
  std::vector<std::string> toks(argv + 1, argv + argc);
  Prescan p = prescan(toks);
  po::variables_map vm;
  const po::options_description desc = describe();  // the parser keeps a pointer to it
  try {
    po::parsed_options parsed(&desc, po::command_line_style::allow_long);  // "--name" in messages
    parsed.options = std::move(p.options);
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  RawOptions r;
  r.verbosity = p.verbosity;
  r.help = vm["help"].as<bool>();
  r.version = vm["version"].as<bool>();
  r.tag_output = vm["tag-output"].as<bool>();
  r.oversubscribe = vm["oversubscribe"].as<bool>();
  r.display_topology = vm["display-topology"].as<bool>();
  r.display_map = vm["display-map"].as<bool>();
  r.report_bindings = vm["report-bindings"].as<bool>();
  r.dry_run = vm["dry-run"].as<bool>();
  r.map_by = get<std::string>(vm, "map-by");
  r.rank_by = get<std::string>(vm, "rank-by");
  r.bind_to = get<std::string>(vm, "bind-to");
  r.gpus_per_rank = get<std::string>(vm, "gpus-per-rank");
  r.topology_file = get<std::string>(vm, "topology-file");
  r.timestamp_output = vm["timestamp-output"].as<bool>();
  r.np = get<std::string>(vm, "np");
  r.nproc_per_node = get<std::string>(vm, "nproc-per-node");
  r.hosts = get<std::string>(vm, "host");
  r.hostfile = get<std::string>(vm, "hostfile");
  r.npernode = get<std::string>(vm, "npernode");
  r.launch_agent = get<std::string>(vm, "launch-agent");
  r.tree_radix = get<std::string>(vm, "tree-radix");
  r.wdir = get<std::string>(vm, "wdir");
  r.exports = get<std::vector<std::string>>(vm, "x").value_or(std::vector<std::string>{});
  r.output_filename = get<std::string>(vm, "output-filename");
  r.stdin_target = get<std::string>(vm, "stdin");
  r.kill_grace = get<std::string>(vm, "kill-grace");
  r.max_restarts = get<std::string>(vm, "max-restarts");
  r.run_id = get<std::string>(vm, "run-id");
  r.command = std::move(p.command);
  return r;
}

std::string help_text() {
  std::ostringstream os;
  os << "Usage: pytorch_exec [options] PROGRAM [ARGS...]\n"
     << "Start PROGRAM as a group of ranks with the torchrun and Open MPI environment,\n"
     << "forward their output, and stop or restart the whole group when one fails.\n\n"
     << describe() << "\n"
     << "See pytorch_exec(1) for the worker environment and exit statuses.\n";
  return os.str();
}

LaunchConfig validate_options(const RawOptions& raw, const ValidationContext& ctx) {
  LaunchConfig c;
  c.verbosity = raw.verbosity;
  validate_counts(raw, ctx, c);
  validate_mapping(raw, ctx, c);
  if (raw.command.empty() && raw.display_topology && !raw.dry_run && !raw.display_map) {
    c.display_only = true;  // pytorch_exec --display-topology: print and exit
    return c;
  }
  if (raw.command.empty())
    throw UsageError("no program given (usage: pytorch_exec [options] PROGRAM [ARGS...])");
  if (raw.command[0].empty()) throw UsageError("the program name is empty");
  c.program_arg0 = raw.command[0];
  c.args.assign(raw.command.begin() + 1, raw.command.end());
  if (raw.wdir) {
    if (raw.wdir->empty()) throw UsageError("--wdir: the directory name is empty");
    c.wdir = *raw.wdir;
  }
  validate_exports(raw, ctx, c);
  c.oversubscribe = raw.oversubscribe;
  validate_output(raw, c);
  validate_stdin(raw, c);
  validate_failure_handling(raw, c);
  if (raw.run_id) {
    if (raw.run_id->empty()) throw UsageError("--run-id: the id is empty");
    c.run_id = *raw.run_id;
  }
  return c;
}

namespace {

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
    throw UsageError("--stdin: rank " + std::to_string(c.stdin_rank) + " does not exist (the job has " +
                     std::to_string(world_size) + " ranks)");
}

std::string resolve_program(const std::string& program, const std::string& wdir,
                            const std::string& path_env) {
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
      throw ProgramError("program '" + program + "' not found", 127);
    if (err == EISDIR) throw ProgramError("program '" + program + "' is a directory", 126);
    if (err) throw ProgramError("program '" + program + "' is not executable", 126);
    return path;
  }
  bool seen_non_exec = false;
  for (const auto& dir : split(path_env, ':')) {
    std::string path = (dir.empty() ? "." : dir) + "/" + program;
    int err = check_executable(path);
    if (err == 0) return path;
    if (err == EACCES) seen_non_exec = true;
  }
  if (seen_non_exec)
    throw ProgramError("program '" + program + "' is in PATH but not executable", 126);
  throw ProgramError("program '" + program + "' not found in PATH", 127);
}

}  // namespace pe
