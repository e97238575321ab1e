// Direct launch: `srun --mpi=pmix -N 4 -n 8 pytorch_exec ./train`.  Every task of the step is a
// pytorch_exec; none starts daemons.  Each takes its identity from what slurmstepd gave the task
// (PMIX_RANK from its PMIx server, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, the step's node list
// and tasks per node), builds the same worker environment as a launched job, and execs the
// program in place.
//
// The DataChannel's token (PYTORCH_DC_TOKEN) has no launcher to make it: the tasks agree on one
// through SLURM's PMIx server, which only this step's processes reach (step_shared).  That is
// done by a short-lived child process, not by pytorch_exec itself: the exec'd program must find
// the server as a task that never connected.  SLURM 22.05's server (PMIx 4.2) hands a task's
// job data to it once per data-store module: a second client of the task with the same module
// (ds21, the default) gets none, and Open MPI 4.1's MPI_Init fails without it (tested under
// srun --mpi=pmix).  So the child uses the ds12 module, which no client picks by default.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "exec/frontend/job_map.hpp"
#include "exec/frontend/launch_config.hpp"
#include "exec/node/worker_env.hpp"

namespace pe {

struct StepIdentity {
  std::string source;  // "PMIx" (srun --mpi=pmix) or "SLURM" (no PMIx)
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::vector<int> local_peers;  // global ranks on this node, in local-rank order (SLURM_GTIDS)
  int node = 0;
  int nnodes = 1;
  std::string master_host;  // rank 0's host as far as SLURM's variables tell (see step_shared)
  std::string job_id, step_id;
};

// Whether this process (pid `self`) is a task of a SLURM job step: not a rank of a pytorch_exec
// job, nor a command typed in the shell of an allocation's interactive or batch step, nor one
// typed in a shell that srun started on a terminal (`srun --pty bash`: SLURM_PTY_PORT, and the
// step's task, SLURM_TASK_PID, is not this process but one whose stdin is a terminal: the
// shell).  pytorch_exec starts the ranks itself in those shells, as it does in salloc's.
bool is_step_task(const EnvMap& env, long self);

// The task's identity.  Throws Error when the variables are missing or disagree.
StepIdentity step_identity(const EnvMap& env);

// The job map of the step as far as this task needs it (its own node in full).
JobMap step_map(const StepIdentity& id);

// MASTER_PORT of a step: the same on every task, derived from the job and step ids, outside the
// kernel's ephemeral range (port_outside_ephemeral).  Not checked: the tasks cannot agree on
// another one without talking to each other.
int step_master_port(const std::string& job_id, const std::string& step_id);

// What the step's tasks agree on through SLURM's PMIx server (a child process that is a PMIx
// client of this task: rank 0 puts a random token and `node`, its node's name, a collecting
// fence, every task gets them), within `timeout` seconds.  Throws Error (one line) when that
// fails.
struct StepShared {
  std::string token;   // for PYTORCH_DC_TOKEN
  std::string master;  // rank 0's node, for MASTER_ADDR (any distribution: -m arbitrary too)
};
StepShared step_shared(double timeout, const std::string& node);

// Rejects options that contradict the step (-n other than its size, -H, --hostfile, ...), builds
// the environment and execs the program.  Returns only by throwing.
[[noreturn]] void direct_exec(const LaunchConfig& cfg, const EnvMap& env, const StepIdentity& id);

}  // namespace pe
