#include "common/net.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "common/error.hpp"
#include "common/unique_fd.hpp"

namespace pe {

namespace {

// Whether addr:port (and nothing else) can be bound now; no SO_REUSEADDR, so that a port still
// in use by a closing connection counts as taken.
bool bindable(const struct sockaddr_in& addr, int port) {
  struct sockaddr_in sa = addr;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  return fd.valid() && ::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) == 0;
}

}  // namespace

std::pair<int, int> ephemeral_port_range() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int a = 0, b = 0;
    if (std::fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && a <= b && b < 65536) lo = a, hi = b;
    std::fclose(f);
  }
  return {lo, hi};
}

int port_outside_ephemeral(uint32_t n) {
  // [kLowestPort, lo-2] and [hi+1, 65534]: p and p+1 both outside the range.
  constexpr int kLowestPort = 10000;
  auto [lo, hi] = ephemeral_port_range();
  int below = std::max(0, lo - 1 - kLowestPort), above = std::max(0, 65534 - hi);
  if (below + above == 0) return kLowestPort;  // the whole range is ephemeral
  int i = static_cast<int>(n % static_cast<uint32_t>(below + above));
  return i < below ? kLowestPort + i : hi + 1 + (i - below);
}

namespace {

// The first port p for which take(p) holds, of kPortTries random ones outside the ephemeral
// range with p+1 free too; -1 when none.
int try_master_ports(const struct sockaddr_in& sa, const std::function<bool(int)>& take) {
  std::random_device rd;
  for (int tries = 0; tries < kPortTries; ++tries) {
    int p = port_outside_ephemeral(rd());
    if (bindable(sa, p + 1) && take(p)) return p;
  }
  return -1;
}

struct sockaddr_in ipv4_any_port(const std::string& addr) {
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1)
    throw Error("not an IPv4 address: '" + addr + "'");
  return sa;
}

}  // namespace

int find_free_port(const std::string& addr) {
  struct sockaddr_in sa = ipv4_any_port(addr);
  int p = try_master_ports(sa, [&sa](int port) { return bindable(sa, port); });
  if (p > 0) return p;
  // Everything tried is taken: let the kernel choose (inside the ephemeral range).
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  PE_CHECK_ERRNO(fd.valid(), "socket");
  PE_CHECK_ERRNO(::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) == 0,
                 "bind " + addr + ":0");
  socklen_t len = sizeof sa;
  PE_CHECK_ERRNO(::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), &len) == 0,
                 "getsockname");
  return ntohs(sa.sin_port);
}

UniqueFd listen_master_port(const std::string& addr, int* bound_port) {
  struct sockaddr_in sa = ipv4_any_port(addr);
  UniqueFd fd;
  int p = try_master_ports(sa, [&](int port) {
    try {
      fd = listen_tcp(addr, port, nullptr);
      return true;
    } catch (const SystemError& e) {
      if (e.code() != EADDRINUSE && e.code() != EACCES) throw;
      return false;
    }
  });
  if (p > 0) {
    *bound_port = p;
    return fd;
  }
  return listen_tcp(addr, 0, bound_port);  // the kernel's choice, inside the ephemeral range
}

std::string local_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace pe

namespace pe {
namespace {

// False when `addr` is not a dotted IPv4 address.
bool parse_ipv4(const std::string& addr, int port, struct sockaddr_in& sa) {
  sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) == 1;
}

struct sockaddr_in ipv4(const std::string& addr, int port) {
  struct sockaddr_in sa {};
  if (!parse_ipv4(addr, port, sa)) throw Error("not an IPv4 address: '" + addr + "'");
  return sa;
}

std::string address_string(const struct sockaddr_in& sa) {
  char buf[INET_ADDRSTRLEN] = {};
  return ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf) ? buf : "";
}

std::string resolve_ipv4(const std::string& host) {
  struct in_addr a;
  if (::inet_pton(AF_INET, host.c_str(), &a) == 1) return host;
  struct addrinfo hints {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) throw Error("cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  std::string s = address_string(*reinterpret_cast<struct sockaddr_in*>(res->ai_addr));
  ::freeaddrinfo(res);
  return s;
}

}  // namespace

