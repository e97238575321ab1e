// Mailbox (dc.hpp): tagged point-to-point messages over a tcp mesh of their own.
//
// Every message is a Header (tag and length) followed by its bytes, on the ordered stream from
// the sender to the receiver.  The receiving side always has a header receive posted on every
// peer; when a header arrives, the earliest posted receive that matches it (its peer or
// kAnySource, its tag) gets the bytes straight into its buffer; if none matches yet, they go into
// a kept message ("early") that a later irecv takes.  After the bytes, the next header.
//
// Nothing here blocks except idle() and wait(): step() is one pass of nonblocking progress.
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "dc/bootstrap.hpp"
#include "dc/group.hpp"
#include "dc/settings.hpp"
#include "dc/socket.hpp"
#include "dc/tcp/transport.hpp"

namespace pytorch_exec::dc {
namespace {

constexpr uint32_t kMagic = 0x626d6470;  // "pdmb"

struct Header {
  uint32_t magic = kMagic;
  int32_t tag = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(Header) == 16);

std::string rank_text(int r) { return "rank " + std::to_string(r); }

}  // namespace

struct Mailbox::Impl {
  std::unique_ptr<Transport> t;
  int rank = 0, size = 1;
  double timeout = 300;
  std::string failed;  // the first error that made the mailbox unusable
  // Why each peer was lost ("" while it is not): what involves it fails, the others go on (a
  // rank whose group was destroyed, or that exited or died, does not stop two others' messages).
  std::vector<std::string> gone;
  uint64_t next = 1;

  struct Req {
    bool send = false;
    char* buf = nullptr;
    size_t bytes = 0;
    int peer = 0, tag = 0;
    Clock::time_point deadline;
    Header h;          // a send's header (it must outlive its transport request)
    Request tr;        // in flight: a send's last piece, a matched receive's bytes
    bool matched = false;  // a receive whose message is coming (tr) or came
    bool done = false;
    int source = -1;
    std::string error;  // this request alone failed (a timeout before its message, a size)
  };
  std::map<uint64_t, Req> reqs;  // by id: posting order

  struct Incoming {
    Header h;
    Request tr;            // the header's receive, or (payload) the bytes'
    bool payload = false;  // receiving the bytes of h
    uint64_t into = 0;     // ... for this request (0: kept as early)
    bool drop = false;     // ... read and dropped (its receive failed on its size)
    std::string kept;
  };
  std::vector<Incoming> in;  // by peer
  struct Early {
    int peer, tag;
    std::string data;
  };
  std::deque<Early> early;

  void usable() const {
    if (!failed.empty()) throw Error("mailbox: unusable after an earlier error (" + failed + ")");
  }
  void check_peer(int peer, bool any_ok, const char* what) const {
    if ((any_ok && peer == kAnySource) || (peer >= 0 && peer < size && peer != rank)) return;
    throw Error(std::string("mailbox: ") + what + " with rank " + std::to_string(peer) +
                ": not another rank of this group of " + std::to_string(size));
  }
  Clock::time_point deadline(double secs) const {
    return Deadline::after(secs >= 0 ? secs : timeout, "").at;  // NaN: the default too
  }
  void fail(const std::string& why) {
    if (failed.empty()) failed = why;
    t->abort(why);
  }
  // `peer`'s connection is lost: the requests with it fail (a receive from any rank that its
  // message was coming into too); what it sent before it went is still received.
  void lose(int peer, const std::string& why) {
    gone[static_cast<size_t>(peer)] = why;
    for (auto& [id, r] : reqs)
      if (!r.done && r.error.empty() && (r.peer == peer || (r.matched && r.source == peer)))
        r.error = why;
  }
  void post_header(int peer) {
    Incoming& c = in[static_cast<size_t>(peer)];
    c.payload = false;
    c.into = 0;
    c.drop = false;
    c.tr = t->irecv(peer, &c.h, sizeof c.h);
  }

  // The earliest posted, unmatched receive for a message from `peer` with `tag`; 0 if none.
  uint64_t match(int peer, int tag) {
    for (auto& [id, r] : reqs)
      if (!r.send && !r.matched && !r.done && r.tag == tag &&
          (r.peer == peer || r.peer == kAnySource))
        return id;
    return 0;
  }

