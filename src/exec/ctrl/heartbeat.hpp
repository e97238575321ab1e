// Liveness of a process's neighbours in the control-plane tree, for silent losses that no
// closed connection reports (a link cut, a frozen host).  Every `interval` seconds a Heartbeat
// frame goes over each watched link; a link from which nothing at all has arrived for `timeout`
// seconds (its own timeout, if watch() gave one) is silent: on_silent(id) is called once and
// the link is no longer watched.  The front end watches its own children only, each daemon its
// children and (for longer) its parent, so a loss is found where it happens and reported up the
// tree (a relay sends Lost), without waking every node.
//
// A process that was itself stalled (its timer late by half the timeout or more: swapped out,
// stopped, an overloaded machine) declares nobody silent on that tick: what its neighbours sent
// may be waiting unread in its sockets.  The next tick judges, after they were read.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "common/event_loop.hpp"

namespace pe::ctrl {

struct HeartbeatSettings {
  double interval = 1.0;  // seconds between heartbeats
  double timeout = 3.0;   // seconds of silence after which a neighbour is lost
};

// A daemon that has connected but is not ready yet is busy starting (loading the topology,
// starting its PMIx server: seconds on a large machine, its loop not free to send heartbeats).
// Its link is watched with this timeout until it is ready (settle()); the front end's start
// deadline (PYTORCH_EXEC_DAEMON_TIMEOUT) is what judges a daemon that never gets there.
constexpr double kStartingTimeout = 24 * 3600.0;

// "no heartbeat for 3 s"
std::string silence(double seconds);

class Heartbeats {
 public:
  using SendFn = std::function<void(int id)>;
  using SilentFn = std::function<void(int id)>;
  using ClockFn = std::function<double()>;  // seconds; the steady clock unless a test says
  Heartbeats(EventLoop& loop, HeartbeatSettings s, SendFn send, SilentFn on_silent,
             ClockFn clock = steady_seconds);
  ~Heartbeats();

  // Starts watching link `id` (heard now) and sending it heartbeats; it is silent after
  // `timeout` seconds (0: the settings' timeout).
  void watch(int id, double timeout = 0);
  // Something arrived on link `id`.
  void heard(int id);
  // Link `id` (watched with kStartingTimeout) is ready: from now on the settings' timeout.
  void settle(int id);
  void forget(int id);
  // While link `id` is held (true), it is not judged: we do not read it (backpressure), so its
  // silence says nothing.  Heartbeats still go to it.  Released, it counts as heard now.
  void hold(int id, bool held);
  // Sends the heartbeats that are due now, from a loop that is held up elsewhere (pytorch_exec
  // waiting for its terminal): its neighbours keep hearing from it.
  void beat();
  const HeartbeatSettings& settings() const { return s_; }
  // Heartbeats that are due go out, silent links are reported.  The timer calls it ten times
  // per interval (or timeout, if shorter), so a silence is found soon after it is long enough.
  void tick();
  static double steady_seconds();

 private:
  EventLoop& loop_;
  HeartbeatSettings s_;
  SendFn send_;
  SilentFn on_silent_;
  ClockFn clock_;
  struct Watched {
    double at = 0;       // last time something arrived
    double timeout = 0;  // silent after this long
    bool held = false;
  };
  std::map<int, Watched> heard_;  // by link
  double last_tick_ = 0, last_sent_ = 0;
  bool let_off_ = false;  // the last tick was late and judged nobody
  Event timer_;
};

}  // namespace pe::ctrl