UniqueFd listen_tcp(const std::string& addr, int port, int* bound_port) {
  auto sa = ipv4(addr, port);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  PE_CHECK_ERRNO(fd.valid(), "socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  PE_CHECK_ERRNO(::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) == 0,
                 "bind " + addr + ":" + std::to_string(port));
  PE_CHECK_ERRNO(::listen(fd.get(), 4096) == 0, "listen");
  socklen_t len = sizeof sa;
  PE_CHECK_ERRNO(::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), &len) == 0,
                 "getsockname");
  if (bound_port) *bound_port = ntohs(sa.sin_port);
  return fd;
}

bool port_has_listener(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
      // "  0: 00000000:7530 00000000:0000 0A ...": local address:port (hex), remote, state.
      std::istringstream in(line);
      std::string slot, local, remote, state;
      if (!(in >> slot >> local >> remote >> state)) continue;
      auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;  // TCP_LISTEN
      if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port) return true;
    }
  }
  return false;
}

UniqueFd accept_tcp(int listen_fd, std::string* peer_addr) {
  struct sockaddr_in sa {};
  socklen_t len = sizeof sa;
  UniqueFd fd(::accept4(listen_fd, reinterpret_cast<struct sockaddr*>(&sa), &len,
                        SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (fd.valid() && peer_addr)
    *peer_addr = address_string(sa) + ":" + std::to_string(ntohs(sa.sin_port));
  return fd;
}

UniqueFd connect_tcp(const std::string& host, int port, double timeout) {
  std::string target = host + ":" + std::to_string(port);
  auto sa = ipv4(resolve_ipv4(host), port);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  PE_CHECK_ERRNO(fd.valid(), "socket");
  if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) != 0) {
    if (errno != EINPROGRESS) throw SystemError("connect to " + target, errno);
    struct pollfd p {
      fd.get(), POLLOUT, 0
    };
    int rc;
    do rc = ::poll(&p, 1, static_cast<int>(timeout * 1000));
    while (rc < 0 && errno == EINTR);
    if (rc == 0)
      throw TimeoutError("connect to " + target + ": no answer within " +
                         std::to_string(static_cast<int>(timeout)) + " s");
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (rc < 0 || err) throw SystemError("connect to " + target, rc < 0 ? errno : err);
  }
  return fd;
}

UniqueFd connect_first(const std::vector<std::pair<std::string, int>>& targets, double timeout,
                       double attempt) {
  using Clock = std::chrono::steady_clock;
  auto secs = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  constexpr double kPause = 0.5;  // before another try at a refused or unresolved target
  // Target i is first tried this much after target i - 1 (the first usually answers at once,
  // and no second connection is made that the other end sees open and closed).
  constexpr double kStagger = 0.25;
  struct Try {
    std::string name;
    UniqueFd fd;                  // an attempt in progress
    Clock::time_point next, end;  // when to try again; when the attempt in progress ends
    std::string trouble;          // of the last attempt
  };
  std::vector<Try> tries;
  for (const auto& [host, port] : targets)
    tries.push_back(Try{host + ":" + std::to_string(port), {},
                        Clock::now() + secs(kStagger * static_cast<double>(tries.size())), {}, ""});
  auto deadline = Clock::now() + secs(timeout);
  for (;;) {
    auto now = Clock::now();
    std::vector<struct pollfd> p;
    std::vector<size_t> which;
    for (size_t i = 0; i < tries.size(); ++i) {
      Try& t = tries[i];
      if (t.fd.valid() && now >= t.end) {  // no answer: a lost SYN is sent again, not waited for
        t.trouble = "no answer within " + std::to_string(static_cast<int>(attempt)) + " s";
        t.fd.reset();
        t.next = now;
      }
      if (!t.fd.valid() && now >= t.next) {
        try {
          auto sa = ipv4(resolve_ipv4(targets[i].first), targets[i].second);
          UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
          PE_CHECK_ERRNO(fd.valid(), "socket");
          if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) == 0)
            return fd;
          if (errno != EINPROGRESS) throw SystemError("connect", errno);
          t.fd = std::move(fd);
          t.end = now + secs(attempt);
        } catch (const Error& e) {
          t.trouble = e.what();
          t.next = now + secs(kPause);
        }
      }
      if (t.fd.valid()) {
        p.push_back({t.fd.get(), POLLOUT, 0});
        which.push_back(i);
      }
    }
    if (now >= deadline) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    int rc = ::poll(p.data(), p.size(), static_cast<int>(std::clamp<long long>(left, 1, 100)));
    if (rc < 0 && errno != EINTR) throw SystemError("poll", errno);
    for (size_t k = 0; rc > 0 && k < p.size(); ++k) {
      if (!p[k].revents) continue;
      Try& t = tries[which[k]];
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(t.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) return std::move(t.fd);
      t.trouble = std::strerror(err);
      t.fd.reset();
      t.next = Clock::now() + secs(kPause);
    }
  }
  std::string why;
  for (const auto& t : tries)
    why += (why.empty() ? "" : "; ") + t.name + ": " + (t.trouble.empty() ? "no answer" : t.trouble);
  throw TimeoutError("no connection within " + std::to_string(static_cast<int>(timeout)) +
                     " s (" + why + ")");
}