  // A header arrived from `peer`: its bytes go to a receive, or are kept.
  void on_header(int peer) {
    Incoming& c = in[static_cast<size_t>(peer)];
    if (c.h.magic != kMagic) {
      fail("a message from " + rank_text(peer) + " without a mailbox header (stream out of step)");
      return;
    }
    c.payload = true;
    c.into = match(peer, c.h.tag);
    if (c.into) {
      Req& r = reqs[c.into];
      r.matched = true;
      r.source = peer;
      if (r.bytes == c.h.bytes) {
        c.tr = t->irecv(peer, r.buf, r.bytes);
        r.tr = c.tr;
        return;
      }
      r.error = "receive of " + std::to_string(r.bytes) + " bytes: the message from " +
                rank_text(peer) + " (tag " + std::to_string(c.h.tag) + ") has " +
                std::to_string(c.h.bytes) + " bytes";
      c.into = 0;
      c.drop = true;
    }
    c.kept.assign(c.h.bytes, '\0');
    c.tr = t->irecv(peer, c.kept.data(), c.kept.size());
  }

  // The bytes of the message from `peer` are in.
  void on_payload(int peer) {
    Incoming& c = in[static_cast<size_t>(peer)];
    if (c.into) {
      reqs[c.into].done = true;
    } else if (!c.drop) {  // kept: a receive posted while it came may take it now
      early.push_back({peer, c.h.tag, std::move(c.kept)});
      if (uint64_t id = match(peer, c.h.tag)) take_early(reqs[id]);
    }
    c.kept.clear();
    post_header(peer);
  }

  // One pass: moves what can move, reacts to what arrived, expires what is late.  True if
  // anything happened.
  bool step() {
    if (!failed.empty()) return false;
    bool moved = false;
    try {
      moved = t->progress();
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        // A header and a small message may both be in already: take what is there.
        while (failed.empty() && t->done(in[static_cast<size_t>(p)].tr)) {
          moved = true;
          if (in[static_cast<size_t>(p)].payload)
            on_payload(p);
          else
            on_header(p);
          t->progress();
        }
      }
      for (auto& [id, r] : reqs)
        if (r.send && !r.done && t->done(r.tr)) r.done = moved = true;
    } catch (const PeerLost& e) {
      lose(e.peer(), e.what());
      moved = true;
    } catch (const std::exception& e) {
      fail(e.what());
      return true;
    }
    expire();
    return moved;
  }

  // Requests past their deadline: a receive still waiting for its message fails alone; one
  // whose bytes are moving leaves the stream in an unknown place, so the mailbox fails.
  void expire() {
    auto now = Clock::now();
    for (auto& [id, r] : reqs) {
      if (r.done || !r.error.empty() || now < r.deadline) continue;
      std::string what = std::string(r.send ? "send to " : "receive from ") +
                         (r.peer == kAnySource ? "any rank" : rank_text(r.peer)) + " (tag " +
                         std::to_string(r.tag) + ", " + std::to_string(r.bytes) + " bytes)";
      if (!r.send && !r.matched) {
        r.error = "timed out: " + what;
        continue;
      }
      fail("timed out in the middle of a " + what);
      return;
    }
  }

  // Whether kept message `e` is for a receive from `peer` (or kAnySource) with `tag`.
  static bool fits(const Early& e, int peer, int tag) {
    return e.tag == tag && (peer == kAnySource || e.peer == peer);
  }
  bool has_early(int peer, int tag) const {
    return std::any_of(early.begin(), early.end(),
                       [&](const Early& e) { return fits(e, peer, tag); });
  }

  // A new request, its arguments checked.  After a failure only a receive that a kept message
  // satisfies (it came whole before, as a peer's last words before it exited) may be posted;
  // one with a lost peer fails at once (its wait or test raises), unless a kept message from it
  // satisfies it.
  uint64_t add(bool send, void* buf, size_t bytes, int peer, int tag, double secs) {
    const char* what = send ? "send" : "receive";
    bool kept = !send && has_early(peer, tag);
    if (!kept) usable();
    check_peer(peer, !send, what);
    if (!buf && bytes)
      throw Error(std::string("mailbox: ") + what + " of " + std::to_string(bytes) +
                  " bytes with a null buffer");
    if (tag < 0) throw Error("mailbox: tags are 0 or more, not " + std::to_string(tag));
    uint64_t id = next++;
    Req& r = reqs[id];
    r.send = send;
    r.buf = static_cast<char*>(buf);
    r.bytes = bytes;
    r.peer = peer;
    r.tag = tag;
    r.deadline = deadline(secs);
    if (!kept && peer >= 0 && !gone[static_cast<size_t>(peer)].empty())
      r.error = gone[static_cast<size_t>(peer)];
    return id;
  }

