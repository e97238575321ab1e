#include "dc/recursive_doubling.hpp"

#include <cstring>

#include "dc/reduce.hpp"

namespace pytorch_exec::dc {
namespace {

// Each message is [CallHeader][payload], sent as one (one system call or MPI message).  On a
// byte stream the header is received and checked on its own before the payload is waited for,
// so that a mismatched count is reported by both sides instead of one waiting for bytes never
// sent; a message transport receives it whole (a size mismatch is then its error).
class Exchanger {
 public:
  Exchanger(const Comm& c, void* buf, size_t bytes, const CallHeader& h, const Deadline& d)
      : c_(c),
        buf_(static_cast<char*>(buf)),
        bytes_(bytes),
        h_(h),
        d_(d),
        out_(scratch_buffer(2 * (sizeof h + bytes))),
        in_(out_ + sizeof h + bytes),
        split_((c.t->capabilities() & Transport::kByteStream) != 0) {
    std::memcpy(out_, &h, sizeof h);
  }
  // Sends this rank's buffer to member `to` and/or receives member `from`'s (either may be -1);
  // returns the received payload.
  const char* exchange(int to, int from) {
    Request rh{}, r{}, s{};
    if (from >= 0) {
      if (split_) rh = c_.irecv(from, in_, sizeof h_);
      r = split_ ? c_.irecv(from, in_ + sizeof h_, bytes_)
                 : c_.irecv(from, in_, sizeof h_ + bytes_);
    }
    if (to >= 0) {
      std::memcpy(out_ + sizeof h_, buf_, bytes_);
      s = c_.isend(to, out_, sizeof h_ + bytes_);
    }
    if (from >= 0) {
      c_.wait(split_ ? rh : r, d_);
      CallHeader theirs;
      std::memcpy(&theirs, in_, sizeof theirs);
      check_header(h_, theirs, c_.rank_of(from));
      c_.wait(r, d_);
    }
    if (to >= 0) c_.wait(s, d_);
    return in_ + sizeof h_;
  }

 private:
  const Comm& c_;
  char* buf_;
  size_t bytes_;
  const CallHeader& h_;
  const Deadline& d_;
  char* out_;  // [header][payload] out, then the same in (scratch_buffer)
  char* in_;
  bool split_;
};

}  // namespace

void recursive_doubling_allreduce(const Comm& c, void* buf, size_t count, DType t, Op op,
                                  const CallHeader& h, const Deadline& d) {
  int n = c.size(), me = c.me;
  if (n == 1) return;
  Exchanger x(c, buf, count * dtype_size(t), h, d);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int rem = n - p;
  int vrank = me - rem;  // rank among the p that take part in the doubling, -1: folded
  if (me < 2 * rem) {
    if (me % 2 == 0) {
      x.exchange(me + 1, -1);
      vrank = -1;
    } else {
      reduce_into(buf, x.exchange(-1, me - 1), count, t, op);
      vrank = me / 2;
    }
  }
  if (vrank >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      int vp = vrank ^ mask;
      int partner = vp < rem ? vp * 2 + 1 : vp + rem;
      reduce_into(buf, x.exchange(partner, partner), count, t, op);
    }
  }
  if (me < 2 * rem) {
    if (me % 2 == 0)
      std::memcpy(buf, x.exchange(-1, me + 1), count * dtype_size(t));
    else
      x.exchange(me - 1, -1);
  }
}

}  // namespace pytorch_exec::dc
