#include "common/event_loop.hpp"

#include <event2/event.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <cmath>

#include "common/error.hpp"

namespace pe {

struct Event::Callback {
  std::function<void()> fn;
  static void trampoline(evutil_socket_t, short, void* arg) {
    // Copy: the callback may destroy the Event that owns it.
    auto fn = static_cast<Callback*>(arg)->fn;
    fn();
  }
};

Event::Event() = default;

Event::Event(Event&& o) noexcept : ev_(o.ev_), cb_(std::move(o.cb_)) { o.ev_ = nullptr; }

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (ev_) event_free(ev_);
    ev_ = o.ev_;
    cb_ = std::move(o.cb_);
    o.ev_ = nullptr;
  }
  return *this;
}

Event::~Event() {
  if (ev_) event_free(ev_);
}

void Event::arm(double seconds) {
  if (!ev_) return;
  struct timeval tv;
  double whole = std::floor(seconds);
  tv.tv_sec = static_cast<time_t>(whole);
  tv.tv_usec = static_cast<suseconds_t>((seconds - whole) * 1e6);
  event_add(ev_, &tv);
}

void Event::disarm() {
  if (ev_) event_del(ev_);
}

bool Event::pending() const {
  return ev_ && event_pending(ev_, EV_TIMEOUT | EV_READ | EV_WRITE | EV_SIGNAL, nullptr);
}

EventLoop::EventLoop() {
  base_ = event_base_new();
  if (!base_) throw Error("cannot create the event loop (event_base_new failed)");
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    event_base_free(base_);
    throw SystemError("eventfd", errno);
  }
}

EventLoop::~EventLoop() {
  wake_event_ = Event();
  ::close(wake_fd_);
  event_base_free(base_);
}

void EventLoop::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    posted_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  (void)n;  // EAGAIN only when the counter is saturated: a wake-up is pending anyway
}

void EventLoop::run_posted() {
  uint64_t count;
  ssize_t n = ::read(wake_fd_, &count, sizeof count);
  (void)n;
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
}

void EventLoop::run() {
  if (!wake_event_) wake_event_ = watch_readable(wake_fd_, [this] { run_posted(); });
  if (event_base_dispatch(base_) < 0) throw Error("event loop failed (event_base_dispatch)");
}

void EventLoop::stop() { event_base_loopbreak(base_); }

Event EventLoop::make(int fd, short what, std::function<void()> cb) {
  Event e;
  e.cb_ = std::make_unique<Event::Callback>();
  e.cb_->fn = std::move(cb);
  e.ev_ = event_new(base_, fd, what, &Event::Callback::trampoline, e.cb_.get());
  if (!e.ev_) throw Error("cannot create an event (event_new failed)");
  return e;
}

Event EventLoop::watch_readable(int fd, std::function<void()> cb) {
  Event e = make(fd, EV_READ | EV_PERSIST, std::move(cb));
  if (event_add(e.ev_, nullptr) != 0) throw Error("cannot watch fd " + std::to_string(fd));
  return e;
}

Event EventLoop::watch_writable(int fd, std::function<void()> cb) {
  Event e = make(fd, EV_WRITE | EV_PERSIST, std::move(cb));
  if (event_add(e.ev_, nullptr) != 0) throw Error("cannot watch fd " + std::to_string(fd));
  return e;
}

Event EventLoop::watch_signal(int signo, std::function<void()> cb) {
  Event e = make(signo, EV_SIGNAL | EV_PERSIST, std::move(cb));
  if (event_add(e.ev_, nullptr) != 0) throw Error("cannot watch signal " + std::to_string(signo));
  return e;
}

Event EventLoop::timer(std::function<void()> cb) { return make(-1, 0, std::move(cb)); }

namespace {
int g_signal_write_fd = -1;
void signal_to_pipe(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t n = ::write(g_signal_write_fd, &b, 1);  // full: the loop has plenty to read already
  (void)n;
  errno = saved;
}
}  // namespace

SignalPipe::SignalPipe(std::initializer_list<int> signals) : signals_(signals) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) throw SystemError("pipe2", errno);
  read_fd_ = p[0];
  g_signal_write_fd = p[1];
  struct sigaction sa {};
  sa.sa_handler = signal_to_pipe;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : signals_) ::sigaction(sig, &sa, nullptr);
}

SignalPipe::~SignalPipe() {
  for (int sig : signals_) ::signal(sig, SIG_DFL);
  ::close(g_signal_write_fd);
  g_signal_write_fd = -1;
  ::close(read_fd_);
}

std::vector<int> SignalPipe::take() {
  std::vector<int> out;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(read_fd_, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < n; ++i) out.push_back(buf[i]);
  return out;
}

}  // namespace pe
