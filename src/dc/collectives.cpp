// Which allreduce a group runs, by where its ranks are and how large the buffer is:
//   one rank .................................... nothing to do
//   one node, shm ............................... shm::Node rounds (every local rank owns a shard)
//   several nodes sharing ranks, hierarchical ... hierarchical_allreduce
//   otherwise ................................... over all ranks: recursive doubling up to
//                                                 small_bytes, a pipelined ring above
#include "dc/group.hpp"
#include "dc/hierarchical.hpp"
#include "dc/reduce.hpp"

namespace pytorch_exec::dc {

void group_allreduce(ProcessGroup::Impl& g, void* buf, size_t count, DType t, Op op, const Deadline& d) {
  auto h = make_header(Kind::Allreduce, count, t, op, ++g.seq);
  if (g.size == 1) return;
  if (g.nodes == 1 && g.shm) {
    int owners = static_cast<int>(std::min<size_t>(static_cast<size_t>(g.local_size), std::max<size_t>(count, 1)));
    g.shm->allreduce(buf, count, t, op, owners, {}, g.size, h, d);
    return;
  }
  if (g.nodes > 1 && g.max_local > 1 && g.s.hierarchical) {
    hierarchical_allreduce(g, buf, count, t, op, h, d);
    return;
  }
  cross_allreduce(g, g.flat_c, buf, count, t, op, h, d, g.s.bf16_wire && g.nodes > 1);
  if (op == Op::Avg) finish_avg(buf, count, t, g.size);
}

}  // namespace pytorch_exec::dc
