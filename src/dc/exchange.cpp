// The personalized exchanges of the ProcessGroup: alltoall, gather and scatter, in bytes, over the
// world Comm (the inter-node transport between all ranks).  Every operation is posted at once
// (isend/irecv) and then waited for, so that no order of the ranks can deadlock; each message is
// preceded by a call header so that mismatched calls raise instead of mixing up data.
#include <cstring>
#include <vector>

#include "dc/group.hpp"

namespace pytorch_exec::dc {
namespace {

// Posts the header and `bytes` to member `to`; both stay valid until they are waited for.
void post_send(const Comm& c, int to, const CallHeader& h, const void* buf, size_t bytes,
               std::vector<Request>& out) {
  out.push_back(c.isend(to, &h, sizeof h));
  if (bytes) out.push_back(c.isend(to, buf, bytes));
}

void check_root(const ProcessGroup::Impl& g, const char* op, int root) {
  if (root < 0 || root >= g.size)
    throw Error(std::string(op) + ": root " + std::to_string(root) +
                " is not a rank of this group of " + std::to_string(g.size));
}

}  // namespace

void ProcessGroup::alltoall(const void* in, const size_t* send_bytes, void* out,
                            const size_t* recv_bytes, double timeout) {
  Impl& g = *impl_;
  size_t n = static_cast<size_t>(g.size), me = static_cast<size_t>(g.rank), total = 0;
  if (!send_bytes || !recv_bytes) throw Error("alltoall: null send_bytes or recv_bytes array");
  std::vector<size_t> soff(n + 1), roff(n + 1);
  for (size_t r = 0; r < n; ++r) {
    if (send_bytes[r] > SIZE_MAX - soff[r] || recv_bytes[r] > SIZE_MAX - roff[r])
      throw Error("alltoall: the sizes add up to more than memory can hold");
    soff[r + 1] = soff[r] + send_bytes[r];
    roff[r + 1] = roff[r] + recv_bytes[r];
    total += send_bytes[r];
  }
  need_buffer(in, soff[n], "alltoall");
  need_buffer(out, roff[n], "alltoall");
  auto d = Deadline::call(g.seconds(timeout), "alltoall", total, -1);
  g.run_guarded(d, [&] {
    uint64_t seq = ++g.seq;
    const Comm& c = g.world_c;
    std::vector<CallHeader> hs(n);
    std::vector<Request> sent;
    for (size_t r = 0; r < n; ++r) {
      if (r == me) continue;
      hs[r] = make_header(Kind::Alltoall, send_bytes[r], DType::U8, Op::Sum, seq);
      post_send(c, static_cast<int>(r), hs[r], static_cast<const char*>(in) + soff[r],
                send_bytes[r], sent);
    }
    if (recv_bytes[me] != send_bytes[me])
      throw Error("alltoall: this rank sends itself " + std::to_string(send_bytes[me]) +
                  " bytes but expects " + std::to_string(recv_bytes[me]));
    std::memmove(static_cast<char*>(out) + roff[me], static_cast<const char*>(in) + soff[me],
                 send_bytes[me]);
    for (size_t r = 0; r < n; ++r) {
      if (r == me) continue;
      int from = static_cast<int>(r);
      recv_header(c, from, make_header(Kind::Alltoall, recv_bytes[r], DType::U8, Op::Sum, seq), d);
      if (recv_bytes[r]) c.wait(c.irecv(from, static_cast<char*>(out) + roff[r], recv_bytes[r]), d);
    }
    for (Request q : sent) c.wait(q, d);
  });
}

void ProcessGroup::gather(const void* in, void* out, size_t bytes, int root, double timeout) {
  Impl& g = *impl_;
  check_root(g, "gather", root);
  need_buffer(in, bytes, "gather");
  if (g.rank == root) need_buffer(out, bytes, "gather", 1, static_cast<size_t>(g.size));
  auto d = Deadline::call(g.seconds(timeout), "gather", bytes, -1, -1, root);
  g.run_guarded(d, [&] {
    const Comm& c = g.world_c;
    auto h = make_header(Kind::Gather, bytes, DType::U8, Op::Sum, ++g.seq, root);
    check_ring_headers(c, h, d);
    if (g.rank != root) {
      std::vector<Request> sent;
      post_send(c, root, h, in, bytes, sent);
      for (Request q : sent) c.wait(q, d);
      return;
    }
    char* o = static_cast<char*>(out);
    std::memmove(o + static_cast<size_t>(root) * bytes, in, bytes);
    for (int r = 0; r < g.size; ++r) {
      if (r == root) continue;
      recv_header(c, r, h, d);
      if (bytes) c.wait(c.irecv(r, o + static_cast<size_t>(r) * bytes, bytes), d);
    }
  });
}

void ProcessGroup::scatter(const void* in, void* out, size_t bytes, int root, double timeout) {
  Impl& g = *impl_;
  check_root(g, "scatter", root);
  if (g.rank == root) need_buffer(in, bytes, "scatter", 1, static_cast<size_t>(g.size));
  need_buffer(out, bytes, "scatter");
  auto d = Deadline::call(g.seconds(timeout), "scatter", bytes, -1, -1, root);
  g.run_guarded(d, [&] {
    const Comm& c = g.world_c;
    auto h = make_header(Kind::Scatter, bytes, DType::U8, Op::Sum, ++g.seq, root);
    check_ring_headers(c, h, d);
    if (g.rank != root) {
      recv_header(c, root, h, d);
      if (bytes) c.wait(c.irecv(root, out, bytes), d);
      return;
    }
    const char* i = static_cast<const char*>(in);
    std::vector<Request> sent;
    for (int r = 0; r < g.size; ++r)
      if (r != root) post_send(c, r, h, i + static_cast<size_t>(r) * bytes, bytes, sent);
    std::memmove(out, i + static_cast<size_t>(root) * bytes, bytes);
    for (Request q : sent) c.wait(q, d);
  });
}

}  // namespace pytorch_exec::dc
