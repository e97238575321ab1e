// The DataChannel's transport interface: how bytes move between two ranks of a process group.
//
// A transport connects this rank with the other ranks of the world it was created for (peers are
// world ranks, 0 ... size-1).  Point-to-point operations are asynchronous: isend/irecv post an
// operation and return a Request; wait() drives progress until that request has completed.
// Operations with the same peer and direction complete in the order they were posted, and are
// matched in that order: the k-th irecv from P receives the bytes of P's k-th isend to this rank
// (sizes agree by construction of the algorithms; a transport may check).  Any request of a
// transport may complete while waiting on another one; buffers must stay valid until their
// request completed.
//
// Capabilities are stated, not discovered by exceptions: a transport that moves bytes between
// any two ranks has kPointToPoint (tcp, mpi).  Shared memory (shm/) is not a Transport: it is
// the node's allreduce engine, with its own interface (shm/engine.hpp).  Transports are created
// by the registry (registry.hpp) only.
//
// Threads: a Transport is used by one thread at a time: the one that runs the group's operations,
// or, for the connections of a lane of a hierarchical allreduce (collectives.cpp), that lane's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {

using Clock = std::chrono::steady_clock;

// A point in time by which an operation must complete, and what to call the operation in a
// TimeoutError ("allreduce of 4096 f32 (sum)").  The description is put together only when it
// is needed, so that a deadline costs nothing on the fast path.
// The longest timeout, seconds (three years): a longer one (infinity too) is taken as this, so
// that no time point overflows.
inline constexpr double kMaxTimeout = 1e8;

struct Deadline {
  Clock::time_point at;
  std::string label;         // a fixed description ("process group set-up"), or
  const char* op = nullptr;  // a call: its name, count, dtype, reduction, peer (-1: none)
  uint64_t count = 0;
  int dtype = -1, reduction = -1, peer = -1;

  static Deadline after(double seconds, std::string label);
  static Deadline call(double seconds, const char* op, uint64_t count, int dtype,
                       int reduction = -1, int peer = -1);
  std::string describe() const;
  bool passed() const { return Clock::now() >= at; }
  // Milliseconds left, at least 0, at most `cap` (for poll()).
  int millis_left(int cap = 1000) const;
  // Throws TimeoutError naming the operation and `waiting_for` ("rank 3").
  [[noreturn]] void expire(const std::string& waiting_for) const;
};

struct Request {
  uint64_t id = 0;  // 0: no request (a zero-byte operation that completed at once)
};

class Transport {
 public:
  // kByteStream: bytes from one isend may be taken by several irecvs (and one irecv may take
  // several sends), as on a TCP stream; without it every send is one message, received whole.
  enum Capability : unsigned { kPointToPoint = 1u << 0, kByteStream = 1u << 1 };

  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual unsigned capabilities() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual Request isend(int peer, const void* buf, size_t bytes) = 0;
  virtual Request irecv(int peer, void* buf, size_t bytes) = 0;
  // Progress until `r` completes.  Throws TimeoutError when the deadline passes first, and Error
  // when the peer of `r` (or of any operation progressed meanwhile) is lost.
  virtual void wait(Request r, const Deadline& d) = 0;
  // For the Mailbox, which must not block: one pass of nonblocking I/O over every posted
  // operation (true if anything moved; throws as wait() does), and whether `r` has completed
  // (no I/O; a completed request is not asked about again).
  virtual bool progress() = 0;
  virtual bool done(Request r) = 0;
  // Sleeps until a posted operation may move, at most `ms` milliseconds, or until `wake_fd`
  // (-1: none) is readable.
  virtual void idle(int ms, int wake_fd) = 0;
  // After an error: make the peers notice that this rank can no longer take part (they get an
  // error instead of waiting for their timeout).  Every later operation throws.
  virtual void abort(const std::string& why) = 0;
  // From now on a lost connection fails only what involves that peer: progress() throws
  // PeerLost once, the peer's operations never complete, new ones with it throw PeerLost; the
  // others go on (the Mailbox, whose peers are independent pairs).  Where a transport cannot,
  // a loss stays what it was (the whole transport fails).
  virtual void per_peer_losses() {}
};

// A peer's connection lost, under Transport::per_peer_losses().
class PeerLost : public Error {
 public:
  PeerLost(int peer, const std::string& what) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// Whether a waiting rank may poll busily before it sleeps: only while this node has a processor
// for each of its ranks.  On an oversubscribed node a polling rank takes the time of the rank it
// waits for, so waits there yield or sleep at once.  A process group turns it off when its
// layout has more ranks on this node than the node has processors; it stays off.  A thread that
// called set_thread_spinning(false) (dc.hpp) never polls.
bool busy_polling();
void no_busy_polling();

// Blocking helpers over a transport.
void send(Transport& t, int peer, const void* buf, size_t bytes, const Deadline& d);
void recv(Transport& t, int peer, void* buf, size_t bytes, const Deadline& d);
// Send to one peer and receive from another (or the same) at once, as a ring step does.
void sendrecv(Transport& t, int to, const void* sbuf, size_t sbytes, int from, void* rbuf,
              size_t rbytes, const Deadline& d);

}  // namespace pytorch_exec::dc
