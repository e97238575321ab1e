#include "exec/frontend/rdzv_options.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <vector>

#include "common/error.hpp"
#include "common/strings.hpp"
#include "exec/frontend/option_table.hpp"

namespace pe {
namespace {

constexpr int kC10dPort = 29400;    // torchrun's default for --rdzv-endpoint
constexpr int kStaticPort = 29500;  // and for --master-port

// rdzv-conf keys torchrun knows that mean nothing here (our store and keep-alive are our own).
const char* const kIgnoredConfKeys[] = {"use_agent_store", "use_libuv", "close_timeout", "timeout",
                                        "heartbeat_timeout"};

bool truthy(const std::string& v) {
  return v == "1" || v == "true" || v == "True" || v == "yes" || v == "on";
}

// A boolean of --rdzv-conf, read as torchrun reads one.
bool conf_bool(const std::string& key, const std::string& v) {
  std::string l = v;
  for (char& ch : l) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* t : {"1", "true", "t", "yes", "y"})
    if (l == t) return true;
  for (const char* f : {"0", "false", "f", "no", "n"})
    if (l == f) return false;
  throw UsageError("--rdzv-conf " + key + ": '" + printable(v) + "' is not true or false");
}

// --rdzv-conf k=v,...: join_timeout, last_call_timeout, read_timeout, is_host,
// keep_alive_interval, keep_alive_max_attempt.
void apply_conf(const RawOptions& raw, LaunchConfig& c) {
  if (!raw.rdzv_conf || raw.rdzv_conf->empty()) return;
  double keep_alive = 0;
  int attempts = 0;
  for (const auto& item : split(*raw.rdzv_conf, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--rdzv-conf: '" + item + "' is not KEY=VALUE");
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "join_timeout") {
      c.join_timeout = positive_seconds("--rdzv-conf join_timeout", v);
    } else if (k == "last_call_timeout") {
      auto s = parse_seconds(v);
      if (!s || *s > 3600)
        throw UsageError("--rdzv-conf last_call_timeout: '" + v +
                         "' is not a number of seconds in [0, 3600]");
      if (!raw.last_call) c.last_call = *s;
    } else if (k == "read_timeout") {
      c.rdzv_read_timeout = positive_seconds("--rdzv-conf read_timeout", v);
    } else if (k == "is_host") {
      bool is_host = conf_bool(k, v);
      if (!raw.rdzv_host) c.rdzv_is_host = is_host ? 1 : 0;
    } else if (k == "keep_alive_interval") {
      keep_alive = positive_seconds("--rdzv-conf keep_alive_interval", v);
    } else if (k == "keep_alive_max_attempt") {
      auto n = parse_int(v, 1, 1000);
      if (!n) throw UsageError("--rdzv-conf keep_alive_max_attempt: '" + v + "' is not 1..1000");
      attempts = static_cast<int>(*n);
    } else {
      bool ignored = false;
      for (const char* i : kIgnoredConfKeys) ignored = ignored || k == i;
      if (!ignored)
        throw UsageError("--rdzv-conf: unknown key '" + k +
                         "' (known: join_timeout, last_call_timeout, read_timeout, is_host, "
                         "keep_alive_interval, keep_alive_max_attempt)");
    }
  }
  // torchrun's keep-alive: a node is lost after max_attempt intervals without one.
  if (keep_alive > 0 && !raw.heartbeat_interval) c.heartbeat_interval = keep_alive;
  if (attempts > 0 && !raw.heartbeat_timeout) c.heartbeat_timeout = c.heartbeat_interval * attempts;
  if (c.heartbeat_timeout <= c.heartbeat_interval)
    throw UsageError("--rdzv-conf: the keep-alive timeout must be longer than its interval");
}

// No --node-rank, or 0: torchrun's default.
bool first_node(const RawOptions& raw) {
  return !raw.node_rank || parse_int(*raw.node_rank, 0, 0).has_value();
}

// Options that mean something in join mode only; torchrun's single-node defaults (--node-rank 0,
// --rdzv-backend static or c10d, --rdzv-id) are not among them.
void refuse_alone(const RawOptions& raw) {
  const std::pair<bool, std::string> given[] = {
      {raw.rdzv_conf.has_value(), "--rdzv-conf"},
      {raw.rdzv_host, "--rdzv-host"},
      {raw.rdzv_secret_file.has_value(), "--rdzv-secret-file"},
      {raw.rdzv_insecure, "--rdzv-insecure"},
      {!first_node(raw), "--node-rank " + raw.node_rank.value_or("")}};
  for (const auto& [g, name] : given)
    if (g) throw UsageError(name + " needs --rdzv-endpoint (or --master-addr)");
}

// torchrun on one node: its static rendezvous of --nnodes 1 (the default), node rank 0, names
// this machine whatever --master-addr says; it runs as pytorch_exec does without them, with
// --master-port as the workers' MASTER_PORT.
bool single_node(const RawOptions& raw, const LaunchConfig& c) {
  return (!raw.rdzv_backend || *raw.rdzv_backend == "static") && c.nnodes_max <= 1 &&
         first_node(raw);
}

void check_secret(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  if (raw.rdzv_secret_file) {
    if (raw.rdzv_secret_file->empty())
      throw UsageError("--rdzv-secret-file: the file name is empty");
    c.rdzv_secret_file = *raw.rdzv_secret_file;
  }
  c.rdzv_insecure = raw.rdzv_insecure;
  bool env = ctx.env.count(kRdzvSecretVariable) && !ctx.env.at(kRdzvSecretVariable).empty();
  if (c.rdzv_insecure && (env || raw.rdzv_secret_file))
    throw UsageError("--rdzv-insecure and a secret (--rdzv-secret-file or " +
                     std::string(kRdzvSecretVariable) + ") exclude each other");
  if (!c.rdzv_insecure && !env && !raw.rdzv_secret_file)
    throw UsageError("join mode needs the job's secret: --rdzv-secret-file FILE (mode 0600) or " +
                     std::string(kRdzvSecretVariable) +
                     " in the environment, the same on every node (or --rdzv-insecure)");
}

}  // namespace

