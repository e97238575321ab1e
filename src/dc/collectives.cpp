// ProcessGroup::Impl::allreduce: which allreduce a group runs, by where its ranks are and how
// large the buffer is:
//   one rank .................................... nothing to do
//   one node, shm ............................... shm::AllreduceEngine rounds (every local rank
//                                                 owns a shard)
//   several nodes sharing ranks, hierarchical ... hierarchical_allreduce on the host engines
//                                                 (the node's shm engine or rings over the
//                                                 local Comm; memcpy copies), in slices on
//                                                 the lanes of the shm engine where the
//                                                 nodes have several (cross_lanes)
//   otherwise ................................... over all ranks: recursive doubling up to
//                                                 small_bytes, a pipelined ring above
// and its reduce_scatter and allgather (broadcast, in process_group.cpp, by the same test):
//   the same number of ranks, more than one, on every node, ranks node by node, and several
//   nodes (hierarchical) or one node with shm ... hierarchical_reduce_scatter /
//                                                 hierarchical_allgather (_broadcast) on the
//                                                 host engines (one node: the shm engine alone)
//   otherwise ................................... a ring (broadcast: a tree) over all ranks
#include <algorithm>
#include <cstring>
#include <optional>

#include "dc/group.hpp"
#include "dc/reduce.hpp"
#include "dc/ring.hpp"

namespace pytorch_exec::dc {

namespace {

// The host engines of the level inside a node: the node's shm engine (or one lane of it),
// else rings over the node's Comm.
struct HostIntra {
  std::optional<ShmIntra> shm;
  std::optional<RingIntra> ring;
  explicit HostIntra(const ProcessGroup::Impl& g) : HostIntra(g, g.engine.get()) {}
  HostIntra(const ProcessGroup::Impl& g, shm::AllreduceEngine* e) {
    if (e)
      shm.emplace(*e);
    else
      ring.emplace(g.local_c);
  }
  IntraEngine& engine() { return shm ? static_cast<IntraEngine&>(*shm) : *ring; }
  IntraBlocks& blocks() { return shm ? static_cast<IntraBlocks&>(*shm) : *ring; }
};

// A hierarchical allreduce takes a lane per this many bytes (ProcessGroup::Impl::cross_lanes).
constexpr size_t kCrossLaneBytes = 1 << 20;

// The work buffer of a reduce_scatter: the group's, kept up to this size; larger ones are the
// call's own.
constexpr size_t kKeptWorkBytes = 256 << 20;

char* work_buffer(std::vector<char>& kept, std::vector<char>& own, size_t bytes) {
  std::vector<char>& v = bytes <= kKeptWorkBytes ? kept : own;
  if (v.size() < bytes) v.resize(bytes);
  return v.data();
}

}  // namespace

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
    auto levels = [&](char* b, size_t cnt, const Comm& cross, shm::AllreduceEngine* e) {
      HostIntra intra(*this, e);
      MemcpyCopy copy(s.pipeline_bytes > 0);
      NodeLevels n{cross, intra.engine(), copy, min_local, shm_bytes, size, s.pipeline_bytes};
      hierarchical_allreduce(n, b, cnt, t, op, h, d, o);
    };
    // In lanes (at least kCrossLaneBytes each): slices of whole pages, the same on every node;
    // lane l's through lane l of the node's shm engine and across nodes over lane l's own
    // connections, on that lane's thread.
    size_t es = dtype_size(t), n = std::min<size_t>(static_cast<size_t>(cross_lanes),
                                                    count * es / kCrossLaneBytes);
    if (n <= 1) return levels(static_cast<char*>(buf), count, cross_c, engine.get());
    size_t unit = 4096 / es, per = count / n / unit * unit;
    // An error in one lane aborts this rank's shm lanes (run_lanes), which ends the waits of
    // its other lanes and of the other local ranks' lanes; and the lane's own connections
    // across nodes at once (on its own thread: the lane alone uses them), which ends the waits
    // of its partners there, who may be waiting for it while it waits for nothing (guarded()
    // aborts them all once every lane has returned).
    engine->run_lanes(n, [&](size_t l) {
      size_t first = l * per, cnt = l + 1 == n ? count - first : per;
      const Comm& cross = l == 0 ? cross_c : lane_c[l - 1];
      try {
        levels(static_cast<char*>(buf) + first * es, cnt, cross,
               &engine->lane(static_cast<int>(l)));
      } catch (const std::exception& e) {
        if (l == 0 || !cross.members.empty()) cross.t->abort(e.what());  // this lane's own
        throw;
      }
    });
    return;
  }
  o.bf16_wire = o.bf16_wire && nodes > 1;
  cross_allreduce(flat_c, buf, count, t, op, h, d, o);
  if (op == Op::Avg) finish_avg(buf, count, t, size);
}

bool ProcessGroup::Impl::blocks_by_level() const {
  return node_major && local_size > 1 && (nodes > 1 ? s.hierarchical : engine != nullptr);
}

void ProcessGroup::Impl::host_blocks(const std::function<void(const BlockLevels&)>& run) {
  HostIntra intra(*this);
  MemcpyCopy copy(s.pipeline_bytes > 0);
  run(BlockLevels{cross_c, intra.blocks(), local_rank, local_size, copy, size, s.pipeline_bytes});
}

void ProcessGroup::Impl::reduce_scatter(const void* in, void* out, size_t count, DType t, Op op,
                                        const Deadline& d) {
  auto h = make_header(Kind::ReduceScatter, count, t, op, ++seq);
  size_t es = dtype_size(t), total = count * es * static_cast<size_t>(size);
  std::vector<char> own;
  if (blocks_by_level()) {
    char* w = nodes > 1 ? work_buffer(work, own, count * es * static_cast<size_t>(nodes)) : nullptr;
    host_blocks([&](const BlockLevels& levels) {
      hierarchical_reduce_scatter(levels, in, w, out, count, t, op, h, d);
    });
    return;
  }
  char* w = work_buffer(work, own, total);
  std::memcpy(w, in, total);
  ring_reduce_scatter(flat_c, w, uniform_blocks(count, size), t, op, h, d);
  char* mine = w + static_cast<size_t>(rank) * count * es;
  if (op == Op::Avg) finish_avg(mine, count, t, size);
  std::memcpy(out, mine, count * es);
}

void ProcessGroup::Impl::allgather(const void* in, void* out, size_t count, DType t,
                                   const Deadline& d) {
  auto h = make_header(Kind::Allgather, count, t, Op::Sum, ++seq);
  size_t es = dtype_size(t);
  if (blocks_by_level()) {
    host_blocks([&](const BlockLevels& levels) {
      hierarchical_allgather(levels, in, out, count, t, h, d);
    });
    return;
  }
  std::memmove(static_cast<char*>(out) + static_cast<size_t>(rank) * count * es, in, count * es);
  ring_allgather(flat_c, out, uniform_blocks(count, size), t, h, d);
}

}  // namespace pytorch_exec::dc
