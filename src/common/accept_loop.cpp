#include "common/accept_loop.hpp"

#include <cerrno>
#include <cstring>

#include "common/net.hpp"

namespace pe {

AcceptLoop::AcceptLoop(EventLoop& loop, int listen_fd, AcceptedFn accepted, PausedFn paused)
    : loop_(loop), fd_(listen_fd), accepted_(std::move(accepted)), paused_(std::move(paused)) {
  watch();
}

void AcceptLoop::watch() { accept_ev_ = loop_.watch_readable(fd_, [this] { on_accept(); }); }

void AcceptLoop::on_accept() {
  for (;;) {
    std::string peer;
    UniqueFd fd = accept_tcp(fd_, &peer);
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        paused_(std::strerror(errno));
        accept_ev_ = Event();
        resume_ = loop_.timer([this] { watch(); });
        resume_.arm(kAcceptPause);
      }
      return;
    }
    accepted_(std::move(fd), std::move(peer));
  }
}

WarningLimit::Say WarningLimit::next(const std::function<void(int)>& ended) {
  auto now = std::chrono::steady_clock::now();
  if (now - start_ >= std::chrono::duration<double>(window_)) {
    if (suppressed_ > 0) ended(suppressed_);
    start_ = now;
    warned_ = suppressed_ = 0;
  }
  if (warned_++ < per_window_) return Say::Yes;
  return suppressed_++ == 0 ? Say::FirstSuppressed : Say::Suppressed;
}

}  // namespace pe
