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
// Where the nodes' locality domains are levels of their own (domain_levels), steps 1 and 3 are a
// NestedIntra: inside each domain, then across the domains of the node (engines.hpp).
// Host memory: the node's shm engine (ShmIntra) or rings over the local Comm (RingIntra) and
// MemcpyCopy (collectives.cpp); device memory: NCCL and cudaMemcpyAsync (gpu/).
//
// The algorithms take the Comms, engines and options they use; ProcessGroup::Impl (group.hpp)
// owns the Comms and chooses the algorithm.  Threads: the thread that runs the group's call, or
// one lane's thread for its slice of it (collectives.cpp: each lane with its own Comms and shm
// lane).
#pragma once

#include <cstddef>
#include <vector>

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

// Whether the locality domains of a group's nodes are levels of their own (NestedIntra), and
// this rank's place in them.  Nested only when the group spans nodes and every node has the same
// layout: more than one domain, the same number of domains, the same number (more than one) of
// ranks in each, local ranks numbered domain by domain (a domain's ranks consecutive), so that a
// shard's owner has the same local rank on every node.  Otherwise (or on one node) not nested:
// the node is one level.  `node_of`, `domain_of`: by group rank (ProcessGroup::Impl's); local
// ranks go by group rank on each node.
struct DomainLevels {
  bool nested = false;
  int domains = 1;     // D, on every node
  int per_domain = 0;  // R, in every domain
  int domain = 0;      // this rank's domain, 0 ... D-1 in local-rank order: its rank on its rail
  int rail = 0;        // this rank's place in its domain, 0 ... R-1: its rank in the domain
};
DomainLevels domain_levels(const std::vector<int>& node_of, const std::vector<int>& domain_of,
                           int rank);

void hierarchical_allreduce(const NodeLevels& n, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d, const CrossOptions& o);

// Reduce-scatter, allgather and broadcast for groups whose nodes all have the same number of
// ranks L and whose ranks go node by node (group rank k * L + j: local rank j of node k; one node
// too), written once for host and device memory.
//   reduce-scatter: (1) inside each node, the IntraBlocks reduce-scatters so that each rank gets
//     its shard, the blocks of its local rank on every node, reduced over its node; (2) across
//     nodes, the ranks of local rank j reduce-scatter their shards (a ring over cross, in
//     pipeline chunks through the CopyEngine), which leaves each its own block;
//   allgather: the reverse: (1) across nodes, the ranks of local rank j allgather their blocks
//     straight into their places (a ring over cross, in place in host memory, else in pipeline
//     chunks through the CopyEngine); (2) inside each node, the IntraBlocks allgathers them.
// Against one ring over all n = N * L ranks: inside a node the data moves through the node's
// engine (shared memory, NCCL) instead of the inter-node transport; across nodes a node sends
// L(N-1) blocks over L connections at once instead of n-1 blocks down one, and a ring takes N-1
// steps instead of n-1.
struct BlockLevels {
  const Comm& cross;   // the ranks of this local rank, member k on node k (N)
  IntraBlocks& intra;  // this node's ranks; level rank: the local rank
  int local_rank, local_size;
  CopyEngine& copy;    // the cross-node chunks to and from host memory
  int contributors;    // the group's size: what Op::Avg divides by
  size_t chunk_bytes;  // pipeline chunk of the cross-node step; 0: one chunk
};
// `in`: every rank's block of `count` elements in group-rank order; `out`: this rank's block;
// `work`: N * count elements of the same memory, overlapping neither (one node: unused).  Op::Avg
// divides by `contributors`.
void hierarchical_reduce_scatter(const BlockLevels& n, const void* in, void* work, void* out,
                                 size_t count, DType t, Op op, const CallHeader& h,
                                 const Deadline& d);
// `in`: this rank's block (may be its place in `out`); `out`: every rank's, in group-rank
// order.
void hierarchical_allgather(const BlockLevels& n, const void* in, void* out, size_t count,
                            DType t, const CallHeader& h, const Deadline& d);

// Broadcast for the same groups: (1) across nodes, the ranks of the root's local rank broadcast from the
// root's node (a tree over their cross Comm, in pipeline chunks through the CopyEngine); (2)
// inside each node, the IntraBlocks broadcasts from that local rank.  The root's node sends the
// buffer once to each other node instead of once per rank.
void hierarchical_broadcast(const BlockLevels& n, void* buf, size_t bytes, int root_node,
                            int root_local, const CallHeader& h, const Deadline& d);

}  // namespace pytorch_exec::dc
