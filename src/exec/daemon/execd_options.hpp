// The pytorch_execd command line, parsed with the same option table machinery as pytorch_exec's
// (option_table.hpp):
//   pytorch_execd --connect ADDR:PORT[,ADDR:PORT...] (--node NAME | --slurm)
//                 [--secret-stdin | --secret-file FILE] [--connect-timeout SECONDS]
//                 [--heartbeat-interval SECONDS] [--heartbeat-timeout SECONDS]
// Parsing and validation are pure; reading the secret is left to main_execd.cpp.
#pragma once

#include <optional>
#include <string>

#include "exec/daemon/daemon.hpp"

namespace pe {

// The options as typed.
struct ExecdRawOptions {
  bool help = false;
  bool version = false;
  std::optional<std::string> connect;
  std::optional<std::string> node;
  bool slurm = false;
  bool secret_stdin = false;
  std::optional<std::string> secret_file;
  std::optional<std::string> connect_timeout;
  std::optional<std::string> heartbeat_interval;
  std::optional<std::string> heartbeat_timeout;
};

// Parses argv (argv[0] is pytorch_execd itself).  Throws UsageError (one line) for unknown
// options, missing values and stray words.
ExecdRawOptions parse_execd_command_line(int argc, const char* const* argv);

std::string execd_help_text();

// Everything of DaemonOptions but the secret.  `slurm_node` is the node's name under --slurm
// (SLURMD_NODENAME, else the host name).  Throws UsageError naming the option.
DaemonOptions validate_execd_options(const ExecdRawOptions& raw, const std::string& slurm_node);

}  // namespace pe
