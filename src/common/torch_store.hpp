// The key-value store of a generation's torch ranks, hosted by pytorch_exec on MASTER_PORT as
// torchrun's agent hosts it: a server of torch's TCPStore wire protocol.  With
// TORCHELASTIC_USE_AGENT_STORE=True in their environment, torch's env:// and tcp:// rendezvous
// make every rank a client of MASTER_ADDR:MASTER_PORT, and a script's own
// TCPStore(MASTER_ADDR, MASTER_PORT, is_master=True) becomes a client when the port is taken.
//
// The protocol (torch's TCPStoreBackend, all integers in host byte order, strings and values as
// u64 length + bytes):
//   a connection starts with VALIDATE u32 magic (nothing answered; anything else: closed), then
//   PING u32 nonce -> u32 nonce          SET key value
//   COMPARE_SET key expected desired -> value
//   GET key -> value ("" when missing)   ADD key i64 -> i64 (the value is kept as decimal text)
//   CHECK u64 n keys -> u8 READY(0)/NOT_READY(1)
//   WAIT u64 n keys -> u8 STOP_WAITING(0) once every key exists (later, when one is missing)
//   CANCEL_WAIT -> u8 WAIT_CANCELED(1)   GETNUMKEYS -> i64         DELETE_KEY key -> i64
//   APPEND key value                      MULTI_GET u64 n keys -> n values
//   MULTI_SET u64 n (key value)*n         QUEUE_PUSH key value (wakes one waiter on key)
//   QUEUE_POP key -> i64 length before, then the value when it was not 0
//   QUEUE_LEN key -> i64                  LIST_KEYS -> i64 n, n keys
//   BARRIER key i64 world -> u8 STOP_WAITING once the key's count reaches world
// Every length is checked against the limits below before anything is buffered; a client that
// breaks a rule (or an unknown request) is disconnected, others are not affected.  The server
// never blocks on a client: answers are queued and written as the client takes them.
//
// Threading: the loop's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/accept_loop.hpp"
#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"

namespace pe {

namespace torch_store {
inline constexpr uint32_t kMagic = 0x3C85F7CE;
enum Query : uint8_t {
  kValidate, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kGetNumKeys, kDeleteKey, kAppend,
  kMultiGet, kMultiSet, kCancelWait, kPing, kQueuePush, kQueuePop, kQueueLen, kListKeys, kBarrier,
};
inline constexpr uint8_t kReady = 0, kNotReady = 1;           // CHECK
inline constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WAIT, CANCEL_WAIT, BARRIER

// Limits (torch's own server has the first three).
inline constexpr uint64_t kMaxKey = 8 << 10;
inline constexpr uint64_t kMaxValue = 16u << 20;
inline constexpr uint64_t kMaxKeys = 128 << 10;  // keys of one request
inline constexpr size_t kMaxRequest = 64u << 20;  // one request, all of it
inline constexpr size_t kMaxStored = 1u << 30;    // keys, values and queued values, together
inline constexpr size_t kMaxBuffered = 512u << 20;  // unparsed input of all clients, together
inline constexpr size_t kMaxQueued = 64u << 20;     // answers a client has not read yet
inline constexpr size_t kMaxClients = 1 << 16;
inline constexpr double kValidateTimeout = 30.0;  // to send VALIDATE after connecting

// One request at the front of p[0, n): its size in bytes (filling `r`), 0 when incomplete, -1
// when malformed or over a limit.  Never reads beyond n.
struct Request {
  uint8_t op = 0;
  std::vector<std::string> keys, values;  // values: SET, APPEND, QUEUE_PUSH: 1; COMPARE_SET: 2
  int64_t num = 0;                        // ADD's increment, BARRIER's world size, PING's nonce
};
long parse_request(const char* p, size_t n, Request& r);
}  // namespace torch_store

class TorchStore {
 public:
  // Serves on `listener` (a listening, non-blocking socket).
  TorchStore(EventLoop& loop, UniqueFd listener);
  ~TorchStore();
  TorchStore(const TorchStore&) = delete;
  TorchStore& operator=(const TorchStore&) = delete;

  // A store on a port chosen for MASTER_PORT on `addr` (listen_master_port), or on `port`.
  static std::unique_ptr<TorchStore> host(EventLoop& loop, const std::string& addr, int port = 0);

  int port() const { return port_; }
  size_t clients() const { return clients_.size(); }
  size_t keys() const { return kv_.size(); }

 private:
  struct Client;
  void on_accept(UniqueFd fd, std::string peer);
  void on_readable(Client& c);
  void on_writable(Client& c);
  void handle(Client& c, torch_store::Request& r);
  void send(Client& c, std::string data);
  void drop(Client& c, const char* why);
  bool store(const std::string& key, std::string value, bool wake_waiters = true);
  bool present(const std::string& key) const;
  void clear_wait(Client& c);
  bool wait_for(Client& c, std::vector<std::string> keys);
  void wake(const std::string& key, bool one);
  void sweep();
  void warn(const std::string& peer, const char* why);  // rate-limited

  EventLoop& loop_;
  UniqueFd listener_;
  int port_ = 0;
  Event sweep_timer_;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<Client>> dead_;  // dropped, freed outside their callbacks
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiting_;  // key -> clients
  size_t stored_ = 0;    // bytes in kv_ and queues_
  size_t buffered_ = 0;  // unparsed input of every client
  size_t waiting_bytes_ = 0;  // keys clients wait for (bounded by kMaxBuffered too)
  WarningLimit warnings_{10, 10.0};  // warnings about dropped clients: 10 per 10 s
  std::unique_ptr<AcceptLoop> accept_;
};

}  // namespace pe
