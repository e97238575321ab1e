#include "common/net.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.hpp"
#include "common/unique_fd.hpp"

namespace pe {

int find_free_port(const std::string& addr) {
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1)
    throw Error("not an IPv4 address: '" + addr + "'");
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  PE_CHECK_ERRNO(fd.valid(), "socket");
  PE_CHECK_ERRNO(::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) == 0,
                 "bind " + addr + ":0");
  socklen_t len = sizeof sa;
  PE_CHECK_ERRNO(::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), &len) == 0,
                 "getsockname");
  return ntohs(sa.sin_port);
}

std::string local_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace pe
