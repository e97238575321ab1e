#include "dc/hierarchical.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "dc/recursive_doubling.hpp"
#include "dc/reduce.hpp"
#include "dc/ring.hpp"
#include "dc/tree.hpp"

namespace pytorch_exec::dc {

namespace {

// The header of a cross-node step of `part` elements: the call's, so that nodes whose calls
// differ raise whatever steps of them happen to match, with the step's size, so that nodes that
// cut a call differently raise too.
CallHeader cross_header(const CallHeader& h, size_t part, int root = 0) {
  CallHeader c = h;
  c.root = static_cast<uint8_t>(root);
  c.part = part;
  return c;
}

}  // namespace

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

void RingIntra::allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                          int avg_divisor, const CallHeader& h, const Deadline& d) {
  size_t es = dtype_size(t);
  Blocks b = even_blocks(count, owners);
  while (static_cast<int>(b.off.size()) < local_.size() + 1) b.off.push_back(count);
  if (local_.size() > 1) ring_reduce_scatter(local_, buf, b, t, op, h, d);
  char* mine = static_cast<char*>(buf) + b.off[static_cast<size_t>(local_.me)] * es;
  if (local_.me < owners) {
    if (b.count(local_.me) > 0 && cross) cross(mine, b.count(local_.me));
    if (op == Op::Avg) finish_avg(mine, b.count(local_.me), t, avg_divisor);
  }
  if (local_.size() > 1) ring_allgather(local_, buf, b, t, h, d);
}

bool RingIntra::reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t,
                               Op op, int, const CallHeader& h, const Deadline& d) {
  size_t bb = block * dtype_size(t), n = static_cast<size_t>(local_.size());
  std::vector<char> work(n * bb);
  for (size_t g = 0; g < groups; ++g) {
    const char* group = static_cast<const char*>(in) + g * n * bb;
    std::memcpy(work.data(), group, n * bb);
    ring_reduce_scatter(local_, work.data(), uniform_blocks(block, local_.size()), t, op, h, d);
    std::memcpy(static_cast<char*>(out) + g * bb,
                work.data() + static_cast<size_t>(local_.me) * bb, bb);
  }
  return false;  // the ring sums an Avg
}

void RingIntra::allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                          const CallHeader& h, const Deadline& d) {
  size_t bb = block * dtype_size(t), n = static_cast<size_t>(local_.size());
  for (size_t g = 0; g < groups; ++g) {
    char* group = static_cast<char*>(out) + g * n * bb;
    char* mine = group + static_cast<size_t>(local_.me) * bb;
    const char* own = in ? static_cast<const char*>(in) + g * bb : mine;
    if (mine != own) std::memmove(mine, own, bb);
    ring_allgather(local_, group, uniform_blocks(block, local_.size()), t, h, d);
  }
}

void RingIntra::broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                          const Deadline& d) {
  tree_broadcast(local_, buf, bytes, root, h, d);
}

void NestedIntra::allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                            int avg_divisor, const CallHeader& h, const Deadline& d) {
  int parts = std::clamp(owners, 1, domains_);
  int rails = std::clamp(owners / parts, 1, per_domain_);
  Cross rail = [&](void* shard, size_t k) {
    rail_.allreduce(shard, k, t, op, parts, cross, avg_divisor, h, d);
  };
  domain_.allreduce(buf, count, t, op == Op::Avg ? Op::Sum : op, rails, rail, avg_divisor, h, d);
}

