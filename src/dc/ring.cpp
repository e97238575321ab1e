#include "dc/ring.hpp"

#include <algorithm>
#include <deque>
#include <vector>

#include "dc/reduce.hpp"

namespace pytorch_exec::dc {
namespace {

constexpr size_t kMinChunk = 32 << 10;
constexpr size_t kMaxChunk = 512 << 10;
constexpr int kWindow = 4;  // receive buffers in flight during the reduce-scatter

// Chunks of one block: about four per block, between kMinChunk and kMaxChunk bytes.
struct Chunking {
  size_t elems;  // elements per chunk (the last one may be shorter)
  Chunking(size_t block_elems, size_t esize) {
    size_t bytes = std::clamp(block_elems * esize / 4, kMinChunk, kMaxChunk);
    elems = std::max<size_t>(1, bytes / esize);
  }
  size_t chunks(size_t block_elems) const { return (block_elems + elems - 1) / elems; }
};

// One piece of the stream between neighbours: step s, chunk k of a block.
struct Unit {
  int block;
  size_t first;  // element offset in buf
  size_t count;
};

// The units of `steps` ring steps, step-major; block_of(s) names the block moved at step s.
template <typename F>
std::vector<Unit> units(const Blocks& b, size_t esize, int steps, F block_of) {
  std::vector<Unit> out;
  for (int s = 0; s < steps; ++s) {
    int blk = block_of(s);
    size_t n = b.count(blk);
    Chunking ch(n, esize);
    for (size_t k = 0; k < ch.chunks(n); ++k) {
      size_t first = b.off[static_cast<size_t>(blk)] + k * ch.elems;
      out.push_back({blk, first, std::min(ch.elems, n - k * ch.elems)});
    }
  }
  return out;
}

// Sends the call header to the next member and checks the previous member's.
struct HeaderExchange {
  CallHeader theirs{};
  Request rs, rr;
  HeaderExchange(const Comm& c, const CallHeader& mine) {
    rr = c.irecv(c.me - 1, &theirs, sizeof theirs);
    rs = c.isend(c.me + 1, &mine, sizeof mine);
  }
  void check(const Comm& c, const CallHeader& mine, const Deadline& d) {
    c.wait(rr, d);
    check_header(mine, theirs, c.world(c.me - 1));
  }
};

}  // namespace

Blocks even_blocks(size_t count, int n) {
  Blocks b;
  b.off.resize(static_cast<size_t>(n) + 1);
  size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n);
  for (int i = 0; i < n; ++i)
    b.off[static_cast<size_t>(i) + 1] = b.off[static_cast<size_t>(i)] + base + (static_cast<size_t>(i) < extra ? 1 : 0);
  return b;
}

void ring_reduce_scatter(const Comm& c, void* buf, const Blocks& b, DType t, Op op,
                         const CallHeader& h, const Deadline& d) {
  int n = c.size();
  if (n == 1) return;
  size_t es = dtype_size(t);
  char* base = static_cast<char*>(buf);
  // Step s sends block me-s-1 and receives block me-s-2 (reduced, it is sent at step s+1).
  auto sends = units(b, es, n - 1, [&](int s) { return c.mod(c.me - s - 1); });
  auto recvs = units(b, es, n - 1, [&](int s) { return c.mod(c.me - s - 2); });
  HeaderExchange hx(c, h);
  std::vector<Request> sent;
  size_t next_send = 0;
  // Step 0's chunks are ready now; a later step's chunk is ready once the same chunk arrived.
  for (; next_send < sends.size() && sends[next_send].block == c.mod(c.me - 1); ++next_send)
    sent.push_back(c.isend(c.me + 1, base + sends[next_send].first * es, sends[next_send].count * es));
  size_t max_chunk = 0;
  for (auto& u : recvs) max_chunk = std::max(max_chunk, u.count);
  std::vector<char> tmp(static_cast<size_t>(kWindow) * max_chunk * es);
  std::deque<Request> posted;
  size_t next_post = 0;
  auto post = [&] {
    while (next_post < recvs.size() && posted.size() < static_cast<size_t>(kWindow)) {
      const Unit& u = recvs[next_post];
      char* slot = tmp.data() + (next_post % kWindow) * max_chunk * es;
      posted.push_back(c.irecv(c.me - 1, slot, u.count * es));
      ++next_post;
    }
  };
  post();
  hx.check(c, h, d);
  for (size_t i = 0; i < recvs.size(); ++i) {
    c.wait(posted.front(), d);
    posted.pop_front();
    const Unit& u = recvs[i];
    reduce_into(base + u.first * es, tmp.data() + (i % kWindow) * max_chunk * es, u.count, t, op);
    post();
    if (next_send < sends.size()) {  // this chunk is the next one to send on
      const Unit& s = sends[next_send++];
      sent.push_back(c.isend(c.me + 1, base + s.first * es, s.count * es));
    }
  }
  for (Request r : sent) c.wait(r, d);
  c.wait(hx.rs, d);
}

void ring_allgather(const Comm& c, void* buf, const Blocks& b, DType t, const CallHeader& h,
                    const Deadline& d) {
  int n = c.size();
  if (n == 1) return;
  size_t es = dtype_size(t);
  char* base = static_cast<char*>(buf);
  // Step s sends block me-s and receives block me-s-1, which is sent on at step s+1.
  auto sends = units(b, es, n - 1, [&](int s) { return c.mod(c.me - s); });
  auto recvs = units(b, es, n - 1, [&](int s) { return c.mod(c.me - s - 1); });
  HeaderExchange hx(c, h);
  std::vector<Request> rq;
  rq.reserve(recvs.size());
  for (const Unit& u : recvs) rq.push_back(c.irecv(c.me - 1, base + u.first * es, u.count * es));
  std::vector<Request> sent;
  size_t next_send = 0;
  for (; next_send < sends.size() && sends[next_send].block == c.me; ++next_send)
    sent.push_back(c.isend(c.me + 1, base + sends[next_send].first * es, sends[next_send].count * es));
  hx.check(c, h, d);
  for (size_t i = 0; i < recvs.size(); ++i) {
    c.wait(rq[i], d);
    if (next_send < sends.size()) {
      const Unit& s = sends[next_send++];
      sent.push_back(c.isend(c.me + 1, base + s.first * es, s.count * es));
    }
  }
  for (Request r : sent) c.wait(r, d);
  c.wait(hx.rs, d);
}

void ring_allreduce(const Comm& c, void* buf, size_t count, DType t, Op op, const CallHeader& h,
                    const Deadline& d) {
  Blocks b = even_blocks(count, c.size());
  ring_reduce_scatter(c, buf, b, t, op, h, d);
  size_t es = dtype_size(t);
  if (op == Op::Avg) finish_avg(static_cast<char*>(buf) + b.off[static_cast<size_t>(c.me)] * es, b.count(c.me), t, c.size());
  ring_allgather(c, buf, b, t, h, d);
}

}  // namespace pytorch_exec::dc
