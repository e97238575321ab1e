// Small socket helpers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/unique_fd.hpp"

namespace pe {

// A TCP port p for MASTER_PORT: p and p+1 (DataChannel's store) are free on `addr` right now,
// and both lie outside the kernel's ephemeral range, so that no outgoing connection takes them
// before the program binds them a moment later (as torchrun's workers do).  Random candidates
// are tried; if kPortTries are all taken, any free port.
inline constexpr int kPortTries = 64;
int find_free_port(const std::string& addr);
// The same choice, but the port is bound at once: a listening socket on addr:p (as listen_tcp)
// with p+1 free; when a candidate cannot be bound, another is tried (and after kPortTries, any
// port).  No other process can take p between the choice and its use.  Throws SystemError.
UniqueFd listen_master_port(const std::string& addr, int* bound_port);
// The kernel's ephemeral port range (net.ipv4.ip_local_port_range).
std::pair<int, int> ephemeral_port_range();
// The n-th port (modulo their number) of those below and above the ephemeral range, from 10000
// on, such that p+1 is outside it too.
int port_outside_ephemeral(uint32_t n);

std::string local_hostname();

// A listening TCP socket on addr:port (port 0: any), non-blocking, close-on-exec.  Throws
// SystemError.  The port actually bound is returned in *bound_port.
UniqueFd listen_tcp(const std::string& addr, int port, int* bound_port);
// Whether a TCP socket of this network namespace listens on `port` (any address; IPv4 or 6), as
// /proc/net/tcp{,6} say.
bool port_has_listener(int port);
// Raises this process's soft limit on open descriptors to its hard limit (at start: a listener
// that runs out of descriptors cannot accept).
void raise_fd_limit();
// Opens /dev/null on whichever of descriptors 0, 1 and 2 is closed (`pytorch_exec ... >&-`), at
// start, before anything else is opened: otherwise the first socket or epoll instance would be
// "standard output", and the ranks' output would be written into it.
void open_closed_stdio();
// Accepts one connection (non-blocking, close-on-exec); an invalid fd when none is pending.
UniqueFd accept_tcp(int listen_fd, std::string* peer_addr);
// Connects to host:port within `timeout` seconds (host: an IPv4 address or a name).  Returns
// the connected, non-blocking socket; throws SystemError or TimeoutError naming the target.
UniqueFd connect_tcp(const std::string& host, int port, double timeout);
// Connects to the first of `targets` (host, port) that answers, trying them all at once (each a
// quarter second after the one before), again and again: an attempt that gets no answer within
// `attempt` seconds is made anew (a SYN lost to a partition that heals is not waited out), a
// refused one after half a second, until `timeout` seconds have passed.  Returns the connected,
// non-blocking socket; throws TimeoutError naming each target's last trouble.
UniqueFd connect_first(const std::vector<std::pair<std::string, int>>& targets, double timeout,
                       double attempt);
// The peer's / this end's IPv4 address of a connected socket ("" when unknown).
std::string peer_address(int fd);
std::string local_address(int fd);
// TCP keepalive probes so that a vanished peer is noticed within about `seconds`, and
// TCP_NODELAY.
void tune_control_socket(int fd, int seconds);
// This machine's IPv4 addresses in the order others should try them (order_addresses).
std::vector<std::string> local_ipv4_addresses();

struct InterfaceAddress {
  std::string ifname;
  std::string addr;
  bool loopback = false;
};
// Addresses for other hosts to reach us at, best first: ordinary interfaces, then those named
// like container or VM bridges (docker*, virbr*, veth*, br-*; a last-resort guess that other
// hosts cannot reach them), loopback last.  Keeps the order within each group.
std::vector<std::string> order_addresses(const std::vector<InterfaceAddress>& ifs);

// The local address the kernel would send from toward IPv4 address `dest` (its route choice,
// found by connecting a UDP socket; nothing is sent).  "" when there is no route.
std::string route_source_address(const std::string& dest);

}  // namespace pe
