#include "common/torch_store.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"

namespace pe {

namespace torch_store {
namespace {

// Reads the fields of one request; `copy` false only measures (an incomplete request is
// measured again as more arrives, and its strings are copied once, when it is whole).
struct Reader {
  const char* p;
  size_t n;
  bool copy;
  size_t pos = 0;
  bool bad = false, incomplete = false;

  bool ok() const { return !bad && !incomplete; }
  bool take(void* out, size_t k) {
    if (!ok()) return false;
    if (n - pos < k) {
      incomplete = true;
      return false;
    }
    std::memcpy(out, p + pos, k);
    pos += k;
    return true;
  }
  template <class T>
  T value() {
    T v{};
    take(&v, sizeof v);
    return v;
  }
  uint64_t count() {
    uint64_t c = value<uint64_t>();
    if (ok() && c > kMaxKeys) bad = true;
    return c;
  }
  void string(uint64_t limit, std::vector<std::string>& into) {
    uint64_t len = value<uint64_t>();
    if (!ok()) return;
    if (len > limit || len > kMaxRequest - pos) {
      bad = true;
      return;
    }
    if (n - pos < len) {
      incomplete = true;
      return;
    }
    if (copy) into.emplace_back(p + pos, static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
  }
};

void read_fields(Reader& rd, Request& r) {
  auto key = [&] { rd.string(kMaxKey, r.keys); };
  auto val = [&] { rd.string(kMaxValue, r.values); };
  switch (r.op) {
    case kValidate:
    case kPing:
      r.num = rd.value<uint32_t>();
      break;
    case kSet:
    case kAppend:
    case kQueuePush:
      key(), val();
      break;
    case kCompareSet:
      key(), val(), val();
      break;
    case kGet:
    case kDeleteKey:
    case kQueuePop:
    case kQueueLen:
      key();
      break;
    case kAdd:
    case kBarrier:
      key(), r.num = rd.value<int64_t>();
      break;
    case kCheck:
    case kWait:
    case kMultiGet:
      for (uint64_t i = 0, n = rd.count(); rd.ok() && i < n; ++i) key();
      break;
    case kMultiSet:
      for (uint64_t i = 0, n = rd.count(); rd.ok() && i < n; ++i) key(), val();
      break;
    case kGetNumKeys:
    case kCancelWait:
    case kListKeys:
      break;
    default:
      rd.bad = true;
  }
}

}  // namespace

long parse_request(const char* p, size_t n, Request& r) {
  if (n == 0) return 0;
  r = Request{};
  r.op = static_cast<uint8_t>(p[0]);
  Reader measure{p, n, false, 1};
  read_fields(measure, r);
  if (measure.bad) return -1;
  if (measure.incomplete) return 0;
  r = Request{};
  r.op = static_cast<uint8_t>(p[0]);
  Reader rd{p, n, true, 1};
  read_fields(rd, r);
  return static_cast<long>(rd.pos);
}

}  // namespace torch_store

using namespace torch_store;

namespace {

constexpr double kSweepInterval = 5.0;

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_string(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}

// The decimal value ADD and BARRIER count in; false when it is not one.
bool as_number(const std::string& s, int64_t& v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

struct TorchStore::Client {
  uint64_t id = 0;
  UniqueFd fd;  // before the events: they are unregistered before it is closed
  std::string peer;
  Event read_ev, write_ev;
  std::string in;
  std::string out;
  size_t out_off = 0;
  bool validated = false, dead = false;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  size_t awaiting = 0;                 // keys of its WAIT (or BARRIER) still missing
  std::vector<std::string> wait_keys;  // those it waits for
  size_t wait_bytes = 0;               // their size, as counted in waiting_bytes_
};

TorchStore::TorchStore(EventLoop& loop, UniqueFd listener)
    : loop_(loop), listener_(std::move(listener)) {
  struct sockaddr_storage sa {};
  socklen_t len = sizeof sa;
  PE_CHECK_ERRNO(::getsockname(listener_.get(), reinterpret_cast<struct sockaddr*>(&sa), &len) == 0,
                 "getsockname");
  port_ = ntohs(reinterpret_cast<struct sockaddr_in*>(&sa)->sin_port);
  accept_ = std::make_unique<AcceptLoop>(
      loop_, listener_.get(),
      [this](UniqueFd fd, std::string peer) { on_accept(std::move(fd), std::move(peer)); },
      [this](const std::string& why) {
        logger("rdzv")->warn("torch store on port {}: cannot accept connections ({}); pausing",
                             port_, why);
      });
  sweep_timer_ = loop_.timer([this] { sweep(); });
  sweep_timer_.arm(kSweepInterval);
}

TorchStore::~TorchStore() { *alive_ = false; }

std::unique_ptr<TorchStore> TorchStore::host(EventLoop& loop, const std::string& addr, int port) {
  UniqueFd fd = port > 0 ? listen_tcp(addr, port, nullptr) : listen_master_port(addr, &port);
  return std::make_unique<TorchStore>(loop, std::move(fd));
}

void TorchStore::on_accept(UniqueFd fd, std::string peer) {
  if (clients_.size() >= kMaxClients) return;  // closed at once
  tune_control_socket(fd.get(), 60);
  auto c = std::make_unique<Client>();
  c->id = ++next_id_;
  c->fd = std::move(fd);
  c->peer = std::move(peer);
  Client* cp = c.get();
  c->read_ev = loop_.watch_readable(cp->fd.get(), [this, cp] { on_readable(*cp); });
  clients_.emplace(c->id, std::move(c));
}

void TorchStore::on_readable(Client& c) {
  if (c.dead) return;
  char buf[65536];
  ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) return drop(c, nullptr);
  if (c.in.size() + static_cast<size_t>(n) > kMaxRequest + sizeof buf ||
      buffered_ + static_cast<size_t>(n) > kMaxBuffered)
    return drop(c, "sends more than it may have unread");
  c.in.append(buf, static_cast<size_t>(n));
  buffered_ += static_cast<size_t>(n);
  size_t off = 0;
  while (!c.dead) {
    Request r;
    long k = parse_request(c.in.data() + off, c.in.size() - off, r);
    if (k < 0) return drop(c, "sent a malformed request or one over a limit");
    if (k == 0) break;
    off += static_cast<size_t>(k);
    if (!c.validated) {
      if (r.op != kValidate || r.num != kMagic) return drop(c, "did not validate");
      c.validated = true;
      continue;
    }
    handle(c, r);
  }
  if (c.dead) return;
  c.in.erase(0, off);
  buffered_ -= off;
}

void TorchStore::handle(Client& c, Request& r) {
  std::string a;
  switch (r.op) {
    case kValidate:  // again: nothing to do
      return;
    case kPing:
      put<uint32_t>(a, static_cast<uint32_t>(r.num));
      break;
    case kSet:
      if (!store(r.keys[0], std::move(r.values[0]))) return drop(c, "fills the store");
      return;
    case kCompareSet: {
      auto it = kv_.find(r.keys[0]);
      if (it == kv_.end() && !r.values[0].empty()) {
        put_string(a, r.values[0]);  // as torch: the expected value when the key is missing
      } else {
        if (it == kv_.end() || it->second == r.values[0])
          if (!store(r.keys[0], std::move(r.values[1]))) return drop(c, "fills the store");
        put_string(a, kv_.at(r.keys[0]));
      }
      break;
    }
    case kGet: {
      auto it = kv_.find(r.keys[0]);
      put_string(a, it == kv_.end() ? std::string() : it->second);
      break;
    }
    case kAdd:
    case kBarrier: {
      int64_t v = r.op == kAdd ? r.num : 1;
      auto it = kv_.find(r.keys[0]);
      int64_t old = 0;
      if (it != kv_.end() && !as_number(it->second, old))
        return drop(c, "counts in a key that holds no number");
      if (__builtin_add_overflow(old, v, &v)) return drop(c, "overflows a counter");
      // A barrier's arrivals do not wake those waiting on it; its last does.
      if (!store(r.keys[0], std::to_string(v), r.op == kAdd)) return drop(c, "fills the store");
      if (r.op == kAdd) {
        put<int64_t>(a, v);
        break;
      }
      if (v < r.num) {
        clear_wait(c);
        if (!wait_for(c, {r.keys[0]})) return drop(c, "waits for too much");
        return;
      }
      wake(r.keys[0], false);
      put<uint8_t>(a, kStopWaiting);
      break;
    }
    case kCheck: {
      bool all = true;
      for (const auto& k : r.keys) all = all && present(k);
      put<uint8_t>(a, all ? kReady : kNotReady);
      break;
    }
    case kWait: {
      clear_wait(c);  // a client waits for one thing at a time
      std::vector<std::string> missing;
      for (auto& k : r.keys)
        if (!present(k)) missing.push_back(std::move(k));
      if (!missing.empty()) {
        if (!wait_for(c, std::move(missing))) return drop(c, "waits for too much");
        return;
      }
      put<uint8_t>(a, kStopWaiting);
      break;
    }
    case kCancelWait:
      clear_wait(c);
      put<uint8_t>(a, kWaitCanceled);
      break;
    case kGetNumKeys:
      put<int64_t>(a, static_cast<int64_t>(kv_.size()));
      break;
    case kDeleteKey: {
      auto it = kv_.find(r.keys[0]);
      int64_t n = it != kv_.end();
      if (n) {
        stored_ -= it->first.size() + it->second.size();
        kv_.erase(it);
      }
      put<int64_t>(a, n);
      break;
    }
    case kAppend: {
      auto it = kv_.find(r.keys[0]);
      std::string v = it == kv_.end() ? std::move(r.values[0]) : it->second + r.values[0];
      if (!store(r.keys[0], std::move(v))) return drop(c, "fills the store");
      return;
    }
    case kMultiGet:
      for (const auto& k : r.keys) {
        auto it = kv_.find(k);
        put_string(a, it == kv_.end() ? std::string() : it->second);
      }
      break;
    case kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i)
        if (!store(r.keys[i], std::move(r.values[i]))) return drop(c, "fills the store");
      return;
    case kQueuePush: {
      size_t size = r.keys[0].size() + r.values[0].size();
      if (stored_ + size > kMaxStored) return drop(c, "fills the store");
      stored_ += size;
      queues_[r.keys[0]].push_back(std::move(r.values[0]));
      wake(r.keys[0], true);
      return;
    }
    case kQueuePop: {
      auto it = queues_.find(r.keys[0]);
      int64_t n = it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
      put<int64_t>(a, n);
      if (n > 0) {
        put_string(a, it->second.front());
        stored_ -= it->first.size() + it->second.front().size();
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      break;
    }
    case kQueueLen: {
      auto it = queues_.find(r.keys[0]);
      put<int64_t>(a, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    case kListKeys:
      put<int64_t>(a, static_cast<int64_t>(kv_.size()));
      for (const auto& [k, v] : kv_) put_string(a, k);
      break;
    default:
      return drop(c, "sent an unknown request");
  }
  send(c, std::move(a));
}

bool TorchStore::store(const std::string& key, std::string value, bool wake_waiters) {
  auto it = kv_.find(key);
  size_t old = it == kv_.end() ? 0 : key.size() + it->second.size();
  size_t now = key.size() + value.size();
  if (stored_ - old + now > kMaxStored) return false;
  stored_ = stored_ - old + now;
  if (it == kv_.end())
    kv_.emplace(key, std::move(value));
  else
    it->second = std::move(value);
  if (wake_waiters) wake(key, false);
  return true;
}

bool TorchStore::present(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

// Wakes the clients waiting for `key` (`one`: the first only, for a queue's new value).
void TorchStore::wake(const std::string& key, bool one) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  std::vector<uint64_t> ids;
  if (one) {
    ids.push_back(it->second.front());
    it->second.erase(it->second.begin());
    if (it->second.empty()) waiting_.erase(it);
  } else {
    ids = std::move(it->second);
    waiting_.erase(it);
  }
  for (uint64_t id : ids) {
    auto c = clients_.find(id);
    if (c == clients_.end() || c->second->awaiting == 0) continue;
    Client& cl = *c->second;
    if (--cl.awaiting > 0) continue;
    clear_wait(cl);
    std::string a;
    put<uint8_t>(a, kStopWaiting);
    send(cl, std::move(a));
  }
}

bool TorchStore::wait_for(Client& c, std::vector<std::string> keys) {
  size_t bytes = 0;
  for (const auto& k : keys) bytes += k.size() + sizeof(uint64_t);
  if (waiting_bytes_ + bytes > kMaxBuffered) return false;
  waiting_bytes_ += bytes;
  c.wait_bytes = bytes;
  c.awaiting = keys.size();
  c.wait_keys = std::move(keys);
  for (const auto& k : c.wait_keys) waiting_[k].push_back(c.id);
  return true;
}

void TorchStore::clear_wait(Client& c) {
  for (const auto& k : c.wait_keys) {
    auto it = waiting_.find(k);
    if (it == waiting_.end()) continue;
    it->second.erase(std::remove(it->second.begin(), it->second.end(), c.id), it->second.end());
    if (it->second.empty()) waiting_.erase(it);
  }
  c.wait_keys.clear();
  c.awaiting = 0;
  waiting_bytes_ -= c.wait_bytes;
  c.wait_bytes = 0;
}

void TorchStore::send(Client& c, std::string data) {
  if (c.dead) return;
  if (c.out.size() - c.out_off >= kMaxQueued) return drop(c, "does not read its answers");
  if (c.out_off > 0 && c.out_off == c.out.size()) c.out.clear(), c.out_off = 0;
  c.out += data;
  on_writable(c);
  if (!c.dead && c.out_off < c.out.size() && !c.write_ev) {
    Client* cp = &c;
    c.write_ev = loop_.watch_writable(c.fd.get(), [this, cp] { on_writable(*cp); });
  }
}

void TorchStore::on_writable(Client& c) {
  while (!c.dead && c.out_off < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) return drop(c, nullptr);
    c.out_off += static_cast<size_t>(n);
  }
  if (c.dead) return;
  c.out.clear();
  c.out_off = 0;
  c.write_ev = Event();
}

// Disconnects a client; `why` (a rule it broke) is logged, a plain close is not.  Its memory is
// freed once the callback that called this has returned.
void TorchStore::drop(Client& c, const char* why) {
  if (c.dead) return;
  c.dead = true;
  if (why) warn(c.peer, why);
  clear_wait(c);
  buffered_ -= c.in.size();
  c.in.clear();
  auto it = clients_.find(c.id);
  if (it == clients_.end()) return;
  dead_.push_back(std::move(it->second));
  clients_.erase(it);
  if (dead_.size() == 1)
    loop_.post([this, alive = alive_] {
      if (*alive) dead_.clear();
    });
}

void TorchStore::warn(const std::string& peer, const char* why) {
  auto say = warnings_.next([this](int n) {
    logger("rdzv")->warn("torch store on port {}: {} more clients were disconnected", port_, n);
  });
  if (say == WarningLimit::Say::Yes)
    logger("rdzv")->warn("torch store on port {}: disconnected {}: it {}", port_, peer, why);
}

void TorchStore::sweep() {
  auto limit = std::chrono::steady_clock::now() - std::chrono::duration_cast<
                                                      std::chrono::steady_clock::duration>(
                                                      std::chrono::duration<double>(kValidateTimeout));
  std::vector<Client*> late;
  for (auto& [id, c] : clients_)
    if (!c->validated && c->since < limit) late.push_back(c.get());
  for (Client* c : late) drop(*c, "did not validate in time");
  sweep_timer_.arm(kSweepInterval);
}

}  // namespace pe
