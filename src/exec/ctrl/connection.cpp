#include "exec/ctrl/connection.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/auth.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"

namespace pe::ctrl {

Connection::Connection(EventLoop& loop, UniqueFd fd, std::string peer, uint32_t max_payload)
    : loop_(loop), fd_(std::move(fd)), peer_(std::move(peer)), decoder_(max_payload) {
  read_ev_ = loop_.watch_readable(fd_.get(), [this] { on_readable(); });
}

Connection::~Connection() = default;

void Connection::send(uint16_t type, std::string_view payload) {
  if (!fd_.valid()) return;
  out_.push_back(wire::encode_frame(type, payload));
  out_bytes_ += out_.back().size();
  if (out_.size() == 1 && !flush()) return;
  if (!out_.empty() && !write_ev_)
    write_ev_ = loop_.watch_writable(fd_.get(), [this] { on_writable(); });
}

// Writes what the socket takes; false (and the connection failed) on an error.
bool Connection::flush() {
  while (!out_.empty()) {
    const std::string& f = out_.front();
    ssize_t n = ::send(fd_.get(), f.data() + out_off_, f.size() - out_off_, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return true;
      fail(std::string("write: ") + std::strerror(errno));
      return false;
    }
    out_off_ += static_cast<size_t>(n);
    out_bytes_ -= static_cast<size_t>(n);
    if (out_off_ == f.size()) {
      out_.pop_front();
      out_off_ = 0;
    }
  }
  return true;
}

void Connection::on_writable() {
  if (!flush()) return;
  if (out_.empty()) write_ev_ = Event();
  if (drained_ && out_bytes_ <= drained_low_) std::exchange(drained_, nullptr)();
}

void Connection::when_drained(size_t low, std::function<void()> fn) {
  drained_low_ = low;
  drained_ = std::move(fn);
  if (out_bytes_ <= low) std::exchange(drained_, nullptr)();
}

void Connection::pause_reading(bool paused) {
  if (paused == reading_paused_) return;
  reading_paused_ = paused;
  if (!fd_.valid()) return;
  if (paused)
    read_ev_ = Event();
  else
    read_ev_ = loop_.watch_readable(fd_.get(), [this] { on_readable(); });
}

void Connection::on_readable() {
  char buf[65536];
  ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n == 0) return fail("connection closed");
  if (n < 0) return fail(std::string("read: ") + std::strerror(errno));
  try {
    decoder_.feed(buf, static_cast<size_t>(n));
    wire::Frame f;
    while (fd_.valid() && decoder_.next(f)) {
      FrameFn fn = on_frame_;  // the callback may replace on_frame_ while it runs
      if (fn) fn(f);
    }
  } catch (const wire::WireError& e) {
    fail(e.what());
  }
}

void Connection::fail(const std::string& why) {
  if (!fd_.valid()) return;
  close();
  auto cb = std::move(on_closed_);
  if (cb) cb(why);  // may destroy this connection: nothing after this line
}

void Connection::close() {
  read_ev_ = Event();
  write_ev_ = Event();
  out_.clear();
  out_bytes_ = 0;
  fd_.reset();
}

void Connection::flush_and_close(double timeout) {
  if (!fd_.valid()) return;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  while (!out_.empty()) {
    struct pollfd p {
      fd_.get(), POLLOUT, 0
    };
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    if (!flush()) return;
  }
  ::shutdown(fd_.get(), SHUT_WR);
  close();
}

namespace {
constexpr double kHandshakeTimeout = 10.0;
constexpr uint32_t kHandshakeMaxPayload = 4096;
constexpr int kKeepaliveSeconds = 10;
// Connections one source address may have in the handshake at once; more are closed at once.
constexpr size_t kMaxPendingPerSource = 64;
// Warnings about dropped connections: at most kWarnings per kWarnWindow seconds.
constexpr int kWarnings = 10;
constexpr double kWarnWindow = 10.0;
// A Refused frame fits an empty socket buffer: this bounds a peer that does not read at all.
constexpr double kRefuseFlush = 0.2;

std::string source_of(const std::string& peer) { return peer.substr(0, peer.rfind(':')); }
}  // namespace

ConnLink::~ConnLink() {
  conn_->close();
  loop_.post([c = conn_.release()] { delete c; });
}

struct Acceptor::Pending {
  std::unique_ptr<Connection> conn;
  std::string nonce_f;
  Event timer;
  bool done = false;
};