DomainLevels domain_levels(const std::vector<int>& node_of, const std::vector<int>& domain_of,
                           int rank) {
  DomainLevels none, mine;
  int nodes = node_of.empty() ? 0 : *std::max_element(node_of.begin(), node_of.end()) + 1;
  if (nodes < 2 || domain_of.size() != node_of.size()) return none;
  // Each node's domains in local-rank order, as runs of consecutive equal values.
  std::vector<std::vector<int>> runs(static_cast<size_t>(nodes));  // the runs' lengths
  std::vector<std::vector<int>> seen(static_cast<size_t>(nodes));  // the runs' domains
  std::vector<int> local(node_of.size()), ranks_on(static_cast<size_t>(nodes));
  for (size_t r = 0; r < node_of.size(); ++r) {
    auto n = static_cast<size_t>(node_of[r]);
    local[r] = ranks_on[n]++;
    if (seen[n].empty() || seen[n].back() != domain_of[r]) {
      // A domain whose ranks are not consecutive: its ranks' local ranks would not line up.
      if (std::find(seen[n].begin(), seen[n].end(), domain_of[r]) != seen[n].end()) return none;
      seen[n].push_back(domain_of[r]);
      runs[n].push_back(0);
    }
    ++runs[n].back();
  }
  for (auto& v : runs)
    if (v != runs[0]) return none;
  const auto& layout = runs[0];
  if (layout.size() < 2 || layout[0] < 2) return none;
  for (int k : layout)
    if (k != layout[0]) return none;
  mine.nested = true;
  mine.domains = static_cast<int>(layout.size());
  mine.per_domain = layout[0];
  mine.domain = local[static_cast<size_t>(rank)] / mine.per_domain;
  mine.rail = local[static_cast<size_t>(rank)] % mine.per_domain;
  return mine;
}

void* MemcpyCopy::host(int slot, void* src, size_t bytes) {
  if (!staged_ && src) return src;
  auto& s = slots_[slot];
  if (s.size() < bytes) s.resize(bytes);
  return s.data();
}

void MemcpyCopy::to_host(int, void* host, const void* src, size_t bytes) {
  if (host != src) std::memcpy(host, src, bytes);
}

void MemcpyCopy::to_device(int, void* dst, const void* host, size_t bytes) {
  if (dst != host) std::memcpy(dst, host, bytes);
}

ChunkPlan plan_chunks(size_t count, size_t elem_bytes, size_t chunk_bytes) {
  ChunkPlan p;
  if (count == 0) return p;
  p.chunk_elems = chunk_bytes == 0 ? count : std::max<size_t>(1, chunk_bytes / elem_bytes);
  p.chunk_elems = std::min(p.chunk_elems, count);
  p.chunks = (count + p.chunk_elems - 1) / p.chunk_elems;
  return p;
}

void pipelined_steps(CopyEngine& copy, const ChunkSteps& s, const Deadline& d) {
  if (s.chunks == 0) return;
  auto slot = [](size_t i) { return static_cast<int>(i % kCopySlots); };
  char* host[kCopySlots] = {};  // of the chunk in each slot (no allocation per call)
  auto stage = [&](size_t i) {
    host[slot(i)] = static_cast<char*>(copy.host(slot(i), s.place(i), s.bytes(i)));
    s.up(i, slot(i), host[slot(i)]);
  };
  copy.begin(d);
  stage(0);
  for (size_t i = 0; i < s.chunks; ++i) {
    if (i + 1 < s.chunks) {
      // The slot of chunk i+1 was chunk i-2's: its copies back must be done before it is refilled.
      if (i + 1 >= static_cast<size_t>(kCopySlots)) copy.wait_to_device(slot(i + 1), d);
      stage(i + 1);
    }
    copy.wait_to_host(slot(i), d);
    s.wire(i, host[slot(i)]);
    s.down(i, slot(i), host[slot(i)]);
  }
  size_t tail = std::min<size_t>(s.chunks, kCopySlots);
  for (size_t i = s.chunks - tail; i < s.chunks; ++i) copy.wait_to_device(slot(i), d);
  copy.end(d);
}

void pipelined_cross(CopyEngine& copy, const Wire& wire, void* shard, size_t count,
                     size_t elem_bytes, size_t chunk_bytes, const Deadline& d) {
  ChunkPlan p = plan_chunks(count, elem_bytes, chunk_bytes);
  auto* base = static_cast<char*>(shard);
  auto src = [&](size_t i) { return base + p.first(i) * elem_bytes; };
  auto bytes = [&](size_t i) { return p.count(i, count) * elem_bytes; };
  ChunkSteps s;
  s.chunks = p.chunks;
  s.bytes = bytes;
  s.place = src;
  s.up = [&](size_t i, int slot, char* host) { copy.to_host(slot, host, src(i), bytes(i)); };
  s.wire = [&](size_t i, char* host) { wire(host, p.count(i, count)); };
  s.down = [&](size_t i, int slot, char* host) { copy.to_device(slot, src(i), host, bytes(i)); };
  pipelined_steps(copy, s, d);
}

