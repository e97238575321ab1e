#include "dc/tcp/transport.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

namespace pytorch_exec::dc::tcp {
namespace {

constexpr int kMaxIov = 8;
// Before sleeping in poll(), a waiting rank retries nonblocking I/O for this long: a reply that
// is microseconds away is picked up without a wake-up (small-message latency).  Not on an
// oversubscribed node (busy_polling()).
constexpr auto kSpin = std::chrono::microseconds(30);
// On an oversubscribed node a waiting rank yields its processor instead, for this long, and
// then sleeps in poll(): a yield hands the processor to the rank it waits for without the cost
// of a wake-up.
constexpr auto kYield = std::chrono::milliseconds(2);

std::string errno_text(int e) { return std::strerror(e); }

struct Op {
  char* buf;
  size_t len;
  size_t done;
};

struct Peer {
  int fd = -1;
  std::deque<Op> q[2];          // 0: sends, 1: receives
  uint64_t posted[2] = {0, 0};  // operations posted / completed per direction
  uint64_t completed[2] = {0, 0};
  bool active = false;  // listed in TcpTransport::active_
};

class TcpTransport : public Transport {
 public:
  TcpTransport(int rank, std::vector<int> fds, std::vector<int> names)
      : rank_(rank), peers_(fds.size()), names_(std::move(names)) {
    for (size_t i = 0; i < fds.size(); ++i) peers_[i].fd = fds[i];
  }
  ~TcpTransport() override {
    for (auto& p : peers_)
      if (p.fd >= 0) ::close(p.fd);
  }

  const char* name() const override { return "tcp"; }
  unsigned capabilities() const override { return kPointToPoint | kByteStream; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }

  Request isend(int peer, const void* buf, size_t bytes) override {
    return post(peer, 0, const_cast<void*>(buf), bytes);
  }
  Request irecv(int peer, void* buf, size_t bytes) override { return post(peer, 1, buf, bytes); }

  void wait(Request r, const Deadline& d) override {
    auto spin_until = Clock::now() + kSpin;
    while (!completed(r)) {
      if (progress_all()) {
        spin_until = Clock::now() + kSpin;
        continue;
      }
      if (completed(r)) break;
      if (busy_polling() && Clock::now() < spin_until) continue;
      if (d.passed()) d.expire("rank " + name(peer_of(r)));
      if (!busy_polling() && Clock::now() < spin_until + kYield) {
        ::sched_yield();
        continue;
      }
      sleep_in_poll(d);
    }
  }

  bool progress() override { return progress_all(); }
  bool done(Request r) override { return completed(r); }

  void idle(int ms, int wake_fd) override {
    poll_fds();
    if (wake_fd >= 0) pfds_.push_back({wake_fd, POLLIN, 0});
    ::poll(pfds_.data(), pfds_.size(), ms);
  }

  void abort(const std::string& why) override {
    if (failed_.empty()) failed_ = why.empty() ? "aborted" : why;
    for (auto& p : peers_)
      if (p.fd >= 0) ::shutdown(p.fd, SHUT_RDWR);
  }

  void per_peer_losses() override { lost_.resize(peers_.size()); }

 private:
  static uint64_t encode(int peer, int dir, uint64_t seq) {
    return ((seq + 1) << 21) | (static_cast<uint64_t>(dir) << 20) | static_cast<uint64_t>(peer);
  }
  static int peer_of(Request r) { return static_cast<int>(r.id & 0xfffff); }
  bool completed(Request r) const {
    if (r.id == 0) return true;
    const Peer& p = peers_[peer_of(r)];
    int dir = static_cast<int>((r.id >> 20) & 1);
    return p.completed[dir] >= (r.id >> 21);
  }

  void check_usable(int peer) const {
    if (!failed_.empty())
      throw Error("tcp: the transport is unusable after an earlier error (" + failed_ + ")");
    if (peer < 0 || peer >= size() || peer == rank_)
      throw Error("tcp: no connection to rank " + name(peer));
    if (!lost_.empty() && !lost_[static_cast<size_t>(peer)].empty())
      throw PeerLost(peer, "tcp: " + lost_[static_cast<size_t>(peer)]);
  }

