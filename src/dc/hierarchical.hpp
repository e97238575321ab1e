// Hierarchical allreduce for ranks spread over several nodes:
//   1. inside each node, reduce-scatter into `owners` shards (owners = the fewest ranks any node
//      has, so that nodes with unequal rank counts still pair up shard by shard);
//   2. across nodes, the owners of shard j (local rank j on every node) allreduce it, all
//      shards at once, each over its own inter-node Comm;
//   3. inside each node, allgather the shards.
// With shm inside the node, steps 1 and 3 are rounds of the node's shm::AllreduceEngine (reads
// of the other ranks' slots); with tcp or mpi inside, they are rings over the local Comm with
// empty blocks for the local ranks that own no shard.
//
// The algorithms take the Comms and options they use; ProcessGroup::Impl (group.hpp) owns them
// and chooses the algorithm (collectives.cpp).  Threads: the thread that runs the group's call.
#pragma once

#include <cstddef>

#include "dc/comm.hpp"
#include "dc/shm/engine.hpp"

namespace pytorch_exec::dc {

// The choices of an allreduce across nodes; the same on every rank (from Settings).
struct CrossOptions {
  size_t small_bytes = 32 << 10;  // recursive doubling up to this many bytes, rings above
  bool bf16_wire = false;         // carry f32 as bf16 (f32 buffers only)
};

// Allreduce of one shard across nodes: rings for large shards, recursive doubling for small;
// optionally carried as bf16.  Op::Avg is treated as Sum (the caller divides).
void cross_allreduce(const Comm& c, void* buf, size_t count, DType t, Op op, const CallHeader& h,
                     const Deadline& d, const CrossOptions& o);

// The levels of a group that spans nodes, as the hierarchical allreduce uses them.
struct NodeLevels {
  const Comm& local;             // this node's ranks (over the node's point-to-point transport)
  const Comm& cross;             // the owners of this local rank's shard, one on every node
  shm::AllreduceEngine* engine;  // the node's shared memory, or nullptr: rings over `local`
  int owners;                    // the fewest ranks any node has: the shards of a piece
  size_t piece_bytes;            // the buffer goes in pieces of this size (the shm slot)
  int contributors;              // the group's size: what Op::Avg divides by
};

void hierarchical_allreduce(const NodeLevels& n, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d, const CrossOptions& o);

}  // namespace pytorch_exec::dc