std::string peer_address(int fd) {
  struct sockaddr_in sa {};
  socklen_t len = sizeof sa;
  if (::getpeername(fd, reinterpret_cast<struct sockaddr*>(&sa), &len) != 0 ||
      sa.sin_family != AF_INET)
    return "";
  return address_string(sa);
}

std::string local_address(int fd) {
  struct sockaddr_in sa {};
  socklen_t len = sizeof sa;
  if (::getsockname(fd, reinterpret_cast<struct sockaddr*>(&sa), &len) != 0 ||
      sa.sin_family != AF_INET)
    return "";
  return address_string(sa);
}

void tune_control_socket(int fd, int seconds) {
  int one = 1, idle = std::max(1, seconds / 2), intvl = 1, cnt = std::max(1, seconds - idle);
  unsigned user_timeout = static_cast<unsigned>(seconds) * 1000u;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

namespace {

bool bridge_like(const std::string& ifname) {
  for (const char* p : {"docker", "virbr", "veth", "br-"})
    if (ifname.rfind(p, 0) == 0) return true;
  return false;
}

}  // namespace

std::vector<std::string> order_addresses(const std::vector<InterfaceAddress>& ifs) {
  std::vector<std::string> out, bridges, loopback;
  for (const auto& i : ifs)
    (i.loopback ? loopback : bridge_like(i.ifname) ? bridges : out).push_back(i.addr);
  out.insert(out.end(), bridges.begin(), bridges.end());
  out.insert(out.end(), loopback.begin(), loopback.end());
  return out;
}

std::vector<std::string> local_ipv4_addresses() {
  std::vector<InterfaceAddress> found;
  struct ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return {"127.0.0.1"};
  for (auto* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    found.push_back({i->ifa_name ? i->ifa_name : "",
                     address_string(*reinterpret_cast<struct sockaddr_in*>(i->ifa_addr)),
                     (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(ifs);
  auto out = order_addresses(found);
  if (out.empty()) out.push_back("127.0.0.1");
  return out;
}

std::string route_source_address(const std::string& dest) {
  struct sockaddr_in sa {};
  if (!parse_ipv4(dest, 9, sa))
    return "";  // port 9, discard: connect() on UDP only picks the route
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa) != 0)
    return "";
  return local_address(fd.get());
}

void open_closed_stdio() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);  // the lowest free: fd itself
    if (n >= 0 && n != fd) {
      ::dup2(n, fd);
      ::close(n);
    }
  }
}

void raise_fd_limit() {
  struct rlimit l {};
  if (::getrlimit(RLIMIT_NOFILE, &l) == 0 && l.rlim_cur < l.rlim_max) {
    l.rlim_cur = l.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &l);
  }
}

}  // namespace pe
