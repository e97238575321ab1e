#include "dc/tree.hpp"

#include <algorithm>
#include <vector>

namespace pytorch_exec::dc {
namespace {

constexpr size_t kChainAbove = 256 << 10;
constexpr size_t kChainChunk = 256 << 10;

void binomial(const Comm& c, char* buf, size_t bytes, int root, const CallHeader& h,
              const Deadline& d) {
  int n = c.size(), v = c.mod(c.me - root);
  int mask = 1;
  for (; mask < n; mask <<= 1) {
    if (v & mask) {
      int parent = v - mask + root;
      recv_header(c, parent, h, d);
      c.wait(c.irecv(parent, buf, bytes), d);
      break;
    }
  }
  std::vector<Request> sent;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) {
      sent.push_back(c.isend(v + mask + root, &h, sizeof h));
      sent.push_back(c.isend(v + mask + root, buf, bytes));
    }
  }
  for (Request r : sent) c.wait(r, d);
}

void chain(const Comm& c, char* buf, size_t bytes, int root, const CallHeader& h,
           const Deadline& d) {
  int n = c.size(), v = c.mod(c.me - root);
  bool first = v == 0, last = v == n - 1;
  std::vector<Request> rq, sent;
  if (!first) {
    recv_header(c, c.me - 1, h, d);
    for (size_t off = 0; off < bytes; off += kChainChunk)
      rq.push_back(c.irecv(c.me - 1, buf + off, std::min(kChainChunk, bytes - off)));
  }
  if (!last) sent.push_back(c.isend(c.me + 1, &h, sizeof h));
  size_t k = 0;
  for (size_t off = 0; off < bytes; off += kChainChunk, ++k) {
    if (!first) c.wait(rq[k], d);
    if (!last) sent.push_back(c.isend(c.me + 1, buf + off, std::min(kChainChunk, bytes - off)));
  }
  for (Request r : sent) c.wait(r, d);
}

}  // namespace

void tree_broadcast(const Comm& c, void* buf, size_t bytes, int root, const CallHeader& h,
                    const Deadline& d) {
  if (c.size() == 1) return;
  if (bytes > kChainAbove && c.size() > 2)
    chain(c, static_cast<char*>(buf), bytes, root, h, d);
  else
    binomial(c, static_cast<char*>(buf), bytes, root, h, d);
}

void dissemination_barrier(const Comm& c, const CallHeader& h, const Deadline& d) {
  for (int k = 1; k < c.size(); k <<= 1) {
    CallHeader theirs;
    Request r = c.irecv(c.me - k, &theirs, sizeof theirs);
    Request s = c.isend(c.me + k, &h, sizeof h);
    c.wait(r, d);
    check_header(h, theirs, c.rank_of(c.me - k));
    c.wait(s, d);
  }
}

}  // namespace pytorch_exec::dc
