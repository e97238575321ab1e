#include "dc/ring.hpp"

#include <algorithm>
#include <deque>
#include <vector>

#include "dc/reduce.hpp"

namespace pytorch_exec::dc {
namespace {

constexpr size_t kMinChunk = 32 << 10;
constexpr int kWindow = 4;  // receive buffers in flight during the reduce-scatter
// A member keeps at most about this many bytes sent ahead of what it has received.  Without the
// bound the whole first block goes out at once, the kernel's socket queues (or the MPI library's
// buffers) hold megabytes, and every byte is copied through a cache that it no longer fits: on
// the test machine the tcp ring fell from 4 to 2 GB/s at 4 MiB and above.
constexpr size_t kAhead = 512 << 10;

// Chunks of one block: about four per block, between kMinChunk and the Comm's max_chunk bytes.
struct Chunking {
  size_t elems;  // elements per chunk (the last one may be shorter)
  Chunking(size_t block_elems, size_t esize, size_t max_chunk) {
    size_t bytes = std::clamp(block_elems * esize / 4, kMinChunk, max_chunk);
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

// Appends the units of `steps` ring steps to `out`, step-major; block_of(s) names the block
// moved at step s.
template <typename F>
void units(const Comm& c, const Blocks& b, size_t esize, int steps, F block_of,
           std::vector<Unit>& out) {
  for (int s = 0; s < steps; ++s) {
    int blk = block_of(s);
    size_t n = b.count(blk);
    Chunking ch(n, esize, c.max_chunk);
    for (size_t k = 0; k < ch.chunks(n); ++k) {
      size_t first = b.first(blk) + k * ch.elems;
      out.push_back({blk, first, std::min(ch.elems, n - k * ch.elems)});
    }
  }
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
    check_header(mine, theirs, c.rank_of(c.me - 1));
  }
};

// What flows from the previous member and on to the next, in stream order.  The first
// `reduced` receives land in a window of scratch buffers and are reduced into place; the rest
// land in place.  Receive i (i < recvs.size() - tail) makes send initial + i ready: the chunk
// that just arrived (or was just reduced) is passed on at once, as long as no more than kAhead
// bytes (at least two chunks) are sent ahead of the receives.
struct Stream {
  std::vector<Unit> sends, recvs;
  size_t initial = 0;  // sends ready at the start
  size_t reduced = 0;  // receives that are reduced
};

void run_stream(const Comm& c, char* base, DType t, Op op, const Stream& st, const CallHeader& h,
                const Deadline& d) {
  size_t es = dtype_size(t);
  HeaderExchange hx(c, h);
  std::vector<Request> sent;
  sent.reserve(st.sends.size());
  auto send = [&](size_t i) {
    sent.push_back(c.isend(c.me + 1, base + st.sends[i].first * es, st.sends[i].count * es));
  };
  size_t max_send = 0;
  for (const Unit& u : st.sends) max_send = std::max(max_send, u.count * es);
  size_t ahead = std::max<size_t>(2, kAhead / std::max<size_t>(max_send, 1));
  // Sends allowed once `received` receives are complete: ready (initial + received) and paced.
  auto allowed = [&](size_t received) {
    return std::min({st.initial + received, ahead + received, st.sends.size()});
  };
  size_t next_send = 0;
  for (; next_send < allowed(0); ++next_send) send(next_send);
  size_t max_chunk = 0;
  for (size_t i = 0; i < st.reduced; ++i) max_chunk = std::max(max_chunk, st.recvs[i].count);
  size_t stride = max_chunk * es + kUnaliasSlack;
  char* tmp = scratch_buffer(static_cast<size_t>(kWindow) * stride);
  auto scratch = [&](size_t i) {  // receive i's, away from its place in `base` (comm.hpp)
    char* area = tmp + (i % static_cast<size_t>(kWindow)) * stride;
    return area + unaliased_offset(area, base + st.recvs[i].first * es);
  };
  std::deque<Request> posted;
  size_t next_post = 0;
  auto post = [&](size_t done) {  // scratch slots are reused once receive `done` - 1 is reduced
    for (; next_post < st.recvs.size(); ++next_post) {
      const Unit& u = st.recvs[next_post];
      bool to_scratch = next_post < st.reduced;
      if (to_scratch && next_post >= done + static_cast<size_t>(kWindow)) break;
      posted.push_back(
          c.irecv(c.me - 1, to_scratch ? scratch(next_post) : base + u.first * es, u.count * es));
    }
  };
  post(0);
  hx.check(c, h, d);
  for (size_t i = 0; i < st.recvs.size(); ++i) {
    c.wait(posted.front(), d);
    posted.pop_front();
    const Unit& u = st.recvs[i];
    if (i < st.reduced) {
      reduce_into(base + u.first * es, scratch(i), u.count, t, op);
      post(i + 1);
    }
    for (; next_send < allowed(i + 1); ++next_send) send(next_send);
  }
  for (; next_send < st.sends.size(); ++next_send) send(next_send);  // paced ones, or no receives
  for (Request r : sent) c.wait(r, d);
  c.wait(hx.rs, d);
}

// Reduce-scatter units: step s sends block me-s-1 and receives block me-s-2 (reduced, it is
// sent at step s+1; the last step's is this member's own block).
void reduce_scatter_units(const Comm& c, const Blocks& b, size_t es, Stream& st) {
  int n = c.size();
  units(
      c, b, es, n - 1, [&](int s) { return c.mod(c.me - s - 1); }, st.sends);
  units(
      c, b, es, n - 1, [&](int s) { return c.mod(c.me - s - 2); }, st.recvs);
  for (auto& u : st.sends) st.initial += u.block == c.mod(c.me - 1);
  st.reduced = st.recvs.size();
}

// Allgather units: step s sends block me-s and receives block me-s-1, sent on at step s+1.
void allgather_units(const Comm& c, const Blocks& b, size_t es, Stream& st) {
  int n = c.size();
  units(
      c, b, es, n - 1, [&](int s) { return c.mod(c.me - s); }, st.sends);
  units(
      c, b, es, n - 1, [&](int s) { return c.mod(c.me - s - 1); }, st.recvs);
}

}  // namespace

size_t even_first(size_t count, int n, int j) {
  size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n),
         u = static_cast<size_t>(j);
  return u * base + std::min(u, extra);
}

Blocks even_blocks(size_t count, int n) {
  Blocks b;
  for (int i = 0; i <= n; ++i) b.off.push_back(even_first(count, n, i));
  return b;
}

Blocks uniform_blocks(size_t per_block, int n) {
  Blocks b;
  for (int i = 0; i <= n; ++i) b.off.push_back(static_cast<size_t>(i) * per_block);
  return b;
}

void ring_reduce_scatter(const Comm& c, void* buf, const Blocks& b, DType t, Op op,
                         const CallHeader& h, const Deadline& d) {
  if (c.size() == 1) return;
  Stream st;
  reduce_scatter_units(c, b, dtype_size(t), st);
  run_stream(c, static_cast<char*>(buf), t, op, st, h, d);
}

void ring_allgather(const Comm& c, void* buf, const Blocks& b, DType t, const CallHeader& h,
                    const Deadline& d) {
  if (c.size() == 1) return;
  Stream st;
  allgather_units(c, b, dtype_size(t), st);
  for (auto& u : st.sends) st.initial += u.block == c.me;
  run_stream(c, static_cast<char*>(buf), t, Op::Sum, st, h, d);
}

// Reduce-scatter and allgather as one stream: a chunk of this member's block goes out as soon
// as its last reduction is done, while the rest of the reduce-scatter is still arriving.
void ring_allreduce(const Comm& c, void* buf, size_t count, DType t, Op op, const CallHeader& h,
                    const Deadline& d) {
  int n = c.size();
  if (n == 1) return;
  Blocks b = even_blocks(count, n);
  Stream st;
  reduce_scatter_units(c, b, dtype_size(t), st);
  allgather_units(c, b, dtype_size(t), st);
  run_stream(c, static_cast<char*>(buf), t, op, st, h, d);
}

}  // namespace pytorch_exec::dc
