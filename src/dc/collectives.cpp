// ProcessGroup::Impl::allreduce: which allreduce a group runs, by where its ranks are and how
// large the buffer is:
//   one rank .................................... nothing to do
//   one node, shm ............................... shm::AllreduceEngine rounds (every local rank
//                                                 owns a shard)
//   several nodes sharing ranks, hierarchical ... hierarchical_allreduce on the host engines
//                                                 (the node's shm engine or rings over the
//                                                 local Comm; memcpy copies)
//   otherwise ................................... over all ranks: recursive doubling up to
//                                                 small_bytes, a pipelined ring above
#include <algorithm>
#include <optional>

#include "dc/group.hpp"
#include "dc/reduce.hpp"

namespace pytorch_exec::dc {

void ProcessGroup::Impl::allreduce(void* buf, size_t count, DType t, Op op, const Deadline& d) {
  auto h = make_header(Kind::Allreduce, count, t, op, ++seq);
  if (size == 1) return;
  CrossOptions o{s.small_bytes, s.bf16_wire};
  if (nodes == 1 && engine) {
    size_t owners = std::min<size_t>(static_cast<size_t>(local_size), std::max<size_t>(count, 1));
    engine->allreduce(buf, count, t, op, static_cast<int>(owners), {}, size, h, d);
    return;
  }
  if (nodes > 1 && max_local > 1 && s.hierarchical) {
    std::optional<ShmIntra> shm_intra;
    std::optional<RingIntra> ring_intra;
    IntraEngine& intra = engine ? static_cast<IntraEngine&>(shm_intra.emplace(*engine))
                                : ring_intra.emplace(local_c);
    MemcpyCopy copy(s.pipeline_bytes > 0);
    NodeLevels levels{cross_c, intra, copy, min_local, shm_bytes, size, s.pipeline_bytes};
    hierarchical_allreduce(levels, buf, count, t, op, h, d, o);
    return;
  }
  o.bf16_wire = o.bf16_wire && nodes > 1;
  cross_allreduce(flat_c, buf, count, t, op, h, d, o);
  if (op == Op::Avg) finish_avg(buf, count, t, size);
}

}  // namespace pytorch_exec::dc
