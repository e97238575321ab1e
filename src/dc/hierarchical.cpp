#include "dc/hierarchical.hpp"

#include <algorithm>
#include <vector>

#include "dc/recursive_doubling.hpp"
#include "dc/reduce.hpp"
#include "dc/ring.hpp"

namespace pytorch_exec::dc {

void cross_allreduce(const ProcessGroup::Impl& g, const Comm& c, void* buf, size_t count, DType t,
                     Op op, const CallHeader& h, const Deadline& d, bool bf16_wire) {
  if (op == Op::Avg) op = Op::Sum;
  if (bf16_wire && t == DType::F32) {
    auto* f = static_cast<float*>(buf);
    std::vector<uint16_t> wire(count);
    for (size_t i = 0; i < count; ++i) wire[i] = float_to_bf16(f[i]);
    cross_allreduce(g, c, wire.data(), count, DType::BF16, op, h, d, false);
    for (size_t i = 0; i < count; ++i) f[i] = bf16_to_float(wire[i]);
    return;
  }
  if (count * dtype_size(t) <= g.s.small_bytes || count < static_cast<size_t>(c.size()))
    recursive_doubling_allreduce(c, buf, count, t, op, h, d);
  else
    ring_allreduce(c, buf, count, t, op, h, d);
}

namespace {

// One piece of at most the shm slot size: every node cuts the buffer the same way, whether it
// has shared memory (several local ranks) or not, so that the cross-node calls match.
void piece(ProcessGroup::Impl& g, char* buf, size_t count, DType t, Op op, const CallHeader& h,
           const Deadline& d) {
  size_t es = dtype_size(t);
  bool small = count * es <= g.s.small_bytes;
  int owners = small ? 1 : std::min<int>(g.min_local, static_cast<int>(std::max<size_t>(count, 1)));
  auto cross = [&](void* shard, size_t n) {
    cross_allreduce(g, g.cross_c, shard, n, t, op, make_header(Kind::Allreduce, n, t, op, h.seq), d, g.s.bf16_wire);
  };
  if (g.shm) {
    g.shm->allreduce(buf, count, t, op, owners, cross, g.size, h, d);
    return;
  }
  // Rings inside the node; local ranks from `owners` on own empty blocks.
  Blocks b = even_blocks(count, owners);
  while (static_cast<int>(b.off.size()) < g.local_size + 1) b.off.push_back(count);
  if (g.local_size > 1) ring_reduce_scatter(g.local_c, buf, b, t, op, h, d);
  char* mine = buf + b.off[static_cast<size_t>(g.local_rank)] * es;
  if (g.local_rank < owners) {
    if (b.count(g.local_rank) > 0) cross(mine, b.count(g.local_rank));
    if (op == Op::Avg) finish_avg(mine, b.count(g.local_rank), t, g.size);
  }
  if (g.local_size > 1) ring_allgather(g.local_c, buf, b, t, h, d);
}

}  // namespace

void hierarchical_allreduce(ProcessGroup::Impl& g, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d) {
  size_t es = dtype_size(t), step = std::max<size_t>(1, g.shm_bytes / es);
  for (size_t off = 0; off < count; off += step)
    piece(g, static_cast<char*>(buf) + off * es, std::min(step, count - off), t, op, h, d);
}

}  // namespace pytorch_exec::dc
