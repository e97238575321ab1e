// Move-only owner of a file descriptor.
#pragma once

#include <unistd.h>

#include <string>
#include <utility>

namespace pe {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// pipe2(O_CLOEXEC); throws SystemError.
Pipe make_pipe();
void set_nonblocking(int fd);

// Writes all of buf to fd, waiting with poll() if fd is non-blocking.  Returns false on an error
// such as EPIPE (errno is kept), true when everything was written.
bool write_all(int fd, const char* buf, size_t len);

// The contents of a small file (a /proc or /sys entry), at most `max` bytes; "" when it cannot be
// opened.  Plain reads, no stream: the node agent reads a few such files at every exit.
std::string read_file(const std::string& path, size_t max = size_t{1} << 20);

}  // namespace pe
