// Ring collectives: reduce-scatter and allgather around the members of a Comm, and allreduce as
// the two in a row.  The buffer is cut into one block per member (any boundaries, empty blocks
// allowed: a hierarchical allreduce gives blocks only to some members) and each block into
// chunks; a chunk is sent on as soon as it has been reduced, so the reduction of one chunk
// overlaps the transfer of the next, and the allgather receives straight into place.
#pragma once

#include <cstddef>
#include <vector>

#include "dc/comm.hpp"

namespace pytorch_exec::dc {

// Block i has off[i+1] - off[i] elements (off has size()+1 entries) and starts at element off[i]
// of the buffer, or at at[i] where `at` is given (blocks apart from each other, e.g. one rank's
// block of every node in a buffer laid out node by node).
struct Blocks {
  std::vector<size_t> off, at;
  size_t count(int i) const {
    return off[static_cast<size_t>(i) + 1] - off[static_cast<size_t>(i)];
  }
  size_t first(int i) const {
    return at.empty() ? off[static_cast<size_t>(i)] : at[static_cast<size_t>(i)];
  }
};
// `count` elements over `n` blocks as evenly as possible; even_first is where block j starts.
Blocks even_blocks(size_t count, int n);
size_t even_first(size_t count, int n, int j);
// `n` blocks of `per_block` elements each (reduce_scatter and allgather of the API).
Blocks uniform_blocks(size_t per_block, int n);

// Afterwards block `me` of buf holds the reduction of every member's block `me`.  Avg sums.
void ring_reduce_scatter(const Comm& c, void* buf, const Blocks& b, DType t, Op op,
                         const CallHeader& h, const Deadline& d);
// Block `me` of buf is this member's; afterwards every block holds its owner's.
void ring_allgather(const Comm& c, void* buf, const Blocks& b, DType t, const CallHeader& h,
                    const Deadline& d);
// In place.  Avg sums; the caller divides.
void ring_allreduce(const Comm& c, void* buf, size_t count, DType t, Op op, const CallHeader& h,
                    const Deadline& d);

}  // namespace pytorch_exec::dc
