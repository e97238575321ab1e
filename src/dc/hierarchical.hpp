// Hierarchical allreduce for ranks spread over several nodes, written once for host and device
// memory against the engines of engines.hpp:
//   1. inside each node, the IntraEngine reduce-scatters into `owners` shards (owners = the
//      fewest ranks any node has, so that nodes with unequal rank counts still pair up shard by
//      shard);
//   2. across nodes, the owners of shard j (local rank j on every node) allreduce it, all
//      shards at once, each over its own inter-node Comm; the shard goes in pipeline chunks
//      through the CopyEngine (pipelined_cross): host memory goes on the wire in place, device
//      memory through pinned host buffers;
//   3. inside each node, the IntraEngine allgathers the shards.
// Host memory: the node's shm engine (ShmIntra) or rings over the local Comm (RingIntra) and
// MemcpyCopy (collectives.cpp); device memory: NCCL and cudaMemcpyAsync (gpu/).
//
// The algorithms take the Comms, engines and options they use; ProcessGroup::Impl (group.hpp)
// owns the Comms and chooses the algorithm.  Threads: the thread that runs the group's call.
#pragma once

#include <cstddef>

#include "dc/comm.hpp"
#include "dc/engines.hpp"

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
  const Comm& cross;   // the owners of this local rank's shard, one on every node (host Comm)
  IntraEngine& intra;  // this node's ranks
  CopyEngine& copy;    // the shard's chunks to and from the host memory of the wire
  int owners;          // the fewest ranks any node has: the shards of a piece
  size_t piece_bytes;  // the buffer goes in pieces of this size (the same on every node)
  int contributors;    // the group's size: what Op::Avg divides by
  size_t chunk_bytes;  // pipeline chunk of the cross-node step; 0: a shard is one chunk
};

void hierarchical_allreduce(const NodeLevels& n, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d, const CrossOptions& o);

}  // namespace pytorch_exec::dc
