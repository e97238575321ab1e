// Pieces of the command line's validation (cli.cpp) shared with mapping_options.cpp, which
// checks the placement options.  Not an interface of its own: validate_options is.
#pragma once

#include <cstddef>
#include <string>

#include "common/error.hpp"
#include "exec/frontend/cli.hpp"
#include "topology/placement_choices.hpp"

namespace pe::cli_detail {

// A count of at least `min`, else a UsageError naming `opt` (and `expected`, when given).
int parse_count(const std::string& opt, const std::string& v, long long min,
                const std::string& expected = "");

// Ranks are counted per node (-N, --nproc-per-node, ppr): -H, --hostfile, a SLURM allocation
// (not in join mode, where each node's pytorch_exec runs its own).
bool several_nodes(const RawOptions& raw, const ValidationContext& ctx);

// The choice spelled `v`, or a UsageError naming `opt` and every choice.
template <typename E, size_t N>
E one_of(const std::string& opt, const std::string& v, const E (&choices)[N]) {
  if (auto e = topo::find_choice(choices, v)) return *e;
  std::string list;
  for (E e : choices) list += (list.empty() ? "" : ", ") + std::string(topo::to_string(e));
  throw UsageError(opt + ": expected one of " + list + ", got '" + v + "'");
}

// --map-by, --rank-by, --bind-to, Open MPI's spellings, --gpus-per-rank, the display options,
// --topology-file.
void validate_mapping(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c);
// --rankfile (after the counts and the mapping).
void validate_rankfile(const RawOptions& raw, LaunchConfig& c);
// --cpu-set, --cpu-list and --bind-to cpu-list (after the rankfile).
void validate_cpu_lists(const RawOptions& raw, const ValidationContext& ctx, LaunchConfig& c);

}  // namespace pe::cli_detail
