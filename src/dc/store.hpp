// The key-value store the ranks of a DataChannel group use to find each other at init (addresses,
// node names, MPI identities).  A TCP store served by rank 0 for the env:// bootstrap; an
// in-memory one for ranks that are threads of one process.
//
// The TCP store admits only clients that prove the job token (auth.hpp) and bounds what a client
// can make it hold (the limits below); store.cpp describes the protocol.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace pytorch_exec::dc {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until the key exists; throws TimeoutError after `timeout` seconds.
  virtual std::string get(const std::string& key, double timeout) = 0;
};

// Limits of the TCP store: one key, one value, all keys and values together.
inline constexpr uint32_t kStoreMaxKey = 1024;
inline constexpr uint32_t kStoreMaxValue = 16u << 20;
inline constexpr size_t kStoreMaxBytes = 256u << 20;

std::shared_ptr<Store> memory_store();
// Rank 0 serves (binding `port` on `addr`, "" or an address not of this host: every address; 0:
// any free port); everyone is a client of host:port.  Throws Error.
class TcpStoreServer;
std::shared_ptr<TcpStoreServer> serve_tcp_store(int port, const std::string& addr, int* bound_port);
// The address the server listens on ("0.0.0.0": every address).
std::string store_host(const TcpStoreServer& s);
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, double timeout,
                                         std::shared_ptr<TcpStoreServer> keep_alive = nullptr);

// One request of the store protocol at the front of p[0, n): its size in bytes (filling `r`), 0
// when incomplete, -1 when malformed or over a limit.  Never reads beyond n.
struct StoreRequest {
  char op = 0;  // 'S' set, 'G' get
  std::string key, value;
};
long parse_store_request(const char* p, size_t n, StoreRequest& r);

}  // namespace pytorch_exec::dc