std::pair<std::string, int> parse_endpoint(const std::string& opt, const std::string& v,
                                           int default_port) {
  // The control plane speaks IPv4 (its daemons, store and heartbeats): an IPv6 address, written
  // as torchrun writes one, is refused here rather than failing to resolve until the timeout.
  if ((!v.empty() && v[0] == '[') || std::count(v.begin(), v.end(), ':') > 1)
    throw UsageError(opt + ": '" + printable(v) +
                     "' is not HOST[:PORT] (no IPv6: pytorch_exec's nodes meet over IPv4)");
  std::string host = v, port;
  auto colon = v.find(':');
  if (colon != std::string::npos) {
    host = v.substr(0, colon);
    port = v.substr(colon + 1);
    if (port.empty()) throw UsageError(opt + ": no port after the ':' in '" + printable(v) + "'");
  }
  if (host.empty()) throw UsageError(opt + ": no host in '" + printable(v) + "'");
  if (colon == std::string::npos) return {host, default_port};
  auto p = parse_int(port, 1, 65535);
  if (!p) throw UsageError(opt + ": '" + port + "' is not a port number");
  return {host, static_cast<int>(*p)};
}

void validate_join(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c) {
  bool endpoint = raw.rdzv_endpoint && !raw.rdzv_endpoint->empty();
  bool master = raw.master_addr && !raw.master_addr->empty();
  const std::string backend = raw.rdzv_backend.value_or(endpoint ? "c10d" : "static");
  if (backend != "c10d" && backend != "static")
    throw UsageError("--rdzv-backend: '" + backend +
                     "' is not supported (pytorch_exec hosts its own rendezvous: use c10d or "
                     "static)");
  if (raw.standalone) {  // torchrun --standalone: one node, a local rendezvous; that is ours
    if (endpoint || master)
      throw UsageError("--standalone runs on one node: no --rdzv-endpoint or --master-addr");
    if (c.nnodes_min > 1) throw UsageError("--standalone runs on one node: --nnodes must be 1");
    if (raw.hosts || raw.hostfile || raw.host_discovery)
      throw UsageError("--standalone runs on this machine: no -H, --hostfile or --host-discovery");
    c.nnodes_min = c.nnodes_max = 0;
    return;
  }
  const bool nodes_named = raw.hosts || raw.hostfile || raw.host_discovery;
  // torchrun on one node with a rendezvous endpoint on this machine (--nnodes 1, its default,
  // node rank 0: `--rdzv-backend c10d --rdzv-endpoint localhost:0`): nobody can join, so nothing
  // is hosted (and no secret needed); it runs as on one machine, as with --standalone.
  const std::string ep_host = endpoint ? raw.rdzv_endpoint->substr(0, raw.rdzv_endpoint->find(':')) : "";
  const bool ep_here = ep_host == "localhost" || ep_host.rfind("127.", 0) == 0 ||
                       (ctx.is_here && !ep_host.empty() && ctx.is_here(ep_host));
  if (endpoint && ep_here && c.nnodes_max <= 1 && first_node(raw) && !nodes_named) {
    const std::string& e = *raw.rdzv_endpoint;
    if (e.size() < 2 || e.compare(e.size() - 2, 2, ":0") != 0)  // port 0: any, as torchrun's
      parse_endpoint("--rdzv-endpoint", e, kC10dPort);
    if (!raw.np && !raw.nproc_per_node) c.np = 1;  // torchrun's default: one
    if (raw.rdzv_id && c.run_id.empty()) c.run_id = *raw.rdzv_id;
    c.nnodes_min = c.nnodes_max = 0;
    return;
  }
  // torchrun's --master-addr defaults to 127.0.0.1: --node-rank with more than one node and no
  // address is a static rendezvous of nodes on this machine.
  if (!endpoint && !master && raw.node_rank && c.nnodes_max > 1 && !nodes_named) {
    RawOptions local = raw;
    local.master_addr = "127.0.0.1";
    return validate_join(local, ctx, c);
  }
  if (!endpoint && (!master || single_node(raw, c))) {
    refuse_alone(raw);
    if (raw.master_port) {
      auto p = parse_int(*raw.master_port, 1, 65535);
      if (!p) throw UsageError("--master-port: '" + *raw.master_port + "' is not a port number");
      c.master_port = static_cast<int>(*p);
    }
    if (raw.rdzv_id && c.run_id.empty()) c.run_id = *raw.rdzv_id;
    return;
  }
  if (!c.hosts.empty() || !c.hostfile.empty() || !c.host_discovery.empty() || c.spares > 0)
    throw UsageError(
        "--rdzv-endpoint: nodes join by themselves (run pytorch_exec on each); -H, --hostfile, "
        "--host-discovery and --spares do not apply");
  c.rdzv_static = backend == "static";
  if (!raw.np && !raw.nproc_per_node) c.np = 1;            // torchrun's default: one per node
  if (c.nnodes_min == 0) c.nnodes_min = c.nnodes_max = 1;  // torchrun's default
  std::pair<std::string, int> ep;
  if (endpoint) {
    ep = parse_endpoint("--rdzv-endpoint", *raw.rdzv_endpoint,
                        c.rdzv_static ? kStaticPort : kC10dPort);
  } else if (!c.rdzv_static) {
    throw UsageError("--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]");
  } else {
    ep = parse_endpoint("--master-addr", *raw.master_addr, kStaticPort);
    if (raw.master_port) {
      auto p = parse_int(*raw.master_port, 1, 65535);
      if (!p) throw UsageError("--master-port: '" + *raw.master_port + "' is not a port number");
      ep.second = static_cast<int>(*p);
    }
  }
  c.rdzv_host = ep.first;
  c.rdzv_port = ep.second;
  if (raw.rdzv_id) {
    if (raw.rdzv_id->empty()) throw UsageError("--rdzv-id: the id is empty");
    c.rdzv_id = *raw.rdzv_id;
  }
  if (c.run_id.empty()) c.run_id = c.rdzv_id;
  if (raw.node_rank) {
    auto r = parse_int(*raw.node_rank, 0, INT_MAX);
    if (!r)
      throw UsageError("--node-rank: expected a non-negative integer, got '" + *raw.node_rank +
                       "'");
    c.node_rank = static_cast<int>(*r);
  }
  if (c.rdzv_static) {  // torchrun's static rendezvous: a fixed number of nodes, fixed ranks
    if (c.nnodes_min != c.nnodes_max)
      throw UsageError(
          "static rendezvous (--master-addr, --rdzv-backend static) needs a fixed "
          "--nnodes N, not MIN:MAX");
    if (c.node_rank < 0) throw UsageError("static rendezvous needs --node-rank");
    if (c.node_rank >= c.nnodes_max)
      throw UsageError("--node-rank " + std::to_string(c.node_rank) + " is not below --nnodes " +
                       std::to_string(c.nnodes_max));
  }
  if (raw.rdzv_host) c.rdzv_is_host = 1;
  apply_conf(raw, c);
  if (c.rdzv_is_host < 0 && c.rdzv_static) c.rdzv_is_host = c.node_rank == 0 ? 1 : 0;
  check_secret(raw, ctx, c);
}