  // Takes a kept message for receive `id` if one matches.
  bool take_early(Req& r) {
    for (auto it = early.begin(); it != early.end(); ++it) {
      if (!fits(*it, r.peer, r.tag)) continue;
      r.matched = r.done = true;
      r.source = it->peer;
      if (it->data.size() == r.bytes)
        std::memcpy(r.buf, it->data.data(), r.bytes);
      else
        r.error = "receive of " + std::to_string(r.bytes) + " bytes: the message from " +
                  rank_text(it->peer) + " (tag " + std::to_string(r.tag) + ") has " +
                  std::to_string(it->data.size()) + " bytes";
      early.erase(it);
      return true;
    }
    return false;
  }
};

Mailbox::Mailbox(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Mailbox::~Mailbox() = default;

uint64_t Mailbox::isend(const void* buf, size_t bytes, int peer, int tag, double timeout) {
  Impl& m = *impl_;
  uint64_t id = m.add(true, const_cast<void*>(buf), bytes, peer, tag, timeout);
  Impl::Req& r = m.reqs[id];
  r.h.tag = tag;
  r.h.bytes = bytes;
  if (!r.error.empty()) return id;  // a lost peer
  try {
    r.tr = m.t->isend(peer, &r.h, sizeof r.h);
    if (bytes) r.tr = m.t->isend(peer, buf, bytes);
  } catch (const PeerLost& e) {
    m.lose(e.peer(), e.what());
  } catch (const std::exception& e) {
    m.fail(e.what());
    m.usable();
  }
  return id;
}

uint64_t Mailbox::irecv(void* buf, size_t bytes, int peer, int tag, double timeout) {
  Impl& m = *impl_;
  uint64_t id = m.add(false, buf, bytes, peer, tag, timeout);
  m.take_early(m.reqs[id]);
  return id;
}

bool Mailbox::progress() { return impl_->step(); }

bool Mailbox::test(uint64_t id, int* source) {
  Impl& m = *impl_;
  auto it = m.reqs.find(id);
  if (it == m.reqs.end()) throw Error("mailbox: no request " + std::to_string(id));
  Impl::Req& r = it->second;
  if (!r.error.empty()) {
    std::string e = r.error;
    bool timed_out = e.rfind("timed out", 0) == 0;
    m.reqs.erase(it);
    if (timed_out) throw TimeoutError("mailbox: " + e);
    throw Error("mailbox: " + e);
  }
  if (!r.done) {
    m.usable();
    return false;
  }
  if (source) *source = r.source;
  m.reqs.erase(it);
  return true;
}

void Mailbox::wait(uint64_t id, int* source) {
  while (!test(id, source))
    if (!progress()) idle(100);
}

void Mailbox::idle(int ms, int wake_fd) {
  if (impl_->failed.empty()) return impl_->t->idle(ms, wake_fd);
  struct pollfd w = {wake_fd, POLLIN, 0};  // the connections are shut: only the wake-up counts
  ::poll(&w, wake_fd >= 0 ? 1 : 0, ms);
}

std::unique_ptr<Mailbox> ProcessGroup::mailbox(double timeout) {
  Impl& g = *impl_;
  auto d = g.deadline(timeout, "mailbox set-up");
  auto m = std::make_unique<Mailbox::Impl>();
  m->rank = g.rank;
  m->size = g.size;
  m->timeout = g.s.timeout;
  std::vector<Listener> l;
  uint64_t session = 0;
  std::vector<std::string> addrs;
  g.run_guarded(d, [&] { addrs = g.publish_listeners(l, 1, session, d); });
  m->t = tcp::connect_mesh(g.rank, g.size, std::move(l[0]), addrs, session, g.s.tcp_congestion, d);
  m->t->per_peer_losses();
  m->gone.resize(static_cast<size_t>(g.size));
  m->in.resize(static_cast<size_t>(g.size));
  for (int p = 0; p < g.size; ++p)
    if (p != g.rank) m->post_header(p);
  // Every rank's connections are made before any rank goes on: one that closes its mailbox at
  // once (a group destroyed right after it was made) must not fail a peer still connecting.
  barrier(timeout);
  return std::make_unique<Mailbox>(std::move(m));
}

}  // namespace pytorch_exec::dc