void hierarchical_allreduce(const NodeLevels& n, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d, const CrossOptions& o) {
  size_t es = dtype_size(t), step = std::max<size_t>(1, n.piece_bytes / es);
  auto wire = [&](void* host, size_t k) {
    cross_allreduce(n.cross, host, k, t, op, cross_header(h, k), d, o);
  };
  auto cross = [&](void* shard, size_t k) {
    pipelined_cross(n.copy, wire, shard, k, es, n.chunk_bytes, d);
  };
  // Every node cuts the buffer into the same pieces, whatever its intra engine, so that the
  // cross-node calls match.
  for (size_t off = 0; off < count; off += step) {
    size_t m = std::min(step, count - off);
    bool small = m * es <= o.small_bytes;
    int owners = small ? 1 : std::min<int>(n.owners, static_cast<int>(std::max<size_t>(m, 1)));
    n.intra.allreduce(static_cast<char*>(buf) + off * es, m, t, op, owners, cross, n.contributors,
                      h, d);
  }
}

namespace {

// The chunks of a cross-node step over the N blocks of `count` elements of a shard: about
// chunk_bytes of host memory each, N blocks' parts side by side (0: one chunk).
ChunkPlan block_plan(const BlockLevels& n, size_t count, size_t es) {
  size_t per_block = n.chunk_bytes / static_cast<size_t>(n.cross.size());
  return plan_chunks(count, es, n.chunk_bytes == 0 ? 0 : std::max(per_block, es));
}

// Their steps' sizes: chunk i takes elements [f, f + c) of each block, N * c elements of host
// memory; with one chunk, `place` is that memory where the engine does not stage.
ChunkSteps block_chunks(const ChunkPlan& p, size_t nodes, size_t count, size_t es, void* place) {
  ChunkSteps s;
  s.chunks = p.chunks;
  s.bytes = [p, nodes, count, es](size_t i) { return nodes * p.count(i, count) * es; };
  s.place = [one = p.chunks == 1, place](size_t) { return one ? place : nullptr; };
  return s;
}

}  // namespace

void hierarchical_reduce_scatter(const BlockLevels& n, const void* in, void* work, void* out,
                                 size_t count, DType t, Op op, const CallHeader& h,
                                 const Deadline& d) {
  size_t es = dtype_size(t), bb = count * es;
  auto nodes = static_cast<size_t>(n.cross.size());
  auto* o = static_cast<char*>(out);
  if (nodes == 1) {
    if (!n.intra.reduce_scatter(in, o, count, 1, t, op, n.contributors, h, d) && op == Op::Avg)
      finish_avg(o, count, t, n.contributors);
    return;
  }
  // The shard: this local rank's block of every node, each reduced over this node.
  auto* shard = static_cast<char*>(work);
  bool divided = n.intra.reduce_scatter(in, shard, count, nodes, t, op, n.contributors, h, d);
  // Chunk i: elements [f, f + c) of each of the shard's N blocks, side by side in host memory;
  // a ring reduce-scatter leaves node k's block reduced on node k.
  ChunkPlan p = block_plan(n, count, es);
  auto me = static_cast<size_t>(n.cross.me);
  ChunkSteps s = block_chunks(p, nodes, count, es, shard);
  s.up = [&](size_t i, int slot, char* host) {
    size_t c = p.count(i, count) * es, f = p.first(i) * es;
    for (size_t k = 0; k < nodes; ++k) n.copy.to_host(slot, host + k * c, shard + k * bb + f, c);
  };
  s.wire = [&](size_t i, char* host) {
    size_t c = p.count(i, count);
    ring_reduce_scatter(n.cross, host, uniform_blocks(c, n.cross.size()), t, op,
                        cross_header(h, c), d);
  };
  s.down = [&](size_t i, int slot, char* host) {
    size_t c = p.count(i, count) * es;
    n.copy.to_device(slot, o + p.first(i) * es, host + me * c, c);
  };
  pipelined_steps(n.copy, s, d);
  if (op == Op::Avg && !divided) finish_avg(o, count, t, n.contributors);
}

