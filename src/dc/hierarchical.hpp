// Hierarchical allreduce for ranks spread over several nodes:
//   1. inside each node, reduce-scatter into `owners` shards (owners = the fewest ranks any node
//      has, so that nodes with unequal rank counts still pair up shard by shard);
//   2. across nodes, the owners of shard j (local rank j on every node) allreduce it, all
//      shards at once, each over its own inter-node Comm;
//   3. inside each node, allgather the shards.
// With shm inside the node, steps 1 and 3 are shm::Node rounds (reads of the other ranks'
// slots); with tcp or mpi inside, they are rings over the local Comm with empty blocks for the
// local ranks that own no shard.
#pragma once

#include "dc/comm.hpp"
#include "dc/group.hpp"

namespace pytorch_exec::dc {

// Allreduce of one shard across nodes: rings for large shards, recursive doubling for small;
// optionally carried as bf16 (f32 only).  Op::Avg is treated as Sum (the caller divides).
void cross_allreduce(const ProcessGroup::Impl& g, const Comm& c, void* buf, size_t count, DType t,
                     Op op, const CallHeader& h, const Deadline& d, bool bf16_wire);

void hierarchical_allreduce(ProcessGroup::Impl& g, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d);

}  // namespace pytorch_exec::dc
