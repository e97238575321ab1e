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
     "time allowed for each connection attempt and the handshake (default 30)",
     &ExecdRawOptions::connect_timeout},
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
         "pytorch_execd is started by pytorch_exec on every node of a multi-node job; see "
         "pytorch_exec(1).\n"
         "The job's secret comes from PYTORCH_EXEC_SECRET, --secret-stdin or --secret-file.\n\n" +
         describe_options(syntax_of(kExecdOptions), "Options", {});
}

DaemonOptions validate_execd_options(const ExecdRawOptions& raw, const std::string& slurm_node) {
  DaemonOptions o;
  if (raw.connect_timeout) {
    const std::string& v = *raw.connect_timeout;
    char* end = nullptr;
    o.connect_timeout = std::strtod(v.c_str(), &end);
    if (!end || *end || !(o.connect_timeout > 0 && o.connect_timeout <= 3600))
      throw UsageError("--connect-timeout: '" + v + "' is not a number of seconds in (0, 3600]");
  }
  if (!raw.connect || raw.connect->empty()) throw UsageError("--connect is required");
  o.connect = parse_connect(*raw.connect);
  o.node = raw.slurm ? slurm_node : raw.node.value_or("");
  if (o.node.empty()) throw UsageError("--node NAME or --slurm is required");
  return o;
}

}  // namespace pe