void hierarchical_allgather(const BlockLevels& n, const void* in, void* out, size_t count,
                            DType t, const CallHeader& h, const Deadline& d) {
  size_t es = dtype_size(t);
  auto nodes = static_cast<size_t>(n.cross.size()), local = static_cast<size_t>(n.local_size);
  auto me = static_cast<size_t>(n.cross.me), j = static_cast<size_t>(n.local_rank);
  auto* o = static_cast<char*>(out);
  if (nodes == 1) return n.intra.allgather(in, o, count, 1, t, h, d);
  // Across nodes, among the ranks of this local rank: block (k, j) of `out`, local rank j's of
  // node k, straight into its place.  Chunk i: elements [f, f + c) of each, in place where the
  // host memory is `out`, else side by side in staged memory.
  auto block = [&](size_t k) { return (k * local + j) * count; };  // in elements
  const auto* src = static_cast<const char*>(in);
  ChunkPlan p = block_plan(n, count, es);
  ChunkSteps s = block_chunks(p, nodes, count, es, o);
  s.up = [&](size_t i, int slot, char* host) {
    size_t c = p.count(i, count) * es, f = p.first(i) * es;
    n.copy.to_host(slot, host == o ? o + block(me) * es + f : host + me * c, src + f, c);
  };
  s.wire = [&](size_t i, char* host) {
    size_t c = p.count(i, count);
    Blocks b = uniform_blocks(c, n.cross.size());
    if (host == o)
      for (size_t k = 0; k < nodes; ++k) b.at.push_back(block(k) + p.first(i));
    ring_allgather(n.cross, host, b, t, cross_header(h, c), d);
  };
  s.down = [&](size_t i, int slot, char* host) {
    size_t c = p.count(i, count) * es, f = p.first(i) * es;
    if (host != o)
      for (size_t k = 0; k < nodes; ++k)
        n.copy.to_device(slot, o + block(k) * es + f, host + k * c, c);
  };
  pipelined_steps(n.copy, s, d);
  // Inside the node: every rank's blocks, in their places, to every rank.
  n.intra.allgather(nullptr, o, count, nodes, t, h, d);
}

void hierarchical_broadcast(const BlockLevels& n, void* buf, size_t bytes, int root_node,
                            int root_local, const CallHeader& h, const Deadline& d) {
  auto* b = static_cast<char*>(buf);
  if (n.cross.size() > 1 && n.local_rank == root_local) {
    // Across nodes among the ranks of the root's local rank: the root's chunk goes up, the
    // others' come down.
    bool root = n.cross.me == root_node;
    ChunkPlan p = plan_chunks(bytes, 1, n.chunk_bytes);
    ChunkSteps s;
    s.chunks = p.chunks;
    s.bytes = [&](size_t i) { return p.count(i, bytes); };
    s.place = [&](size_t) -> void* { return p.chunks == 1 ? b : nullptr; };
    s.up = [&](size_t i, int slot, char* host) {
      if (root) n.copy.to_host(slot, host, b + p.first(i), p.count(i, bytes));
    };
    s.wire = [&](size_t i, char* host) {
      size_t c = p.count(i, bytes);
      tree_broadcast(n.cross, host, c, root_node,
                     cross_header(h, c, root_node), d);
    };
    s.down = [&](size_t i, int slot, char* host) {
      if (!root) n.copy.to_device(slot, b + p.first(i), host, p.count(i, bytes));
    };
    pipelined_steps(n.copy, s, d);
  }
  n.intra.broadcast(b, bytes, root_local, h, d);
}

}  // namespace pytorch_exec::dc
