#include "dc/hierarchical.hpp"

#include <algorithm>
#include <cstring>
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
  if (!staged_) return src;
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

void pipelined_cross(CopyEngine& copy, const Wire& wire, void* shard, size_t count,
                     size_t elem_bytes, size_t chunk_bytes, const Deadline& d) {
  ChunkPlan p = plan_chunks(count, elem_bytes, chunk_bytes);
  if (p.chunks == 0) return;
  auto* base = static_cast<char*>(shard);
  auto slot = [](size_t i) { return static_cast<int>(i % kCopySlots); };
  auto src = [&](size_t i) { return base + p.first(i) * elem_bytes; };
  auto bytes = [&](size_t i) { return p.count(i, count) * elem_bytes; };
  void* host[kCopySlots] = {};  // of the chunk in each slot (no allocation per call)
  auto stage = [&](size_t i) {
    host[slot(i)] = copy.host(slot(i), src(i), bytes(i));
    copy.to_host(slot(i), host[slot(i)], src(i), bytes(i));
  };
  copy.begin(d);
  stage(0);
  for (size_t i = 0; i < p.chunks; ++i) {
    if (i + 1 < p.chunks) {
      // The slot of chunk i+1 was chunk i-2's: its copy back must be done before it is refilled.
      if (i + 1 >= static_cast<size_t>(kCopySlots)) copy.wait_to_device(slot(i + 1), d);
      stage(i + 1);
    }
    copy.wait_to_host(slot(i), d);
    wire(host[slot(i)], p.count(i, count));
    copy.to_device(slot(i), src(i), host[slot(i)], bytes(i));
  }
  size_t tail = std::min<size_t>(p.chunks, kCopySlots);
  for (size_t i = p.chunks - tail; i < p.chunks; ++i) copy.wait_to_device(slot(i), d);
  copy.end(d);
}

void hierarchical_allreduce(const NodeLevels& n, void* buf, size_t count, DType t, Op op,
                            const CallHeader& h, const Deadline& d, const CrossOptions& o) {
  size_t es = dtype_size(t), step = std::max<size_t>(1, n.piece_bytes / es);
  auto wire = [&](void* host, size_t k) {
    cross_allreduce(n.cross, host, k, t, op, make_header(Kind::Allreduce, k, t, op, h.seq), d, o);
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

}  // namespace pytorch_exec::dc
