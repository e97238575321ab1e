// Where a job may run: the local machine, a SLURM allocation (SLURM_JOB_NODELIST,
// SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE), a hostfile (--hostfile) or a host list (-H).
// Parsers are pure and throw UsageError with one sentence (and the line, for files).
#pragma once

#include <istream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "exec/frontend/launch_config.hpp"

namespace pe {

struct HostSlots {
  std::string host;
  int slots = 1;
};

struct Allocation {
  std::string source;            // "this machine", "SLURM job 42", "hostfile F", "-H"
  std::vector<HostSlots> nodes;  // in order; a host appears once
  bool limited = false;          // slots are limits (allocations, hostfiles, -H)
  bool slurm = false;            // SLURM's allocation: daemons are started with srun
  int total_slots() const;
};

// SLURM hostlist syntax: "n[1-4,7]", "gpu-[01-03]", "a[1-2]-ib,b3", "r[1-2]n[1-2]".
std::vector<std::string> expand_hostlist(const std::string& list);
// "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> expand_counts(const std::string& what, const std::string& spec);
// Open MPI hostfile: "host", "host slots=N [max_slots=M]", "host:N"; '#' comments, blank lines;
// a host listed twice adds up.  `name` is used in error messages.
std::vector<HostSlots> parse_hostfile(std::istream& in, const std::string& name);
// Its lines, '#' comments and blank lines skipped, sorted by rank, which must be 0 ... N-1 each
// once (N: the lines).  `name` in error messages; slot lists are checked by the caller.
std::vector<RankfileLine> parse_rankfile(std::istream& in, const std::string& name);

// -H "a,b:3,a" (one slot per mention unless :N is given; duplicates add up).
std::vector<HostSlots> parse_host_list(const std::string& spec);
// Whether SLURM_STEP_ID names a step srun started with tasks (0, 1, ...).  SLURM 22.05 gives its
// special steps ids from 0xfffffff0 up: interactive 0xfffffffa (salloc with
// LaunchParameters=use_interactive_step), batch 0xfffffffb, extern 0xfffffffc, pending
// 0xfffffffd, the old batch 0xfffffffe.  An empty or unparsable id is no task step either.
bool is_task_step_id(const std::string& step_id);

// The SLURM allocation this process runs in, if any: SLURM_JOB_NODELIST with SLURM_TASKS_PER_NODE
// (salloc, sbatch) or, in a step's shell (`srun --pty bash`), whose SLURM_TASKS_PER_NODE is the
// step's, SLURM_JOB_CPUS_PER_NODE (mpirun's choice).
std::optional<Allocation> slurm_allocation(const std::map<std::string, std::string>& env);
// The nodes of that allocation; none when there is none or its variables disagree.
std::vector<std::string> slurm_nodes(const std::map<std::string, std::string>& env);

// The allocation of a launch: -H, else --hostfile, else SLURM, else this machine (`host`,
// unlimited).  Throws UsageError (unreadable hostfile, malformed lists; `hostfile_option`: how
// the hostfile was given).
Allocation find_allocation(const std::string& hosts, const std::string& hostfile,
                           const std::map<std::string, std::string>& env, const std::string& host,
                           const std::string& hostfile_option = "--hostfile");

// Whether `name` is this machine (localhost, 127.0.0.1, its host name or short host name).
bool is_local_host(const std::string& name, const std::string& hostname);

// mpirun's --nolocal: `hosts` without this machine (`hostname`).
std::vector<HostSlots> without_local_host(std::vector<HostSlots> hosts,
                                          const std::string& hostname);
// The same for a launch's allocation; UsageError when it is this machine alone, or when no node
// is left unless `may_wait` (an elastic job's sources may list more later).
Allocation without_local_host(Allocation a, const std::string& hostname, bool may_wait);

// --display-allocation: a header naming the source, then "  HOST slots=N" per node (slots
// "unlimited" on this machine without a list).
std::string format_allocation(const Allocation& a);

}  // namespace pe
