#include "dc/hierarchical.hpp"

#include <algorithm>
#include <vector>

#include "dc/recursive_doubling.hpp"
#include "dc/reduce.hpp"
#include "dc/ring.hpp"

namespace pytorch_exec::dc {

void cross_allreduce(const Comm& c, void* buf, size_t count, DType t, Op op, const CallHeader& h,
                     const Deadline& d, const CrossOptions& o) {
  if (op == Op::Avg) op = Op::Sum;
  if (o.bf16_wire && t == DType::F32) {
    auto* f = static_cast<float*>(buf);
    std::vector<uint16_t> wire(count);
    for (size_t i = 0; i < count; ++i) wire[i] = float_to_bf16(f[i]);
    cross_allreduce(c, wire.data(), count, DType::BF16, op, h, d, {o.small_bytes, false});
    for (size_t i = 0; i < count; ++i) f[i] = bf16_to_float(wire[i]);
    return;
  }
  if (count * dtype_size(t) <= o.small_bytes || count < static_cast<size_t>(c.size()))
    recursive_doubling_allreduce(c, buf, count, t, op, h, d);
  else
    ring_allreduce(c, buf, count, t, op, h, d);
}

namespace {

// One piece of at most the shm slot size: every node cuts the buffer the same way, whether it
// has shared memory (several local ranks) or not, so that the cross-node calls match.
void piece(const NodeLevels& n, char* buf, size_t count, DType t, Op op, const CallHeader& h,
           const Deadline& d, const CrossOptions& o) {
  size_t es = dtype_size(t);
  bool small = count * es <= o.small_bytes;
  int owners = small ? 1 : std::min<int>(n.owners, static_cast<int>(std::max<size_t>(count, 1)));
  auto cross = [&](void* shard, size_t k) {
    cross_allreduce(n.cross, shard, k, t, op, make_header(Kind::Allreduce, k, t, op, h.seq), d, o);
  };
  if (n.engine) {
    n.engine->allreduce(buf, count, t, op, owners, cross, n.contributors, h, d);
    return;
  }
  // Rings inside the node; local ranks from `owners` on own empty blocks.
  const Comm& local = n.local;
  Blocks b = even_blocks(count, owners);
  while (static_cast<int>(b.off.size()) < local.size() + 1) b.off.push_back(count);
  if (local.size() > 1) ring_reduce_scatter(local, buf, b, t, op, h, d);
  char* mine = buf + b.off[static_cast<size_t>(local.me)] * es;
  if (local.me < owners) {
    if (b.count(local.me) > 0) cross(mine, b.count(local.me));
    if (op == Op::Avg) finish_avg(mine, b.count(local.me), t, n.contributors);
  }
  if (local.size() > 1) ring_allgather(local, buf, b, t, h, d);
}

}  // namespace

void hierarchical_allreduce(const NodeLevels& n, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d, const CrossOptions& o) {
  size_t es = dtype_size(t), step = std::max<size_t>(1, n.piece_bytes / es);
  for (size_t off = 0; off < count; off += step)
    piece(n, static_cast<char*>(buf) + off * es, std::min(step, count - off), t, op, h, d, o);
}

}  // namespace pytorch_exec::dc