  Request post(int peer, int dir, void* buf, size_t bytes) {
    check_usable(peer);
    if (bytes == 0) return {};
    Peer& p = peers_[peer];
    uint64_t seq = p.posted[dir]++;
    p.q[dir].push_back({static_cast<char*>(buf), bytes, 0});
    if (!p.active) {
      p.active = true;
      active_.push_back(peer);
    }
    if (p.q[dir].size() == 1) io(peer, dir);  // eager: most sends and many receives finish here
    return {encode(peer, dir, seq)};
  }

  [[noreturn]] void lost(int peer, const std::string& how) {
    std::string why = "lost rank " + name(peer) + " (" + how + ")";
    if (!lost_.empty()) {  // per_peer_losses(): this peer's operations never complete
      Peer& p = peers_[static_cast<size_t>(peer)];
      lost_[static_cast<size_t>(peer)] = why;
      ::shutdown(p.fd, SHUT_RDWR);
      p.q[0].clear();
      p.q[1].clear();
      throw PeerLost(peer, "tcp: " + why);
    }
    abort(why);
    throw Error("tcp: " + why);
  }

  // One readv/writev over the queued operations of `peer` in direction `dir`.  True if bytes
  // moved.
  bool io(int peer, int dir) {
    Peer& p = peers_[peer];
    auto& q = p.q[dir];
    if (q.empty()) return false;
    struct iovec iov[kMaxIov];
    int n = 0;
    for (auto it = q.begin(); it != q.end() && n < kMaxIov; ++it, ++n)
      iov[n] = {it->buf + it->done, it->len - it->done};
    ssize_t r;
    if (dir == 0) {
      struct msghdr mh {};
      mh.msg_iov = iov;
      mh.msg_iovlen = static_cast<size_t>(n);
      r = ::sendmsg(p.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
      r = ::readv(p.fd, iov, n);
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      if (!failed_.empty()) throw Error("tcp: " + failed_);
      lost(peer, "connection error: " + errno_text(errno));
    }
    if (r == 0 && dir == 1) {
      if (!failed_.empty()) throw Error("tcp: " + failed_);
      lost(peer, "it closed the connection: it exited, failed or gave up");
    }
    size_t left = static_cast<size_t>(r);
    while (left > 0) {
      Op& op = q.front();
      size_t take = std::min(left, op.len - op.done);
      op.done += take;
      left -= take;
      if (op.done == op.len) {
        q.pop_front();
        ++p.completed[dir];
      }
    }
    return r > 0;
  }

  // Nonblocking I/O on every peer with queued operations.  True if anything moved.
  bool progress_all() {
    if (!failed_.empty())
      throw Error("tcp: the transport is unusable after an earlier error (" + failed_ + ")");
    bool moved = false;
    for (size_t i = 0; i < active_.size();) {
      int peer = active_[i];
      moved |= io(peer, 1);
      moved |= io(peer, 0);
      Peer& p = peers_[peer];
      if (p.q[0].empty() && p.q[1].empty()) {
        p.active = false;
        active_[i] = active_.back();
        active_.pop_back();
      } else {
        ++i;
      }
    }
    return moved;
  }

  // pfds_: the sockets of the peers with queued operations, for what they wait.
  void poll_fds() {
    pfds_.clear();
    for (int peer : active_) {
      Peer& p = peers_[peer];
      short ev = static_cast<short>((p.q[0].empty() ? 0 : POLLOUT) | (p.q[1].empty() ? 0 : POLLIN));
      pfds_.push_back({p.fd, ev, 0});
    }
  }

  void sleep_in_poll(const Deadline& d) {
    poll_fds();
    ::poll(pfds_.data(), pfds_.size(), d.millis_left(100));
  }

  int rank_;
  std::vector<Peer> peers_;
  // Peers with queued operations, each once: a peer listed twice would be read twice in one
  // progress_all(), past a completed receive that its waiter has not yet looked at.
  std::vector<int> active_;
  std::vector<struct pollfd> pfds_;
  std::string failed_;
  std::vector<std::string> lost_;  // per_peer_losses(): why each peer was lost ("" if it was not)
  std::vector<int> names_;  // the rank that errors name for each peer (empty: its index)

  std::string name(int peer) const {
    bool named = peer >= 0 && static_cast<size_t>(peer) < names_.size();
    return std::to_string(named ? names_[static_cast<size_t>(peer)] : peer);
  }
};

}  // namespace

std::unique_ptr<Transport> make_transport(int rank, std::vector<int> fds, std::vector<int> names) {
  return std::make_unique<TcpTransport>(rank, std::move(fds), std::move(names));
}

}  // namespace pytorch_exec::dc::tcp
