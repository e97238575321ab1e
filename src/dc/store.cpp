#include "dc/store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

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

// The server's own writes to a client (an answer to a get): bounded, a client that does not read
// for this long is dropped.
constexpr double kAnswerSeconds = 10;

const char* const kLost = "store: the store server (rank 0)";

}  // namespace

std::shared_ptr<Store> memory_store() { return std::make_shared<MemoryStore>(); }

// One thread, poll() over the listener and its clients.  Requests: 'S' key value, 'G' key;
// answers to G come when the key exists.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(int port) {
    Listener l(port);
    port_ = l.port();
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

 private:
  struct Client {
    int fd;
    std::string in;
    std::vector<std::string> waiting;  // keys asked for, not yet set
    bool dead = false;
  };

  void answer(Client& c, const std::string& key) {
    std::string out;
    put_u32(out, static_cast<uint32_t>(kv_[key].size()));
    out += kv_[key];
    try {
      io_exact(c.fd, out.data(), out.size(), true,
               Deadline::after(kAnswerSeconds, "store: answering a client"), "a slow client",
               kLost);
    } catch (const Error&) {
      c.dead = true;
    }
  }

  // Parses complete requests from c.in.
  void serve(Client& c) {
    for (;;) {
      if (c.in.size() < 5) return;
      uint32_t klen;
      std::memcpy(&klen, c.in.data() + 1, 4);
      char op = c.in[0];
      size_t need = 5 + klen;
      uint32_t vlen = 0;
      if (op == 'S') {
        if (c.in.size() < need + 4) return;
        std::memcpy(&vlen, c.in.data() + need, 4);
        need += 4 + vlen;
      }
      if (c.in.size() < need) return;
      std::string key = c.in.substr(5, klen);
      if (op == 'S') {
        kv_[key] = c.in.substr(need - vlen, vlen);
        for (auto& other : clients_) {
          auto it = std::find(other.waiting.begin(), other.waiting.end(), key);
          if (it == other.waiting.end()) continue;
          other.waiting.erase(it);
          answer(other, key);
        }
      } else if (kv_.count(key)) {
        answer(c, key);
      } else {
        c.waiting.push_back(key);
      }
      c.in.erase(0, need);
    }
  }

  void run() {
    while (!stop_) {
      std::vector<struct pollfd> fds{{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      for (auto& c : clients_) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents & POLLIN) {
        int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) clients_.push_back({c, {}, {}});
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Client& c = clients_[i - 2];
        char buf[65536];
        ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n <= 0) {
          c.dead = true;
          continue;
        }
        c.in.append(buf, static_cast<size_t>(n));
        serve(c);
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
  }

  int fd_ = -1, port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<Client> clients_;
  std::map<std::string, std::string> kv_;
};

namespace {

class TcpStore : public Store {
 public:
  // `timeout` also bounds every write (a set).
  TcpStore(int fd, double timeout, std::shared_ptr<TcpStoreServer> server)
      : fd_(fd), timeout_(timeout), server_(std::move(server)) {}
  ~TcpStore() override { ::close(fd_); }
  void set(const std::string& k, const std::string& v) override {
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

std::shared_ptr<TcpStoreServer> serve_tcp_store(int port, int* bound_port) {
  auto s = std::make_shared<TcpStoreServer>(port);
  if (bound_port) *bound_port = s->port();
  return s;
}

std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, double timeout,
                                         std::shared_ptr<TcpStoreServer> keep_alive) {
  // Rank 0 may not listen yet: connect_until retries until the deadline.
  int fd = connect_until(host, port, Deadline::after(timeout, "store"),
                         "store: cannot reach rank 0's store (MASTER_ADDR '" + host + "')");
  return std::make_shared<TcpStore>(fd, timeout, std::move(keep_alive));
}

}  // namespace pytorch_exec::dc
