// Blocking TCP helpers of the DataChannel, shared by the key-value store (store.cpp) and the tcp
// transport's set-up: a listener, a connect that retries until a deadline, and exact reads and
// writes bounded by a deadline.  (libpytorch_dc is installed on its own, so it does not use the
// launcher's src/common.)
#pragma once

#include <string>

#include "dc/transport.hpp"

namespace pytorch_exec::dc {

class Listener {
 public:
  // Binds `port` (0: any free port) on `addr` (a host name or address; "" or an address that is
  // not this host's: every address).  Throws Error.
  explicit Listener(int port = 0, const std::string& addr = "");
  ~Listener();
  Listener(Listener&& o) noexcept;
  Listener& operator=(Listener&&) = delete;
  Listener(const Listener&) = delete;
  int port() const { return port_; }
  const std::string& host() const { return host_; }  // the bound address, "0.0.0.0": every one
  int release();                                     // hands the socket over

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string host_;
};

// Connects to host:port with TCP_NODELAY, retrying while the other side does not listen yet;
// TimeoutError (naming `what`) after the deadline, Error if the host cannot be resolved.
// `source` (an address of this host, "" or "0.0.0.0": the kernel's choice) is the connection's
// own address, so that it leaves through that address's interface.
int connect_until(const std::string& host, int port, const Deadline& d, const std::string& what,
                  const std::string& source = "");
// The TCP congestion control of a connected socket, by name:
//   "auto"    the system's default, except that BBR becomes cubic (or reno where an unprivileged
//             process may not choose cubic).  BBR paces each connection at the bandwidth it has
//             measured; between ranks on one host (loopback) or over a low-latency fabric that
//             halves what a ring moves, and the measured rate varies from run to run (bench/
//             allreduce: 4 MiB exchanges take 2.0 ms under BBR and 1.1 ms under reno or cubic).
//   "system"  the system's default, unchanged.
//   NAME      that algorithm (net.ipv4.tcp_allowed_congestion_control lists those allowed).
// Throws Error naming `source` when NAME cannot be used.
void set_congestion_control(int fd, const std::string& name, const std::string& source);
// The congestion control of a socket ("" if unknown).
std::string congestion_control(int fd);
// Error naming `source` unless `name` is "auto", "system" or could name an algorithm.
void check_congestion_name(const std::string& name, const std::string& source);
// "host:port" split; Error naming `what` if there is no port.
void split_address(const std::string& addr, std::string& host, int& port, const std::string& what);

// Sends (out) or receives exactly n bytes.  Each wait is bounded by the deadline (d.expire(who));
// a closed or failed connection is Error("<what>: ...").
void io_exact(int fd, void* p, size_t n, bool out, const Deadline& d, const std::string& who,
              const std::string& what);

// The IPv4 address of a network interface (eth0, ib0) or of the network interface of an RDMA
// device (mlx5_0: /sys/class/infiniband/mlx5_0/device/net/); "" when it has none or is down.
// Link-local addresses (169.254/16) do not count: other hosts do not route to them.
std::string interface_address(const std::string& name);

// The address of this host that reaches `toward` (a host name or address, e.g. MASTER_ADDR);
// 127.0.0.1 when `toward` is empty or unreachable.
std::string local_address_toward(const std::string& toward);

}  // namespace pytorch_exec::dc