Acceptor::Acceptor(EventLoop& loop, const std::string& secret, CheckFn check, AcceptedFn accepted,
                   int port, UniqueFd bound)
    : loop_(loop),
      secret_(secret),
      check_(std::move(check)),
      accepted_(std::move(accepted)),
      port_(port),
      fd_(bound.valid() ? std::move(bound) : listen_tcp("0.0.0.0", port, &port_)),
      warnings_(kWarnings, kWarnWindow),
      accept_(
          loop, fd_.get(), [this](UniqueFd fd, std::string peer) { on_accept(std::move(fd), peer); },
          [this](const std::string& why) {
            warn("cannot accept connections (" + why + "); pausing for " +
                 std::to_string(static_cast<int>(AcceptLoop::kAcceptPause * 1000)) + " ms");
          }) {}

Acceptor::~Acceptor() = default;

void Acceptor::on_accept(UniqueFd fd, const std::string& peer) {
  std::string source = source_of(peer);
  if (std::count_if(pending_.begin(), pending_.end(), [&](const auto& q) {
        return !q->done && source_of(q->conn->peer()) == source;
      }) >= static_cast<long>(kMaxPendingPerSource)) {
    warn("refused a connection from " + peer + ": too many handshakes from " + source);
    return;
  }
  tune_control_socket(fd.get(), kKeepaliveSeconds);
  auto p = std::make_unique<Pending>();
  Pending* pp = p.get();
  p->conn = std::make_unique<Connection>(loop_, std::move(fd), peer, kHandshakeMaxPayload);
  p->nonce_f = auth::random_bytes(auth::kNonceBytes);
  p->conn->on_frame([this, pp](wire::Frame& f) { on_frame(pp, f); });
  p->conn->on_closed([this, pp](const std::string& why) { drop(pp, why); });
  p->timer = loop_.timer([this, pp] { drop(pp, "no handshake within 10 s"); });
  p->timer.arm(kHandshakeTimeout);
  Challenge challenge;
  challenge.nonce = p->nonce_f;
  p->conn->send(challenge);
  pending_.push_back(std::move(p));
}

// Untrusted text (a node name from a hello) is escaped, and the warnings are rate-limited.
void Acceptor::warn(const std::string& what) {
  auto say = warnings_.next([](int n) {
    logger("ctrl")->warn("control plane: {} more warnings about connections were suppressed", n);
  });
  if (say == WarningLimit::Say::Yes) {
    logger("ctrl")->warn("control plane: {}", printable(what, 512));
  } else if (say == WarningLimit::Say::FirstSuppressed) {
    logger("ctrl")->warn(
        "control plane: more than {} warnings about connections in {} s; "
        "suppressing the rest",
        warnings_.per_window(), warnings_.window());
  }
}

void Acceptor::drop(Pending* p, const std::string& why) {
  if (p->done) return;
  warn("dropped connection from " + p->conn->peer() + ": " + why);
  p->conn->close();
  forget(p);
}

// The node has sent its hello and waits for an answer: nothing of it is left unread, so the
// Refused frame is not lost to a reset when the connection closes.
void Acceptor::refuse(Pending* p, const Verdict& v, const std::string& name) {
  warn("dropped connection from " + p->conn->peer() + " (node '" + name + "'): " + v.why);
  p->conn->send(Refused{v.why, v.retry});
  p->conn->flush_and_close(kRefuseFlush);
  forget(p);
}

// Destroyed later: this runs inside the connection's own callbacks.
void Acceptor::forget(Pending* p) {
  p->done = true;
  p->timer.disarm();
  loop_.post([this, p] {
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [p](const auto& q) { return q.get() == p; }),
                   pending_.end());
  });
}

void Acceptor::on_frame(Pending* p, wire::Frame& f) {
  if (p->done) return;
  if (f.type != static_cast<uint16_t>(Msg::Hello))
    throw wire::WireError(std::string("out-of-order ") + msg_name(f.type) +
                          " frame before authentication");
  if (std::string theirs = protocol_mismatch(f.payload); !theirs.empty())
    return refuse(p,
                  Verdict("the node speaks " + theirs + " and this host speaks control protocol " +
                          std::to_string(kProtocolVersion) +
                          ": use the same pytorch_exec version on every node"),
                  "?");
  Hello h = decode<Hello>(f.payload);
  const std::string& name = h.node;
  if (!auth::proof_matches(auth::daemon_proof(secret_, p->nonce_f, h.nonce, name), h.proof))
    return refuse(p, Verdict("authentication failed (a wrong secret or rendezvous id)"), name);
  Verdict v = check_(h);
  if (!v.why.empty()) return refuse(p, v, name);
  p->conn->send(Welcome{auth::frontend_proof(secret_, p->nonce_f, h.nonce, name)});
  p->conn->set_max_payload(wire::kMaxPayload);
  std::unique_ptr<Connection> conn = std::move(p->conn);
  conn->on_frame({});  // the new owner installs its own
  conn->on_closed({});
  std::string known_as = v.name.empty() ? name : v.name;
  forget(p);
  accepted_(known_as, std::move(conn));
}

}  // namespace pe::ctrl
