// The key-value store the ranks of a DataChannel group use to find each other at init (addresses,
// node names, MPI identities).  A TCP store served by rank 0 for the env:// bootstrap; an
// in-memory one for ranks that are threads of one process.
#pragma once

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

std::shared_ptr<Store> memory_store();
// Rank 0 serves (binding `port` on every address, 0: any free port); everyone is a client of
// host:port.  Throws Error.
class TcpStoreServer;
std::shared_ptr<TcpStoreServer> serve_tcp_store(int port, int* bound_port);
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, double timeout,
                                         std::shared_ptr<TcpStoreServer> keep_alive = nullptr);

}  // namespace pytorch_exec::dc