RawOptions with_pet_environment(RawOptions raw, const std::map<std::string, std::string>& env) {
  if (raw.hosts || raw.hostfile || raw.host_discovery) return raw;  // nodes named here: no pod
  auto from = [&env, &raw](const char* name, std::optional<std::string>& field) {
    auto it = env.find(name);
    if (field || it == env.end() || it->second.empty()) return;
    field = it->second;
    raw.from_environment.push_back(std::string(name) + "=" + it->second);
  };
  from("PET_NNODES", raw.nnodes);
  if (!raw.np && !raw.npernode) from("PET_NPROC_PER_NODE", raw.nproc_per_node);
  from("PET_RDZV_ENDPOINT", raw.rdzv_endpoint);
  from("PET_RDZV_ID", raw.rdzv_id);
  from("PET_RDZV_BACKEND", raw.rdzv_backend);
  from("PET_RDZV_CONF", raw.rdzv_conf);
  from("PET_NODE_RANK", raw.node_rank);
  from("PET_MASTER_ADDR", raw.master_addr);
  from("PET_MASTER_PORT", raw.master_port);
  from("PET_MAX_RESTARTS", raw.max_restarts);
  from("PET_LOG_DIR", raw.log_dir);
  from("PET_REDIRECTS", raw.redirects);
  from("PET_TEE", raw.tee);
  from("PET_LOCAL_RANKS_FILTER", raw.local_ranks_filter);
  from("PET_LOG_LINE_PREFIX_TEMPLATE", raw.log_line_prefix_template);
  from("PET_ROLE", raw.role);
  from("PET_MONITOR_INTERVAL", raw.monitor_interval);
  from("PET_START_METHOD", raw.start_method);
  from("PET_SHUTDOWN_TIMEOUT", raw.shutdown_timeout);
  auto st = env.find("PET_STANDALONE");
  if (!raw.standalone && st != env.end() && truthy(st->second)) {
    raw.standalone = true;
    raw.from_environment.push_back("PET_STANDALONE=" + st->second);
  }
  return raw;
}

}  // namespace pe
