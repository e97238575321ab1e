// The control plane's connections between pytorch_exec (the front end) and the pytorch_execd
// daemons: a framed, non-blocking connection on the event loop, and the accepting side of the
// handshake.  Messages are in ctrl/messages.hpp; connections are authenticated as
// common/auth.hpp describes before anything else is accepted on them.
//
// Threading: a Connection is used on its event loop's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/accept_loop.hpp"
#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"
#include "common/wire.hpp"
#include "exec/ctrl/messages.hpp"
#include "exec/ctrl/tree.hpp"

namespace pe::ctrl {

// A connected, non-blocking socket carrying frames.  Incoming frames go to on_frame; a
// malformed one (WireError) or one that on_frame rejects by throwing WireError closes the
// connection with the reason, reported once through on_closed.  Never destroy a connection
// inside one of its own callbacks: post() the destruction to the loop.
class Connection : public Link {
 public:
  using FrameFn = std::function<void(wire::Frame&)>;
  using ClosedFn = std::function<void(const std::string& why)>;

  Connection(EventLoop& loop, UniqueFd fd, std::string peer,
             uint32_t max_payload = wire::kMaxPayload);
  ~Connection() override;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void on_frame(FrameFn f) { on_frame_ = std::move(f); }
  void set_max_payload(uint32_t max) { decoder_.set_max_payload(max); }
  void on_closed(ClosedFn f) { on_closed_ = std::move(f); }
  using Link::send;
  void send(uint16_t type, std::string_view payload) override;
  void finish() override { flush_and_close(1.0); }
  // Closes now (queued output is dropped); on_closed is not called.
  void close();
  // Sends what is queued (waiting at most `timeout` seconds), then closes.
  void flush_and_close(double timeout);
  bool open() const { return fd_.valid(); }
  const std::string& peer() const { return peer_; }
  int fd() const { return fd_.get(); }
  size_t queued() const { return out_bytes_; }
  // Calls `fn` once, as soon as what is queued is at most `low` bytes (output backpressure).
  void when_drained(size_t low, std::function<void()> fn);
  // Stops (true) or resumes reading the socket: the peer's frames wait in the socket, then in
  // the peer's queue.  Writing goes on, and a write that fails still closes the connection.
  void pause_reading(bool paused) override;

 private:
  void on_readable();
  void on_writable();
  void fail(const std::string& why);
  bool flush();

  EventLoop& loop_;
  UniqueFd fd_;
  std::string peer_;
  wire::FrameDecoder decoder_;
  Event read_ev_, write_ev_;
  std::deque<std::string> out_;
  size_t out_off_ = 0;
  size_t out_bytes_ = 0;
  size_t drained_low_ = 0;
  std::function<void()> drained_;
  FrameFn on_frame_;
  ClosedFn on_closed_;
  bool in_callback_ = false;
  bool reading_paused_ = false;
};

// A Connection as a tree Link that the tree may destroy at any time: it closes at once and is
// deleted later on the loop (never inside one of its own callbacks).
class ConnLink : public Link {
 public:
  ConnLink(EventLoop& loop, std::unique_ptr<Connection> conn)
      : loop_(loop), conn_(std::move(conn)) {}
  ~ConnLink() override;
  using Link::send;
  void send(uint16_t type, std::string_view payload) override { conn_->send(type, payload); }
  void finish() override { conn_->finish(); }
  void pause_reading(bool paused) override { conn_->pause_reading(paused); }
  Connection& conn() { return *conn_; }

 private:
  EventLoop& loop_;
  std::unique_ptr<Connection> conn_;
};

// The accepting side of the handshake, for the front end and for relaying daemons: listens on
// every address (at `port`, 0: any free one; or on `bound`, a socket listening there already),
// challenges each new connection, and hands over
// those that prove they know the secret and name a node `check` accepts.  The others are told
// why in a Refused frame (nothing they did not send, or a failed proof), closed and logged (warn,
// rate-limited); a connection has 10 s to complete the handshake, and frames before it are
// limited to 4 KiB.
class Acceptor {
 public:
  using CheckFn = std::function<Verdict(const Hello& hello)>;
  using AcceptedFn = std::function<void(const std::string& name, std::unique_ptr<Connection> conn)>;

  Acceptor(EventLoop& loop, const std::string& secret, CheckFn check, AcceptedFn accepted,
           int port = 0, UniqueFd bound = {});
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;
  int port() const { return port_; }

 private:
  struct Pending;
  void on_accept(UniqueFd fd, const std::string& peer);
  void on_frame(Pending* p, wire::Frame& f);
  void drop(Pending* p, const std::string& why);
  void refuse(Pending* p, const Verdict& v, const std::string& name);
  void forget(Pending* p);
  void warn(const std::string& what);

  EventLoop& loop_;
  const std::string& secret_;
  CheckFn check_;
  AcceptedFn accepted_;
  int port_ = 0;
  UniqueFd fd_;
  WarningLimit warnings_;
  std::vector<std::unique_ptr<Pending>> pending_;
  AcceptLoop accept_;  // last: it calls on_accept() and warn()
};

}  // namespace pe::ctrl
