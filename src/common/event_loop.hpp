// The event loop of every pytorch_exec process: a thin RAII layer over libevent.
//
// Threading: an EventLoop and its Events are used from the thread that calls run(), only;
// the one exception is post(), which any thread may call to run work on the loop's thread
// (PMIx upcalls arrive on PMIx's own thread and are handed over this way).
#pragma once

#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

struct event_base;
struct event;

namespace pe {

class EventLoop;

// One registration: a readable fd, a signal or a timer.  Move-only; destroying it unregisters.
class Event {
 public:
  Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  // Timers only: (re)arm to fire once after `seconds`.
  void arm(double seconds);
  void disarm();
  bool pending() const;
  explicit operator bool() const { return ev_ != nullptr; }

 private:
  friend class EventLoop;
  struct Callback;
  struct event* ev_ = nullptr;
  std::unique_ptr<Callback> cb_;
};

class EventLoop {
 public:
  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Runs until stop().
  void run();
  void stop();

  // Persistent watch for readability (or EOF/error) on fd.
  Event watch_readable(int fd, std::function<void()> cb);
  // Persistent watch for writability on fd.
  Event watch_writable(int fd, std::function<void()> cb);
  // Persistent signal handler (runs in the loop, not in signal context).
  Event watch_signal(int signo, std::function<void()> cb);
  // A timer; call arm() to start it.
  Event timer(std::function<void()> cb);

  // Thread-safe: runs fn on the loop's thread, soon, in the order posted.
  void post(std::function<void()> fn);
  // Loop thread: runs what has been posted so far, now (e.g. a PMIx "finalized" notice that must
  // be seen before the exit of the process that sent it).
  void run_posted();

  event_base* base() { return base_; }

 private:
  Event make(int fd, short what, std::function<void()> cb);
  event_base* base_ = nullptr;
  int wake_fd_ = -1;  // eventfd written by post()
  Event wake_event_;
  std::mutex posted_mutex_;  // guards posted_
  std::deque<std::function<void()>> posted_;
};

// Signals as bytes in a pipe (a self-pipe), for a process whose loop may be held up outside
// itself: the loop watches fd() and take()s them, and a wait outside the loop (a write to a
// terminal or pipe that takes nothing) polls fd() too and gives up when a signal came, so that
// SIGTERM still stops the job.  (libevent's own signal events are seen only by its loop.)  One
// per process; the destructor puts the default actions back.
class SignalPipe {
 public:
  explicit SignalPipe(std::initializer_list<int> signals);  // throws SystemError
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  int fd() const { return read_fd_; }
  // The signals that arrived since the last call, in order; nonblocking.
  std::vector<int> take();

 private:
  int read_fd_ = -1;
  std::vector<int> signals_;
};

}  // namespace pe
