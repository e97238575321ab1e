// The plan of the GPU path's levels: the rings (NCCL communicators or host rings) a job builds
// and which shard of the cross-node step each rank owns.  A pure function of each node's
// topology analysis and its ranks' placement (--display-topology, --display-map, --dry-run show
// it).  The DataChannel's GPU path (src/dc/gpu/device.cpp) builds level 3 and, where every node
// has the same domains of the same size with its local ranks numbered domain by domain
// (dc::domain_levels), levels 1 and 2 as NCCL communicators of their own (level 2 always NCCL:
// the shm alternative is not built); with other layouts, one NCCL communicator of each node's
// ranks for levels 1 and 2 together; one node: one NCCL communicator of all ranks.  Its tcp ring
// runs from each rank's first rail NIC that has an IPv4 address (dc::transport_address).
// Levels of several GPUs have not run on GPUs in this project's tests (one GPU has: tests/gpu).
//
//   level 1  inside each locality domain (NVLink island, root complex): NCCL among its ranks;
//   level 2  across the domains of a node: "rail" p joins the p-th rank of every domain (p below
//            the fewest ranks a domain of the node has); NCCL when the rail's GPUs reach each
//            other without crossing the SMP interconnect (no SYS path), else host shared memory;
//   level 3  across nodes: every piece is cut into S shards, S the fewest rail members any node
//            has (rails x domains); shard s is owned, on each node, by the rank of rail s / D in
//            domain s % D (D: the node's domains), and the owners of s on all nodes form a ring
//            over tcp or mpi on pinned host buffers, each through its own (rail-aligned) NICs.
// One node with one domain: one NCCL communicator of all ranks.  Ranks that share a GPU cannot be
// in one NCCL communicator: their level 1 is host shared memory.  Ranks without GPUs: no plan
// (the host path).
#pragma once

#include <string>
#include <vector>

#include "topology/placement.hpp"

namespace pe::topo {

struct NodeRanks {
  const Topology* topology = nullptr;
  const Analysis* analysis = nullptr;
  std::vector<int> ranks;                // global ranks, by local rank
  std::vector<RankPlacement> placement;  // by local rank
};

struct Ring {
  int level = 1;                  // 1 domain, 2 node, 3 across nodes
  std::string engine;             // "nccl", "shm" (host shared memory), "net" (tcp or mpi)
  int node = -1;                  // levels 1 and 2
  int domain = -1;                // level 1
  int index = -1;                 // level 2: the rail; level 3: the shard
  std::vector<int> ranks;         // global ranks, in ring order
  std::vector<std::string> nics;  // level 3: each member's NICs ("mlx5_0,mlx5_1"; "" none)
};

struct GpuPlan {
  bool gpus = false;          // every rank has a GPU: the plan applies
  bool flat = false;          // one node, one domain: one NCCL communicator of all ranks
  int shards = 0;             // of the cross-node step (0 on one node)
  std::vector<Ring> rings;    // by level, node, domain, index; one-rank rings left out (not flat)
  std::vector<int> shard_of;  // by global rank: the cross-node shard it owns, -1 none
  std::string note;           // why there is no plan, or ""
};

GpuPlan plan_gpu_levels(const std::vector<NodeRanks>& nodes);

// The printout, one line per ring: "  level 1 (nccl) node 0 domain 0: ranks 0 1 2 3".
std::string format_gpu_plan(const GpuPlan& p);

}  // namespace pe::topo
