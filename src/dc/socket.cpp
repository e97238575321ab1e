#include "dc/socket.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "dc/bootstrap.hpp"

namespace pytorch_exec::dc {
namespace {

using AddrInfo = std::unique_ptr<struct addrinfo, decltype(&::freeaddrinfo)>;

AddrInfo resolve(const std::string& host, int port, int socktype) {
  struct addrinfo hints {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = socktype;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) res = nullptr;
  return AddrInfo(res, &::freeaddrinfo);
}

}  // namespace

namespace {

// A listening socket on sa; -1 with errno set on failure.
int listen_on(const struct sockaddr_in& sa, bool reuse) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0 && reuse) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd >= 0 && (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 ||
                  ::listen(fd, 1024) != 0)) {
    int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

}  // namespace

Listener::Listener(int port, const std::string& addr) {
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (!addr.empty()) {
    AddrInfo res = resolve(addr, port, SOCK_STREAM);
    if (res) sa = *reinterpret_cast<const struct sockaddr_in*>(res->ai_addr);
  }
  fd_ = listen_on(sa, port != 0);
  if (fd_ < 0 && errno == EADDRNOTAVAIL) {  // not an address of this host
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    fd_ = listen_on(sa, port != 0);
  }
  if (fd_ < 0)
    throw Error("cannot listen on TCP port " +
                (port ? std::to_string(port) : std::string("(any)")) + ": " + std::strerror(errno));
  socklen_t len = sizeof sa;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  char buf[INET_ADDRSTRLEN] = "0.0.0.0";
  ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  host_ = buf;
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

Listener::Listener(Listener&& o) noexcept : fd_(o.fd_), port_(o.port_), host_(o.host_) {
  o.fd_ = -1;
}

int Listener::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string congestion_control(int fd) {
  char name[32] = {};
  socklen_t len = sizeof name - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, ::strnlen(name, len));
}

void check_congestion_name(const std::string& name, const std::string& source) {
  bool ok = !name.empty() && name.size() < 16;
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!ok)
    throw Error(source + "=" + name +
                ": expected auto, system or a TCP congestion control name such as cubic or reno");
}

void set_congestion_control(int fd, const std::string& name, const std::string& source) {
  auto set = [fd](const std::string& n) {
    return ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, n.data(),
                        static_cast<socklen_t>(n.size())) == 0;
  };
  if (name == "system") return;
  if (name == "auto") {
    if (congestion_control(fd) == "bbr" && !set("cubic")) set("reno");
    return;
  }
  if (set(name)) return;
  int e = errno;
  std::string allowed = first_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  throw Error(source + "=" + name + ": this host does not let the DataChannel use it (" +
              std::strerror(e) + ")" + (allowed.empty() ? "" : "; allowed: " + allowed));
}

void split_address(const std::string& addr, std::string& host, int& port, const std::string& what) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos) throw Error(what + ": bad address '" + addr + "'");
  host = addr.substr(0, colon);
  port = std::atoi(addr.c_str() + colon + 1);
}

int connect_until(const std::string& host, int port, const Deadline& d, const std::string& what,
                  const std::string& source) {
  AddrInfo res = resolve(host, port, SOCK_STREAM);
  if (!res) throw Error(what + ": cannot resolve '" + host + "'");
  struct sockaddr_in from {};
  from.sin_family = AF_INET;
  bool bind_source = !source.empty() && source != "0.0.0.0" &&
                     ::inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && bind_source &&
        ::bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) != 0) {
      int e = errno;
      ::close(fd);
      throw Error(what + ": cannot use this host's address " + source + ": " + std::strerror(e));
    }
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    int e = errno;
    if (fd >= 0) ::close(fd);
    if (d.passed())
      throw TimeoutError(what + ": cannot connect to " + host + ":" + std::to_string(port) + " (" +
                         std::strerror(e) + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void io_exact(int fd, void* p, size_t n, bool out, const Deadline& d, const std::string& who,
              const std::string& what) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    struct pollfd pf {
      fd, static_cast<short>(out ? POLLOUT : POLLIN), 0
    };
    if (::poll(&pf, 1, d.millis_left()) == 0) {
      if (d.passed()) d.expire(who);
      continue;
    }
    ssize_t r =
        out ? ::send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recv(fd, c, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0)
      throw Error(what + ": " +
                  (r == 0 ? std::string("the connection was closed") : std::strerror(errno)));
    c += r;
    n -= static_cast<size_t>(r);
  }
}

std::string interface_address(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') return "";
  std::vector<std::string> netdevs;
  std::error_code ec;
  if (std::filesystem::exists("/sys/class/net/" + name, ec)) {
    netdevs.push_back(name);
  } else {
    for (auto& e : std::filesystem::directory_iterator(
             "/sys/class/infiniband/" + name + "/device/net", ec))
      netdevs.push_back(e.path().filename().string());
    std::sort(netdevs.begin(), netdevs.end());
  }
  struct ifaddrs* all = nullptr;
  if (netdevs.empty() || ::getifaddrs(&all) != 0) return "";
  std::string out;
  for (const std::string& dev : netdevs) {
    for (struct ifaddrs* a = all; a && out.empty(); a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || dev != a->ifa_name ||
          !(a->ifa_flags & IFF_UP))
        continue;
      auto* sa = reinterpret_cast<const struct sockaddr_in*>(a->ifa_addr);
      if ((ntohl(sa->sin_addr.s_addr) >> 16) == 0xa9fe) continue;  // 169.254/16: link-local
      char buf[INET_ADDRSTRLEN];
      if (::inet_ntop(AF_INET, &sa->sin_addr, buf, sizeof buf)) out = buf;
    }
    if (!out.empty()) break;
  }
  ::freeifaddrs(all);
  return out;
}

std::string local_address_toward(const std::string& toward) {
  if (toward.empty()) return "127.0.0.1";
  AddrInfo res = resolve(toward, 9, SOCK_DGRAM);
  if (!res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa {};
  socklen_t len = sizeof sa;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    char buf[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf)) out = buf;
  }
  if (fd >= 0) ::close(fd);
  return out;
}

}  // namespace pytorch_exec::dc
