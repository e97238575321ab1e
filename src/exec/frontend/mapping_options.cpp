// Validation of the placement options: --map-by, --rank-by, --bind-to and Open MPI's spellings
// of them, --rankfile, --cpu-set and --cpu-list (see cli_detail.hpp).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/error.hpp"
#include "common/strings.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/cli_detail.hpp"
#include "exec/node/node_job.hpp"
#include "topology/placement.hpp"

namespace pe::cli_detail {
namespace {

// A slot list travels to every node in the Job message (PlacementRequest::kMaxPlace bytes each).
void check_slot_list_length(const std::string& what, const std::string& v) {
  if (v.size() > PlacementRequest::kMaxPlace)
    throw UsageError(what + ": a processor list longer than " +
                     std::to_string(PlacementRequest::kMaxPlace) + " characters");
}

// --bind-to cpu-list[:ordered] (Open MPI 4's binding to --cpu-list): 1, 2 with :ordered; 0 for
// other levels.  Its other qualifiers (overload-allowed, if-supported) are accepted.
int cpu_list_binding(const std::string& v) {
  auto parts = split(v, ':');
  std::string level = parts[0];
  std::transform(level.begin(), level.end(), level.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (level != "cpu-list") return 0;
  bool ordered = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] == "ordered")
      ordered = true;
    else if (parts[i] != "overload-allowed" && parts[i] != "if-supported")
      throw UsageError("--bind-to cpu-list: unknown qualifier '" + printable(parts[i], 64) +
                       "' (ordered, overload-allowed and if-supported are known)");
  }
  return ordered ? 2 : 1;
}

