// MPI_Comm_spawn's side of a job: where the processes a rank asks for go (SpawnJob), and what
// every node needs to run its part of them.  The placement is a pure function, used by the
// node runner of a single-node job and by the front end of a multi-node one.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "exec/frontend/job_map.hpp"
#include "pmix_rdzv/pmix_server.hpp"

namespace pe {

// A spawn request that cannot be met (one sentence, for the user).
class SpawnError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One spawned job of a generation: its namespace, the process that asked, its applications
// (programs resolved) and where its ranks run.  `map` names only the nodes that get ranks.
struct SpawnJob {
  std::string nspace;
  int generation = 0;
  int number = 1;  // the generation's first spawned job is 1
  std::string parent_nspace;
  int parent_rank = 0;
  std::vector<pmix::SpawnApp> apps;  // cmd: the resolved program
  std::vector<int> appnum;           // by rank
  JobMap map;
  int universe_size = 0;
};

// "pytorch_exec.<job>.<generation>.spawn<number>"
std::string spawn_namespace(const std::string& job_nspace, int number);

// Places the ranks of `req` on the nodes of `gen` (the running generation's map; a node's
// `slots` of 0 is no limit), where `used[i]` processes already run on node i.  Apps are placed
// in order, each on its "host" nodes or on every node of the job, filling free slots node by
// node; beyond the free slots only with `oversubscribe` (or on nodes without a limit).  A "host"
// must be one of the job's nodes or, with `add_hosts` (a job with daemons, which can start one
// there), one of gen.spawn_hosts: node gen.nodes.size() + j of `used` and of the placement is
// gen.spawn_hosts[j].  Throws SpawnError.
SpawnJob plan_spawn(const pmix::SpawnRequest& req, const JobMap& gen, const std::vector<int>& used,
                    bool oversubscribe, bool add_hosts = false);

// The program of an app: an absolute path, a path relative to `cwd`, or found on `path`.
// Throws SpawnError when it is not an executable file.
std::string resolve_spawn_program(const std::string& cmd, const std::string& cwd,
                                  const std::string& path);

}  // namespace pe
