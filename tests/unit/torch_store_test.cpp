// The torch store pytorch_exec hosts on MASTER_PORT (torch_store.hpp), through real sockets
// speaking torch's TCPStore protocol: every request, waits woken by other clients, and clients
// that break the rules are disconnected without disturbing the others.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <future>
#include <set>
#include <thread>

#include "common/error.hpp"
#include "common/net.hpp"
#include "common/torch_store.hpp"

using namespace pe;
using namespace pe::torch_store;

namespace {

// The store on 127.0.0.1, its loop on a thread of its own.
class Served {
 public:
  Served() : store_(TorchStore::host(loop_, "127.0.0.1")) {
    thread_ = std::thread([this] { loop_.run(); });
  }
  ~Served() {
    loop_.post([this] { loop_.stop(); });
    thread_.join();
    store_.reset();
  }
  int port() const { return store_->port(); }
  // Runs fn on the loop's thread and waits for it.
  template <class Fn>
  auto on_loop(Fn fn) {
    std::promise<decltype(fn())> p;
    loop_.post([&] { p.set_value(fn()); });
    return p.get_future().get();
  }
  TorchStore& store() { return *store_; }

 private:
  EventLoop loop_;
  std::unique_ptr<TorchStore> store_;
  std::thread thread_;
};

// A blocking client like torch's (its reads time out after 5 s).
class Client {
 public:
  explicit Client(int port, bool validate = true) : fd_(connect_tcp("127.0.0.1", port, 5.0)) {
    int fl = ::fcntl(fd_.get(), F_GETFL);
    ::fcntl(fd_.get(), F_SETFL, fl & ~O_NONBLOCK);
    struct timeval tv {5, 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (validate) {
      op(kValidate).u32(kMagic).flush();
    }
  }
  Client& op(uint8_t q) {
    buf_.push_back(static_cast<char>(q));
    return *this;
  }
  Client& u32(uint32_t v) { return raw(&v, 4); }
  Client& u64(uint64_t v) { return raw(&v, 8); }
  Client& str(const std::string& s) {
    u64(s.size());
    buf_ += s;
    return *this;
  }
  Client& raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  void flush() {
    size_t off = 0;
    while (off < buf_.size()) {
      ssize_t n = ::send(fd_.get(), buf_.data() + off, buf_.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    buf_.clear();
  }
  // Reads exactly n bytes; false on EOF, error or timeout.
  bool read(void* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      ssize_t k = ::recv(fd_.get(), static_cast<char*>(p) + got, n - got, 0);
      if (k <= 0) return false;
      got += static_cast<size_t>(k);
    }
    return true;
  }
  uint8_t r8() {
    uint8_t v = 0xff;
    EXPECT_TRUE(read(&v, 1));
    return v;
  }
  uint32_t r32() {
    uint32_t v = 0;
    EXPECT_TRUE(read(&v, 4));
    return v;
  }
  int64_t r64() {
    int64_t v = -1;
    EXPECT_TRUE(read(&v, 8));
    return v;
  }
  std::string rstr() {
    uint64_t n = r64();
    std::string s(n, '\0');
    EXPECT_TRUE(read(s.data(), n));
    return s;
  }
  // Whether the server closed the connection (within `seconds`).
  bool closed(double seconds = 5.0) {
    struct timeval tv {static_cast<time_t>(seconds), 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    return ::recv(fd_.get(), &c, 1, 0) == 0;
  }
  // Nothing arrives within `ms`.
  bool quiet(int ms) {
    struct pollfd p {
      fd_.get(), POLLIN, 0
    };
    return ::poll(&p, 1, ms) == 0;
  }

  void set(const std::string& k, const std::string& v) { op(kSet).str(k).str(v).flush(); }
  std::string get(const std::string& k) {
    op(kGet).str(k).flush();
    return rstr();
  }

 private:
  UniqueFd fd_;
  std::string buf_;
};

}  // namespace

TEST(TorchStoreTest, ThePortIsOutsideTheEphemeralRangeAndHeld) {
  EventLoop loop;
  auto s = TorchStore::host(loop, "127.0.0.1");
  auto [lo, hi] = ephemeral_port_range();
  EXPECT_TRUE(s->port() < lo - 1 || s->port() > hi) << s->port();
  EXPECT_THROW(listen_tcp("127.0.0.1", s->port(), nullptr), SystemError);
  EXPECT_THROW(listen_tcp("0.0.0.0", s->port(), nullptr), SystemError);
  listen_tcp("127.0.0.1", s->port() + 1, nullptr);  // DataChannel's store can have p+1
}

TEST(TorchStoreTest, EveryRequest) {
  Served sv;
  Client c(sv.port());
  c.op(kPing).u32(4711).flush();
  EXPECT_EQ(c.r32(), 4711u);
  c.set("/a", "1");
  EXPECT_EQ(c.get("/a"), "1");
  EXPECT_EQ(c.get("/missing"), "");
  c.op(kAdd).str("/a").u64(41).flush();
  EXPECT_EQ(c.r64(), 42);
  c.op(kAdd).str("/n").u64(static_cast<uint64_t>(-3)).flush();
  EXPECT_EQ(c.r64(), -3);
  c.op(kCheck).u64(2).str("/a").str("/n").flush();
  EXPECT_EQ(c.r8(), kReady);
  c.op(kCheck).u64(2).str("/a").str("/zz").flush();
  EXPECT_EQ(c.r8(), kNotReady);
  c.op(kGetNumKeys).flush();
  EXPECT_EQ(c.r64(), 2);
  c.op(kAppend).str("/s").str("ab").flush();
  c.op(kAppend).str("/s").str("cd").flush();
  EXPECT_EQ(c.get("/s"), "abcd");
  // compare_set: the new value when the expected one matched (or the key was missing and
  // nothing was expected), else the current one (the expected one when the key is missing).
  c.op(kCompareSet).str("/s").str("abcd").str("x").flush();
  EXPECT_EQ(c.rstr(), "x");
  c.op(kCompareSet).str("/s").str("nope").str("y").flush();
  EXPECT_EQ(c.rstr(), "x");
  c.op(kCompareSet).str("/new").str("").str("v").flush();
  EXPECT_EQ(c.rstr(), "v");
  c.op(kCompareSet).str("/none").str("e").str("v").flush();
  EXPECT_EQ(c.rstr(), "e");
  c.op(kMultiSet).u64(2).str("/m1").str("one").str("/m2").str("two").flush();
  c.op(kMultiGet).u64(2).str("/m2").str("/m1").flush();
  EXPECT_EQ(c.rstr(), "two");
  EXPECT_EQ(c.rstr(), "one");
  c.op(kDeleteKey).str("/m1").flush();
  EXPECT_EQ(c.r64(), 1);
  c.op(kDeleteKey).str("/m1").flush();
  EXPECT_EQ(c.r64(), 0);
  c.op(kListKeys).flush();
  int64_t n = c.r64();
  std::set<std::string> keys;
  for (int64_t i = 0; i < n; ++i) keys.insert(c.rstr());
  EXPECT_EQ(keys, (std::set<std::string>{"/a", "/n", "/s", "/new", "/m2"}));
  c.op(kQueuePush).str("q").str("first").flush();
  c.op(kQueuePush).str("q").str("second").flush();
  c.op(kQueueLen).str("q").flush();
  EXPECT_EQ(c.r64(), 2);
  c.op(kQueuePop).str("q").flush();
  EXPECT_EQ(c.r64(), 2);
  EXPECT_EQ(c.rstr(), "first");
  c.op(kQueuePop).str("q").flush();
  EXPECT_EQ(c.r64(), 1);
  EXPECT_EQ(c.rstr(), "second");
  c.op(kQueuePop).str("q").flush();
  EXPECT_EQ(c.r64(), 0);
  c.op(kWait).u64(1).str("/a").flush();  // present: at once
  EXPECT_EQ(c.r8(), kStopWaiting);
  // Several requests in one write, answered in order.
  c.op(kGet).str("/a").op(kPing).u32(7).op(kGetNumKeys).flush();
  EXPECT_EQ(c.rstr(), "42");
  EXPECT_EQ(c.r32(), 7u);
  EXPECT_EQ(c.r64(), 5);
  EXPECT_EQ(sv.on_loop([&] { return sv.store().keys(); }), 5u);
}

TEST(TorchStoreTest, WaitsAreWokenByOthersAndCanBeCancelled) {
  Served sv;
  Client a(sv.port()), b(sv.port()), q(sv.port());
  a.op(kWait).u64(2).str("/x").str("/y").flush();
  EXPECT_TRUE(a.quiet(100));
  b.set("/x", "1");
  EXPECT_TRUE(a.quiet(100));  // /y still missing
  b.op(kAdd).str("/y").u64(1).flush();
  EXPECT_EQ(b.r64(), 1);
  EXPECT_EQ(a.r8(), kStopWaiting);
  // cancel_wait, as torch's client does after its timeout
  a.op(kWait).u64(1).str("/never").flush();
  EXPECT_TRUE(a.quiet(100));
  a.op(kCancelWait).flush();
  EXPECT_EQ(a.r8(), kWaitCanceled);
  b.set("/never", "now");
  EXPECT_TRUE(a.quiet(100));  // no longer waiting
  // A blocking queue pop: wait for the queue, woken by one push.
  q.op(kWait).u64(1).str("jobs").flush();
  EXPECT_TRUE(q.quiet(100));
  b.op(kQueuePush).str("jobs").str("j1").flush();
  EXPECT_EQ(q.r8(), kStopWaiting);
  q.op(kQueuePop).str("jobs").flush();
  EXPECT_EQ(q.r64(), 1);
  EXPECT_EQ(q.rstr(), "j1");
  // A barrier of three.
  Client c(sv.port());
  a.op(kBarrier).str("/bar").u64(3).flush();
  b.op(kBarrier).str("/bar").u64(3).flush();
  EXPECT_TRUE(a.quiet(100));
  EXPECT_TRUE(b.quiet(1));
  c.op(kBarrier).str("/bar").u64(3).flush();
  EXPECT_EQ(c.r8(), kStopWaiting);
  EXPECT_EQ(a.r8(), kStopWaiting);
  EXPECT_EQ(b.r8(), kStopWaiting);
  // A waiting client that goes away leaves nothing behind.
  {
    Client gone(sv.port());
    gone.op(kWait).u64(1).str("/later").flush();
    EXPECT_TRUE(gone.quiet(50));
  }
  for (int i = 0; i < 100 && sv.on_loop([&] { return sv.store().clients(); }) != 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  b.set("/later", "x");
  EXPECT_EQ(b.get("/later"), "x");
}

TEST(TorchStoreTest, RuleBreakersAreDisconnectedOthersGoOn) {
  Served sv;
  Client good(sv.port());
  good.set("/k", "v");
  {
    Client c(sv.port(), false);  // no VALIDATE first
    c.op(kSet).str("/k").str("evil").flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port(), false);  // a wrong magic number
    c.op(kValidate).u32(0x12345678).flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port(), false);  // HTTP
    c.raw("GET / HTTP/1.0\r\n\r\n", 18).flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port());  // a key longer than kMaxKey: closed before it arrives
    c.op(kGet).u64(kMaxKey + 1).flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port());  // a value claiming 2^63 bytes
    c.op(kSet).str("/k").u64(uint64_t{1} << 63).flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port());  // too many keys
    c.op(kWait).u64(kMaxKeys + 1).flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port());  // an unknown request
    c.op(200).flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port());  // ADD to a key that holds no number
    c.set("/text", "abc");
    c.op(kAdd).str("/text").u64(1).flush();
    EXPECT_TRUE(c.closed());
  }
  {
    Client c(sv.port());  // a half request, then silence: kept, harmless
    c.op(kSet).u64(2).flush();
    EXPECT_TRUE(c.quiet(50));
  }
  EXPECT_EQ(good.get("/k"), "v");
  EXPECT_EQ(good.get("/text"), "abc");
}

