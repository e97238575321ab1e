// Join mode's command line: torchrun's rendezvous options (--rdzv-endpoint, --rdzv-id,
// --rdzv-backend, --rdzv-conf, --node-rank, --master-addr, --master-port, --standalone), our own
// (--rdzv-host, --rdzv-secret-file, --rdzv-insecure), and the PET_* variables that the Kubeflow
// training operator sets in a PyTorchJob's pods.  Pure functions, unit-tested without processes;
// the rows of the option table are in cli.cpp with the others.
#pragma once

#include <map>
#include <string>

#include "exec/frontend/cli.hpp"
#include "exec/frontend/launch_config.hpp"

namespace pe {

// Fills the join-mode part of `c` (rdzv_*, node_rank, join_timeout; and --nnodes 1 when not
// given, run_id from the rendezvous id) from `raw`, after the other options were validated.
// Throws UsageError with one sentence naming the option.  Nothing is done (but checking that no
// join-mode option is given alone) when neither --rdzv-endpoint nor --master-addr is given.
void validate_join(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c);

// HOST[:PORT] (HOST may be [IPv6]); `default_port` when no port is given.  Throws UsageError
// naming `opt`.
std::pair<std::string, int> parse_endpoint(const std::string& opt, const std::string& v,
                                           int default_port);

}  // namespace pe
