#include "common/unique_fd.hpp"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>

#include "common/error.hpp"

namespace pe {

Pipe make_pipe() {
  int fds[2];
  PE_CHECK_ERRNO(::pipe2(fds, O_CLOEXEC) == 0, "pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  PE_CHECK_ERRNO(flags >= 0, "fcntl(F_GETFL)");
  PE_CHECK_ERRNO(::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl(F_SETFL)");
}

bool write_all(int fd, const char* buf, size_t len) {
  while (len > 0) {
    ssize_t n = ::write(fd, buf, len);
    if (n > 0) {
      buf += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {fd, POLLOUT, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string read_file(const std::string& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string s;
  if (!fd.valid()) return s;
  char buf[4096];
  while (s.size() < max) {
    ssize_t n = ::read(fd.get(), buf, std::min(sizeof buf, max - s.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
  }
  return s;
}

}  // namespace pe