TEST(TorchStoreTest, AnyPrefixOfARequestIsIncompleteNeverMalformed) {
  std::string r;
  auto u64 = [&r](uint64_t v) { r.append(reinterpret_cast<const char*>(&v), 8); };
  r.push_back(static_cast<char>(kMultiSet));
  u64(2);
  for (const char* s : {"/k1", "value one", "/k2", ""}) {
    u64(std::strlen(s));
    r += s;
  }
  Request req;
  for (size_t n = 0; n < r.size(); ++n) EXPECT_EQ(parse_request(r.data(), n, req), 0) << n;
  EXPECT_EQ(parse_request(r.data(), r.size(), req), static_cast<long>(r.size()));
  EXPECT_EQ(req.keys, (std::vector<std::string>{"/k1", "/k2"}));
  EXPECT_EQ(req.values, (std::vector<std::string>{"value one", ""}));
  r += "trailing";
  EXPECT_EQ(parse_request(r.data(), r.size(), req), static_cast<long>(r.size() - 8));
}

TEST(TorchStoreTest, ManyClientsAtOnce) {
  Served sv;
  std::vector<std::unique_ptr<Client>> cs;
  for (int i = 0; i < 200; ++i) cs.push_back(std::make_unique<Client>(sv.port()));
  for (size_t i = 0; i < cs.size(); ++i) cs[i]->op(kWait).u64(1).str("/go").flush();
  Client starter(sv.port());
  starter.set("/go", "1");
  for (auto& c : cs) EXPECT_EQ(c->r8(), kStopWaiting);
  for (size_t i = 0; i < cs.size(); ++i) cs[i]->op(kAdd).str("/count").u64(1).flush();
  for (auto& c : cs) c->r64();
  EXPECT_EQ(starter.get("/count"), "200");
}