// Open MPI's spellings: --map-by OBJECT:MODIFIERS, ppr:N:OBJECT, -c, --npersocket, --pernode,
// --bind-to LEVEL:QUALIFIERS, --oversubscribe and --nooversubscribe.  ppr sets the ranks per
// node: N times the objects of this machine (or the --topology-file), the nodes taken to be alike.
// Messages name the options as the user gave them (c.mapping_option, c.per_node_option).
void validate_mpirun_mapping(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  topo::MapSpec spec;
  try {
    if (raw.map_by) spec = topo::parse_map_spec(*raw.map_by);
    c.nolocal = spec.nolocal;  // --map-by ...:nolocal, as --nolocal
    if (int list = raw.bind_to ? cpu_list_binding(*raw.bind_to) : 0) {
      c.cpu_list_ordered = list == 2;
    } else if (raw.bind_to) {
      topo::BindSpec b = topo::parse_bind_spec(*raw.bind_to);
      c.bind_to = b.to, c.bind_overload = b.overload;
    }
  } catch (const topo::TopologyError& e) {
    throw UsageError(e.what());
  }
  // mpirun's older spellings, one each and not with the new ones.
  if (raw.bynode || raw.byslot) {
    if (raw.bynode && raw.byslot) throw UsageError("give either --bynode or --byslot, not both");
    const char* old = raw.bynode ? "--bynode" : "--byslot";
    if (raw.map_by || raw.npersocket || raw.pernode)
      throw UsageError(std::string("give either ") + old + " or --map-by, not both");
    spec.by = raw.bynode ? topo::MapBy::Node : topo::MapBy::Slot;
  }
  if (raw.bind_to_core || raw.bind_to_socket) {
    if (raw.bind_to_core && raw.bind_to_socket)
      throw UsageError("give either --bind-to-core or --bind-to-socket, not both");
    const char* old = raw.bind_to_core ? "--bind-to-core" : "--bind-to-socket";
    if (raw.bind_to)
      throw UsageError(std::string("give either ") + old + " or --bind-to, not both");
    c.bind_to = raw.bind_to_core ? topo::BindTo::Core : topo::BindTo::Socket;
  }
  // The ranks per node: one of --map-by ppr, --npersocket, --pernode.
  std::vector<std::string> per_node;
  if (spec.by == topo::MapBy::Ppr) per_node.push_back("--map-by " + *raw.map_by);
  if (raw.npersocket) per_node.push_back("--npersocket");
  if (raw.pernode) per_node.push_back("--pernode");
  if (per_node.size() > 1)
    throw UsageError("give one of " + per_node[0] + " and " + per_node[1] + ", not both");
  if (raw.npersocket) {
    if (raw.map_by) throw UsageError("give either --npersocket or --map-by, not both");
    spec.by = topo::MapBy::Ppr, spec.ppr_object = topo::MapBy::Socket;
    spec.ppr = parse_count("--npersocket", *raw.npersocket, 1);
  }
  if (raw.pernode && raw.map_by) throw UsageError("give either --pernode or --map-by, not both");
  if (raw.cpus_per_rank && raw.cpus_per_proc)
    throw UsageError("give either --cpus-per-rank or --cpus-per-proc, not both");
  c.mapping_option = raw.map_by       ? "--map-by"
                     : raw.npersocket ? "--npersocket"
                     : raw.bynode     ? "--bynode"
                     : raw.byslot     ? "--byslot"
                                      : "";
  if (auto cpr = raw.cpus_per_rank ? raw.cpus_per_rank : raw.cpus_per_proc) {
    const std::string opt = raw.cpus_per_rank ? "--cpus-per-rank" : "--cpus-per-proc";
    int n = parse_count(opt, *cpr, 1);
    if (spec.pe > 0 && spec.pe != n)
      throw UsageError(opt + " " + std::to_string(n) + " and --map-by " + *raw.map_by +
                       " disagree");
    spec.pe = n;
    if (spec.by == topo::MapBy::Default) spec.by = topo::MapBy::Numa;  // mpirun's default object
    if (c.mapping_option.empty()) c.mapping_option = opt;
    try {
      topo::check_map_spec(spec, opt + " " + std::to_string(n) + " with --map-by " +
                                     std::string(topo::to_string(spec.by)));
    } catch (const topo::TopologyError& e) {
      throw UsageError(e.what());
    }
  }
  c.map_by = spec.by, c.ppr = spec.ppr, c.ppr_object = spec.ppr_object, c.pe = spec.pe;
  c.hwthread_cpus = raw.use_hwthread_cpus;
  if (raw.oversubscribe && raw.nooversubscribe)
    throw UsageError("--oversubscribe and --nooversubscribe contradict each other");
  if (spec.oversubscribe && (raw.oversubscribe || raw.nooversubscribe) &&
      *spec.oversubscribe != raw.oversubscribe)
    throw UsageError(std::string(raw.oversubscribe ? "--oversubscribe" : "--nooversubscribe") +
                     " and --map-by " + *raw.map_by + " contradict each other");
  c.oversubscribe = raw.oversubscribe || spec.oversubscribe.value_or(false);
  // On one machine -n is not limited unless asked: then, as mpirun, by its cores (or hwthreads).
  const bool limited = raw.nooversubscribe || spec.oversubscribe == false;
  if (limited && !several_nodes(raw, ctx) && c.np_given && ctx.count_objects) {
    const topo::MapBy slot = raw.use_hwthread_cpus ? topo::MapBy::HwThread : topo::MapBy::Core;
    const int slots = ctx.count_objects(slot);
    if (c.np > slots)
      throw UsageError("-n " + std::to_string(c.np) + ": no oversubscription allows at most " +
                       std::to_string(slots) + " ranks on this machine (its " +
                       std::to_string(slots) + " " + topo::to_string(slot) +
                       "s, the slots mpirun counts)");
  }
  if (per_node.empty()) return;
  const std::string& how = per_node[0];
  if (raw.pernode) {
    spec.ppr = 1, spec.ppr_object = topo::MapBy::Node;  // one rank per node, placed as usual
    if (raw.npernode && c.npernode != 1) throw UsageError("--pernode and -N disagree");
  } else if (raw.npernode) {
    throw UsageError(how + " sets the ranks per node: leave out -N");
  }
  if (raw.nproc_per_node)
    throw UsageError(how + " sets the ranks per node: leave out --nproc-per-node");
  int objects = 1;
  if (spec.ppr_object != topo::MapBy::Node && ctx.count_objects)
    objects = ctx.count_objects(spec.ppr_object);
  const int per = spec.ppr * objects;
  if (several_nodes(raw, ctx)) {
    c.npernode = per;
    c.per_node_option = how + (raw.pernode ? "" : " (" + std::to_string(per) + " per node)");
  } else {
    if (c.np_given && c.np > per)
      throw UsageError("-n " + std::to_string(c.np) + ": " + how + " places at most " +
                       std::to_string(per) + " rank" + (per == 1 ? "" : "s") +
                       " on this machine (" + std::to_string(objects) + " " +
                       topo::to_string(spec.ppr_object) + (objects == 1 ? "" : "s") + ")");
    if (!c.np_given) c.np = per, c.np_given = true;
  }
}

}  // namespace

