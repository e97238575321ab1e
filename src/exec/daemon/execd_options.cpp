#include "exec/daemon/execd_options.hpp"

#include <cstdlib>

#include "common/error.hpp"
#include "common/strings.hpp"
#include "exec/frontend/option_table.hpp"

namespace pe {
namespace {

const OptionDef<ExecdRawOptions> kExecdOptions[] = {
    {"connect", 0, "", "ADDR:PORT,...", "the front end's addresses, tried in order",
     &ExecdRawOptions::connect},
    {"node", 0, "", "NAME", "this node's name in the job map", &ExecdRawOptions::node},
    {"slurm", 0, "", nullptr, "the node's name is SLURMD_NODENAME (else the host name)",
     &ExecdRawOptions::slurm},
    {"secret-stdin", 0, "", nullptr, "read the job's secret from the first line of standard input",
     &ExecdRawOptions::secret_stdin},
    {"secret-file", 0, "", "FILE", "read the job's secret from FILE (mode 0600)",
     &ExecdRawOptions::secret_file},
    {"connect-timeout", 0, "", "SECONDS",
     "time allowed to reach the front end (its addresses tried at once, again and again) and "
     "for the handshake (default 60; pytorch_exec passes its PYTORCH_EXEC_DAEMON_TIMEOUT)",
     &ExecdRawOptions::connect_timeout},
    {"heartbeat-interval", 0, "", "SECONDS",
     "send a heartbeat to the parent and children in the tree this often (default 1)",
     &ExecdRawOptions::heartbeat_interval},
    {"heartbeat-timeout", 0, "", "SECONDS",
     "a child silent this long is lost (default 3); the parent gets three times as long, at "
     "least 10 s, then this daemon kills its ranks and exits",
     &ExecdRawOptions::heartbeat_timeout},
    {"version", 0, "", nullptr, "print the version and exit", &ExecdRawOptions::version},
    {"help", 'h', "", nullptr, "print this help and exit", &ExecdRawOptions::help},
};

std::vector<std::pair<std::string, int>> parse_connect(const std::string& connect) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& item : split(connect, ',')) {
    auto colon = item.rfind(':');
    int port = colon == std::string::npos ? 0 : std::atoi(item.c_str() + colon + 1);
    if (colon == std::string::npos || colon == 0 || port <= 0 || port > 65535)
      throw UsageError("--connect: '" + item + "' is not ADDR:PORT");
    out.emplace_back(item.substr(0, colon), port);
  }
  return out;
}

}  // namespace

ExecdRawOptions parse_execd_command_line(int argc, const char* const* argv) {
  std::vector<std::string> rest;
  ExecdRawOptions raw = parse_into(kExecdOptions, argc, argv, rest);
  if (!rest.empty()) throw UsageError("unknown argument '" + rest[0] + "'");
  return raw;
}

std::string execd_help_text() {
  return "usage: pytorch_execd --connect ADDR:PORT[,ADDR:PORT...] (--node NAME | --slurm)\n"
         "                     [--secret-stdin | --secret-file FILE] [--connect-timeout SECONDS]\n"
         "                     [--heartbeat-interval SECONDS] [--heartbeat-timeout SECONDS]\n"
         "pytorch_execd is started by pytorch_exec on every node of a multi-node job; see "
         "pytorch_exec(1).\n"
         "The job's secret comes from PYTORCH_EXEC_SECRET, --secret-stdin or --secret-file.\n\n" +
         describe_options(syntax_of(kExecdOptions), "Options", {});
}

DaemonOptions validate_execd_options(const ExecdRawOptions& raw, const std::string& slurm_node) {
  DaemonOptions o;
  if (raw.connect_timeout)
    o.connect_timeout = positive_seconds("--connect-timeout", *raw.connect_timeout);
  if (raw.heartbeat_interval)
    o.heartbeat.interval = positive_seconds("--heartbeat-interval", *raw.heartbeat_interval);
  if (raw.heartbeat_timeout)
    o.heartbeat.timeout = positive_seconds("--heartbeat-timeout", *raw.heartbeat_timeout);
  if (o.heartbeat.timeout <= o.heartbeat.interval)
    throw UsageError("--heartbeat-timeout must be longer than --heartbeat-interval");
  if (!raw.connect || raw.connect->empty()) throw UsageError("--connect is required");
  o.connect = parse_connect(*raw.connect);
  o.node = raw.slurm ? slurm_node : raw.node.value_or("");
  if (o.node.empty()) throw UsageError("--node NAME or --slurm is required");
  return o;
}

}  // namespace pe
