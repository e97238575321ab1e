// Serving a listening socket from the event loop, and rate-limited warnings: what the control
// plane's Acceptor and the torch store (torch_store.hpp) share.
//
// AcceptLoop hands every connection that is ready to `accepted`.  When accept() fails for want of
// descriptors or buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM), the level-triggered listener would
// fire again at once and spin; instead accepting pauses for kAcceptPause seconds (as nginx does),
// after `paused(why)` is told.
//
// WarningLimit lets at most `per_window` warnings through every `window` seconds.
//
// Threading: the event loop's thread.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"

namespace pe {

class AcceptLoop {
 public:
  static constexpr double kAcceptPause = 0.1;
  using AcceptedFn = std::function<void(UniqueFd fd, std::string peer)>;
  using PausedFn = std::function<void(const std::string& why)>;
  // `listen_fd` stays the caller's and must outlive this.
  AcceptLoop(EventLoop& loop, int listen_fd, AcceptedFn accepted, PausedFn paused);

 private:
  void on_accept();
  void watch();

  EventLoop& loop_;
  int fd_;
  AcceptedFn accepted_;
  PausedFn paused_;
  Event accept_ev_, resume_;
};

class WarningLimit {
 public:
  enum class Say { Yes, FirstSuppressed, Suppressed };
  WarningLimit(int per_window, double window) : per_window_(per_window), window_(window) {}
  // Whether the next warning goes out.  When a new window begins and warnings were suppressed in
  // the last one, `ended(count)` is called first.
  Say next(const std::function<void(int suppressed)>& ended);
  int per_window() const { return per_window_; }
  double window() const { return window_; }

 private:
  int per_window_;
  double window_;
  std::chrono::steady_clock::time_point start_{};
  int warned_ = 0, suppressed_ = 0;
};

}  // namespace pe
