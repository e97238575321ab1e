// The TCP store's server (rank 0, one thread: poll() over the listener and its clients) and
// client (every rank, the thread that bootstraps), and the in-memory store of thread groups.
//
// Protocol, after the token exchange (auth.hpp):
//   server -> client  nonce_s
//   client -> server  nonce_c, proof(token, "pdc-store-client", nonce_s, nonce_c)
//   server -> client  proof(token, "pdc-store-server", nonce_s, nonce_c)
// then requests 'S' u32 klen key u32 vlen value and 'G' u32 klen key, answered (G, once the key
// exists) by u32 vlen value.  Nothing before the proof is read beyond its 64 bytes; every length
// is checked against the limits in store.hpp before anything is buffered, and a client that
// breaks a rule is disconnected.  The server never blocks on one client: answers are queued and
// written when the client can take them.
#include "dc/store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "dc/auth.hpp"
#include "dc/socket.hpp"
#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {
namespace {

class MemoryStore : public Store {
 public:
  void set(const std::string& k, const std::string& v) override {
    std::lock_guard<std::mutex> l(m_);
    kv_[k] = v;
    cv_.notify_all();
  }
  std::string get(const std::string& k, double timeout) override {
    std::unique_lock<std::mutex> l(m_);
    if (!cv_.wait_for(l, std::chrono::duration<double>(timeout), [&] { return kv_.count(k) > 0; }))
      throw TimeoutError("store: no value for '" + k + "' within " + std::to_string(timeout) +
                         " s");
    return kv_[k];
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

const std::string kClientLabel = "pdc-store-client", kServerLabel = "pdc-store-server";
constexpr size_t kHandshakeBytes = kNonceBytes + kProofBytes;
// A connection that has not proven the token within this long is dropped; at most this many
// wait at once (the oldest goes first).
constexpr double kProveSeconds = 5;
constexpr size_t kMaxUnproven = 64;
// Keys one client may wait for at once (a rank waits for one), and how long an answer may stay
// unread before the client is dropped.
constexpr size_t kMaxWaiting = 8;
constexpr double kAnswerSeconds = 10;
// After accept() failed for lack of descriptors: stop accepting for this long.
constexpr int kAcceptPauseMillis = 100;

const char* const kLost = "store: the store server (rank 0)";

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

std::shared_ptr<Store> memory_store() { return std::make_shared<MemoryStore>(); }

long parse_store_request(const char* p, size_t n, StoreRequest& r) {
  if (n < 5) return 0;
  r.op = p[0];
  if (r.op != 'S' && r.op != 'G') return -1;
  uint64_t klen = get_u32(p + 1);
  if (klen > kStoreMaxKey) return -1;
  uint64_t need = 5 + klen, vlen = 0;
  if (r.op == 'S') {
    if (n < need + 4) return 0;
    vlen = get_u32(p + need);
    if (vlen > kStoreMaxValue) return -1;
    need += 4 + vlen;
  }
  if (n < need) return 0;
  r.key.assign(p + 5, klen);
  if (r.op == 'S') r.value.assign(p + need - vlen, vlen);
  return static_cast<long>(need);
}

class TcpStoreServer {
 public:
  TcpStoreServer(int port, const std::string& addr) : token_(job_token()) {
    Listener l(port, addr);
    port_ = l.port();
    host_ = l.host();
    fd_ = l.release();
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      ::close(fd_);
      throw Error("store: pipe failed");
    }
    thread_ = std::thread([this] { run(); });
  }
  ~TcpStoreServer() {
    stop_ = true;
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
    for (auto& c2 : clients_) ::close(c2.fd);
    ::close(fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  struct Client {
    int fd = -1;
    std::string nonce;  // the challenge sent on accept
    bool proven = false;
    Clock::time_point since = Clock::now();  // accepted, or the oldest unread answer queued
    std::string in, out;
    std::vector<std::string> waiting;  // keys asked for, not yet set
    bool dead = false;
  };

  void queue(Client& c, const std::string& bytes) {
    if (c.out.empty()) c.since = Clock::now();
    c.out += bytes;
  }
  void answer(Client& c, const std::string& key) {
    std::string out;
    put_u32(out, static_cast<uint32_t>(kv_[key].size()));
    queue(c, out + kv_[key]);
  }

  void prove(Client& c) {
    std::string nonce_c = c.in.substr(0, kNonceBytes), got = c.in.substr(kNonceBytes, kProofBytes);
    c.in.erase(0, kHandshakeBytes);
    if (!proof_matches(proof(token_, kClientLabel, c.nonce, nonce_c), got)) {
      c.dead = true;
      return;
    }
    c.proven = true;
    queue(c, proof(token_, kServerLabel, c.nonce, nonce_c));
  }

  void set(Client& c, StoreRequest& r) {
    auto it = kv_.find(r.key);
    size_t old = it == kv_.end() ? 0 : it->first.size() + it->second.size();
    if (bytes_ - old + r.key.size() + r.value.size() > kStoreMaxBytes) {
      c.dead = true;  // the store is full
      return;
    }
    bytes_ = bytes_ - old + r.key.size() + r.value.size();
    kv_[r.key] = std::move(r.value);
    for (auto& other : clients_) {
      auto w = std::find(other.waiting.begin(), other.waiting.end(), r.key);
      if (w == other.waiting.end()) continue;
      other.waiting.erase(w);
      answer(other, r.key);
    }
  }

  // Parses complete requests from c.in.
  void serve(Client& c) {
    if (!c.proven) {
      if (c.in.size() >= kHandshakeBytes) prove(c);
      if (!c.proven) return;
    }
    size_t pos = 0;
    StoreRequest r;
    // One answer at a time: a client that does not read its answers gets no more.
    while (!c.dead && c.out.empty()) {
      long n = parse_store_request(c.in.data() + pos, c.in.size() - pos, r);
      if (n < 0) c.dead = true;
      if (n <= 0) break;
      pos += static_cast<size_t>(n);
      if (r.op == 'S') {
        set(c, r);
      } else if (kv_.count(r.key)) {
        answer(c, r.key);
      } else if (c.waiting.size() < kMaxWaiting) {
        c.waiting.push_back(r.key);
      } else {
        c.dead = true;
      }
    }
    c.in.erase(0, pos);
  }

  void accept_one() {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors: make room by dropping the oldest unproven connection, else pause.
      if ((errno == EMFILE || errno == ENFILE) && !drop_oldest_unproven())
        paused_until_ = Clock::now() + std::chrono::milliseconds(kAcceptPauseMillis);
      return;
    }
    if (std::count_if(clients_.begin(), clients_.end(), [](auto& c) { return !c.proven; }) >=
        static_cast<long>(kMaxUnproven))
      drop_oldest_unproven();
    Client c;
    c.fd = fd;
    c.nonce = random_bytes(kNonceBytes);
    queue(c, c.nonce);
    clients_.push_back(std::move(c));
  }
  bool drop_oldest_unproven() {
    for (auto& c : clients_)
      if (!c.proven && !c.dead) return c.dead = true;
    return false;
  }

  void read_from(Client& c) {
    char buf[65536];
    // Before the proof, nothing beyond its bytes is read.
    size_t room = c.proven ? sizeof buf : kHandshakeBytes - c.in.size();
    ssize_t n = ::recv(c.fd, buf, room, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      c.dead = true;
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    serve(c);
  }
  void write_to(Client& c) {
    ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      c.dead = true;
      return;
    }
    c.out.erase(0, static_cast<size_t>(n));
    c.since = Clock::now();
  }

  void expire() {
    for (auto& c : clients_) {
      if (!c.proven && since(c.since) > kProveSeconds) c.dead = true;
      if (!c.out.empty() && since(c.since) > kAnswerSeconds) c.dead = true;
    }
    for (auto it = clients_.begin(); it != clients_.end();) {
      if (it->dead) {
        ::close(it->fd);
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void run() {
    std::vector<struct pollfd> fds;
    while (!stop_) {
      bool paused = Clock::now() < paused_until_;
      fds.assign({{paused ? -1 : fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}});
      // A client with unread answers sends nothing more until it has read them.
      for (auto& c : clients_)
        fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      if (::poll(fds.data(), fds.size(), paused ? kAcceptPauseMillis : 1000) < 0) continue;
      if (fds[0].revents & POLLIN) accept_one();
      for (size_t i = 2; i < fds.size(); ++i) {
        Client& c = clients_[i - 2];
        if (fds[i].revents & POLLOUT) write_to(c);
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(c);
        if (!c.dead && c.out.empty() && !c.in.empty()) serve(c);
      }
      expire();
    }
  }

  std::string token_;
  int fd_ = -1, port_ = 0;
  std::string host_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Clock::time_point paused_until_{};
  std::deque<Client> clients_;
  std::map<std::string, std::string> kv_;
  size_t bytes_ = 0;  // of all keys and values
};

namespace {

class TcpStore : public Store {
 public:
  // `timeout` also bounds every write (a set).
  TcpStore(int fd, double timeout, std::shared_ptr<TcpStoreServer> server)
      : fd_(fd), timeout_(timeout), server_(std::move(server)) {}
  ~TcpStore() override { ::close(fd_); }

  // The token exchange; Error when either side does not prove it.
  void prove(const std::string& where) {
    auto d = Deadline::after(timeout_, "store: proving the job token to " + where);
    std::string nonce_s(kNonceBytes, '\0'), nonce_c = random_bytes(kNonceBytes);
    std::string token = job_token(), theirs(kProofBytes, '\0');
    const std::string refused =
        "store: rank 0's store at " + where + " refused this rank (a different PYTORCH_DC_TOKEN?)";
    io_exact(fd_, nonce_s.data(), kNonceBytes, false, d, "rank 0's store", refused);
    std::string mine = nonce_c + proof(token, kClientLabel, nonce_s, nonce_c);
    io_exact(fd_, mine.data(), mine.size(), true, d, "rank 0's store", refused);
    io_exact(fd_, theirs.data(), kProofBytes, false, d, "rank 0's store", refused);
    if (!proof_matches(proof(token, kServerLabel, nonce_s, nonce_c), theirs))
      throw Error("store: the store at " + where +
                  " does not know this job's token (a different PYTORCH_DC_TOKEN?)");
  }

  void set(const std::string& k, const std::string& v) override {
    if (k.size() > kStoreMaxKey || v.size() > kStoreMaxValue)
      throw Error("store: '" + k + "' is larger than the store takes");
    std::string out = "S";
    put_u32(out, static_cast<uint32_t>(k.size()));
    out += k;
    put_u32(out, static_cast<uint32_t>(v.size()));
    out += v;
    std::lock_guard<std::mutex> l(m_);
    io_exact(fd_, out.data(), out.size(), true,
             Deadline::after(timeout_, "store: setting '" + k + "'"), "rank 0's store", kLost);
  }
  std::string get(const std::string& k, double timeout) override {
    std::string out = "G";
    put_u32(out, static_cast<uint32_t>(k.size()));
    out += k;
    std::lock_guard<std::mutex> l(m_);
    auto d = Deadline::after(timeout, "store: waiting for '" + k + "'");
    io_exact(fd_, out.data(), out.size(), true, d, "rank 0's store", kLost);
    uint32_t len;
    io_exact(fd_, &len, 4, false, d, "rank 0's store", kLost);
    if (len > kStoreMaxValue) throw Error("store: the answer for '" + k + "' is too large");
    std::string v(len, '\0');
    io_exact(fd_, v.data(), len, false, d, "rank 0's store", kLost);
    return v;
  }

 private:
  int fd_;
  double timeout_;
  std::mutex m_;
  std::shared_ptr<TcpStoreServer> server_;
};

}  // namespace

std::shared_ptr<TcpStoreServer> serve_tcp_store(int port, const std::string& addr,
                                                int* bound_port) {
  auto s = std::make_shared<TcpStoreServer>(port, addr);
  if (bound_port) *bound_port = s->port();
  return s;
}

std::string store_host(const TcpStoreServer& s) { return s.host(); }

std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, double timeout,
                                         std::shared_ptr<TcpStoreServer> keep_alive) {
  // Rank 0 may not listen yet: connect_until retries until the deadline.
  int fd = connect_until(host, port, Deadline::after(timeout, "store"),
                         "store: cannot reach rank 0's store (MASTER_ADDR '" + host + "')");
  auto s = std::make_shared<TcpStore>(fd, timeout, std::move(keep_alive));
  s->prove(host + ":" + std::to_string(port));
  return s;
}

}  // namespace pytorch_exec::dc