// mpirun's --rankfile FILE: read here, slot lists checked for their form (each node checks them
// against its own processors); it places every rank, so the other placement options contradict
// it (--bind-to none aside: placed, unbound).
void validate_rankfile(const RawOptions& raw, LaunchConfig& c) {
  if (!raw.rankfile) return;
  const std::string& f = *raw.rankfile;
  if (f.empty()) throw UsageError("--rankfile: the file name is empty");
  std::vector<std::pair<bool, const char*>> others = {
      {raw.map_by.has_value(), "--map-by"},
      {raw.rank_by.has_value(), "--rank-by"},
      {raw.bind_to.has_value() && c.bind_to != topo::BindTo::None, "--bind-to"},
      {raw.npernode.has_value() || raw.pernode, "-N"},
      {raw.nproc_per_node.has_value(), "--nproc-per-node"},
      {raw.npersocket.has_value(), "--npersocket"},
      {raw.cpus_per_rank.has_value() || raw.cpus_per_proc.has_value(), "--cpus-per-rank"},
      {raw.bynode || raw.byslot, "--bynode/--byslot"},
      {raw.bind_to_core || raw.bind_to_socket, "--bind-to-core/--bind-to-socket"},
      {raw.nnodes.has_value(), "--nnodes"},
      {raw.rdzv_endpoint.has_value() || raw.master_addr.has_value(), "join mode"}};
  for (const auto& [given, name] : others)
    if (given)
      throw UsageError("--rankfile places and binds every rank: " + std::string(name) +
                       " contradicts it" +
                       (std::string(name) == "--bind-to" ? " (--bind-to none: unbound)" : ""));
  std::ifstream in(f);
  struct stat st;
  if (!in || (::stat(f.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
    throw UsageError(
        "--rankfile: cannot read '" + printable(f) + "'" +
        (in ? std::string(": it is a directory") : ": " + std::string(std::strerror(errno))));
  c.rankfile = parse_rankfile(in, printable(f));
  for (const auto& l : c.rankfile) {
    if (l.slots.empty()) continue;
    check_slot_list_length(printable(f) + ":" + std::to_string(l.line), l.slots);
    try {
      topo::parse_slot_list(l.slots);
    } catch (const topo::TopologyError& e) {
      throw UsageError(printable(f) + ":" + std::to_string(l.line) + ": " + e.what());
    }
  }
  const int lines = static_cast<int>(c.rankfile.size());
  if (c.np_given && c.np > lines)
    throw UsageError("-n " + std::to_string(c.np) + ": --rankfile " + printable(f) + " places " +
                     std::to_string(lines) + " rank(s)");
  if (!c.np_given) c.np = lines;
  c.np_given = true;
  c.rankfile.resize(static_cast<size_t>(c.np));
  c.rankfile_name = f;
}

// mpirun's --cpu-set LIST and --cpu-list LIST (with --bind-to cpu-list[:ordered]): slot lists
// checked for their form here, against each node's processors there.
void validate_cpu_lists(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  auto list = [](const char* option, const std::string& v) {
    if (v.empty()) throw UsageError(std::string(option) + ": the list is empty");
    check_slot_list_length(option, v);
    try {
      topo::parse_slot_list(v, std::string(option) + " ");
    } catch (const topo::TopologyError& e) {
      throw UsageError(e.what());
    }
    return v;
  };
  bool bind_list = raw.bind_to && cpu_list_binding(*raw.bind_to);
  if (bind_list && !raw.cpu_list)
    throw UsageError("--bind-to " + *raw.bind_to +
                     " binds to the processors of --cpu-list: give it");
  if (raw.cpu_list) {
    if (raw.rankfile) throw UsageError("--cpu-list and --rankfile both bind every rank: give one");
    if ((raw.bind_to && !bind_list) || raw.bind_to_core || raw.bind_to_socket)
      throw UsageError("--cpu-list binds every rank to its processors: --bind-to " +
                       raw.bind_to.value_or(raw.bind_to_core ? "core" : "socket") +
                       " contradicts it (--bind-to cpu-list:ordered: one of them each)");
    if (c.pe > 0)
      throw UsageError("--cpu-list binds every rank to its processors: PE=" + std::to_string(c.pe) +
                       " (or --cpus-per-rank) contradicts it");
    c.cpu_list = list("--cpu-list", *raw.cpu_list);
  }
  if (raw.cpu_set) {
    // Their numbers are the whole node's: within a restricted one they would name others.
    if (raw.cpu_list || raw.rankfile)
      throw UsageError(std::string("--cpu-set and ") +
                       (raw.cpu_list ? "--cpu-list" : "--rankfile") +
                       " both choose the ranks' processors: give one");
    c.cpu_set = list("--cpu-set", *raw.cpu_set);
    // -n defaults to the processors left, as to this machine's without --cpu-set.
    if (!c.np_given && !several_nodes(raw, ctx) && c.rankfile.empty() && ctx.count_cpu_set) {
      try {
        c.np = ctx.count_cpu_set(c.cpu_set, c.hwthread_cpus);
      } catch (const topo::TopologyError& e) {
        throw UsageError(e.what());
      }
    }
  }
}

void validate_mapping(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  validate_mpirun_mapping(raw, ctx, c);
  if (raw.rank_by) c.rank_by = one_of("--rank-by", *raw.rank_by, topo::kRankByChoices);
  if (raw.gpus_per_rank) c.gpus_per_rank = parse_count("--gpus-per-rank", *raw.gpus_per_rank, 1);
  c.display_topology = raw.display_topology;
  c.display_map = raw.display_map || raw.display_devel_map || raw.dry_run;
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
    throw UsageError(
        "--topology-file describes another machine: use it with --dry-run, or with "
        "--display-topology and no program");
}

}  // namespace pe::cli_detail
