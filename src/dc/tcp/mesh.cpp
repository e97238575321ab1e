// The tcp transport's set-up: connect_mesh() (transport.hpp).  A rank connects to every lower
// rank and accepts every higher one; every connection carries the hello of hello.hpp.  Accepted
// connections are served together (poll over the listener and all pending hellos), each with a
// short deadline of its own and at most kMaxPending at once, so that idle or slow strangers
// cannot hold up the ranks.
//
// Threads: the thread that creates the process group.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "dc/auth.hpp"
#include "dc/tcp/hello.hpp"
#include "dc/tcp/transport.hpp"

namespace pytorch_exec::dc::tcp {
namespace {

const std::string kSetUp = "tcp: connection set-up with ";
// An accepted connection must complete its hello within this long; at most this many are
// pending at once (the oldest is dropped for a new one).
constexpr double kHelloSeconds = 3;
constexpr size_t kMaxPending = 64;

// Connects to rank j and proves membership; retries while rank j drops the connection before
// its reply (it may have been busy with strangers), until the deadline.
// `source`: this rank's own published address, so that the connection leaves through the
// interface this rank listens on (its rail NIC: bootstrap.hpp's transport_address()).
int connect_to(int rank, int j, int name, const std::string& addr, const std::string& source,
               const std::string& key, const Deadline& d) {
  std::string who = "rank " + std::to_string(name) + " at " + addr, host;
  int port = 0;
  split_address(addr, host, port, "tcp");
  for (;;) {
    int fd = connect_until(host, port, d, d.describe(), source);
    std::string challenge(kNonceBytes, '\0'), nonce, theirs(kProofBytes, '\0');
    try {
      io_exact(fd, challenge.data(), challenge.size(), false, d, who, kSetUp + who);
      std::string hello = make_hello(key, rank, j, challenge, nonce);
      io_exact(fd, hello.data(), hello.size(), true, d, who, kSetUp + who);
      io_exact(fd, theirs.data(), theirs.size(), false, d, who, kSetUp + who);
    } catch (const TimeoutError&) {
      ::close(fd);
      throw;
    } catch (const Error&) {
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (!proof_matches(reply_proof(key, rank, j, challenge, nonce), theirs)) {
      ::close(fd);
      throw Error("tcp: " + who +
                  " is not a member of this group (a stale address or another PYTORCH_DC_TOKEN?)");
    }
    return fd;
  }
}

struct Pending {
  int fd;
  std::string challenge, in;
  Clock::time_point since;
};

// Accepts the `need` higher ranks on lfd into fds.
class Acceptor {
 public:
  Acceptor(int lfd, int rank, std::vector<int>& fds, const std::string& key)
      : lfd_(lfd), rank_(rank), fds_(fds), key_(key) {}
  ~Acceptor() {
    for (auto& p : pending_) ::close(p.fd);
  }

  void run(int need, const Deadline& d) {
    std::vector<struct pollfd> pfds;
    while (accepted_ < need) {
      pfds.assign({{lfd_, POLLIN, 0}});
      for (auto& p : pending_) pfds.push_back({p.fd, POLLIN, 0});
      ::poll(pfds.data(), pfds.size(), d.millis_left(100));
      // Also while strangers keep the listener busy: the deadline holds.
      if (d.passed()) d.expire(std::to_string(need - accepted_) + " higher ranks to connect");
      for (size_t i = pending_.size(); i-- > 0;)
        if (pfds[i + 1].revents) read_hello(i);
      if (pfds[0].revents & POLLIN) accept_one();
      for (size_t i = pending_.size(); i-- > 0;)
        if (std::chrono::duration<double>(Clock::now() - pending_[i].since).count() > kHelloSeconds)
          drop(i);
    }
  }

 private:
  void drop(size_t i) {
    ::close(pending_[i].fd);
    pending_.erase(pending_.begin() + static_cast<long>(i));
  }

  void accept_one() {
    int fd = ::accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if ((errno == EMFILE || errno == ENFILE) && !pending_.empty()) drop(0);
      return;
    }
    if (pending_.size() >= kMaxPending) drop(0);
    Pending p{fd, random_bytes(kNonceBytes), {}, Clock::now()};
    // A fresh connection's send buffer takes the challenge at once; if not, it is dropped.
    if (::send(fd, p.challenge.data(), p.challenge.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(p.challenge.size())) {
      ::close(fd);
      return;
    }
    pending_.push_back(std::move(p));
  }

  void read_hello(size_t i) {
    Pending& p = pending_[i];
    char buf[kHelloBytes];
    ssize_t n = ::recv(p.fd, buf, kHelloBytes - p.in.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) return drop(i);
    p.in.append(buf, static_cast<size_t>(n));
    if (p.in.size() < kHelloBytes) return;
    std::string reply;
    int r = check_hello(key_, p.in, rank_, static_cast<int>(fds_.size()), p.challenge, reply);
    // A stranger, a stale process or a second connection from the same rank: ignore it.
    if (r < 0 || fds_[r] >= 0 ||
        ::send(p.fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
            static_cast<ssize_t>(reply.size()))
      return drop(i);
    fds_[r] = p.fd;
    pending_.erase(pending_.begin() + static_cast<long>(i));
    ++accepted_;
  }

  int lfd_, rank_;
  std::vector<int>& fds_;
  const std::string& key_;
  std::vector<Pending> pending_;
  int accepted_ = 0;
};

}  // namespace

std::unique_ptr<Transport> connect_mesh(int rank, int size, Listener listener,
                                        const std::vector<std::string>& addrs, uint64_t session,
                                        const std::string& congestion, const Deadline& d,
                                        std::vector<int> names) {
  std::vector<int> fds(static_cast<size_t>(size), -1);
  int lfd = listener.release();
  const std::string key = hello_key(session);
  try {
    std::string source;
    if (!addrs[static_cast<size_t>(rank)].empty()) {
      int port = 0;
      split_address(addrs[static_cast<size_t>(rank)], source, port, "tcp");
    }
    for (int j = 0; j < rank; ++j)
      fds[j] = connect_to(rank, j, names.empty() ? j : names[static_cast<size_t>(j)], addrs[j],
                          source, key, d);
    Acceptor(lfd, rank, fds, key).run(size - 1 - rank, d);
    for (int fd : fds) {
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // accepted ones
      set_congestion_control(fd, congestion, "PYTORCH_DC_TCP_CONGESTION");
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
  } catch (...) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    ::close(lfd);
    throw;
  }
  ::close(lfd);
  return make_transport(rank, std::move(fds), std::move(names));
}

}  // namespace pytorch_exec::dc::tcp
