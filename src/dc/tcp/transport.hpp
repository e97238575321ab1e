// The tcp transport: one TCP connection between every two ranks of the world, nonblocking
// sockets driven by poll().  Each connection carries two ordered byte streams (one per
// direction); posted receives take the bytes of the stream in posting order, straight into the
// caller's buffer (no intermediate copy), and sends are written from the caller's buffer.
//
// Set-up (mesh.cpp): every rank opens a Listener on the interface facing MASTER_ADDR, publishes
// its address ("ip:port") through the group's bootstrap, and then all ranks call connect_mesh()
// together: a rank connects to every lower rank and accepts every higher one.  A connection
// proves it belongs to the group by the hello of hello.hpp (the job token and the group's random
// session number); anything else (a stranger, a stale process of an earlier job) is closed and
// ignored, and accepted connections are served concurrently, each with a short deadline.
//
// Threads: one thread uses a Transport; Listener and connect_mesh are called by that thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dc/socket.hpp"
#include "dc/transport.hpp"

namespace pytorch_exec::dc::tcp {

// addrs[r] is rank r's "ip:port" (its own entry is ignored); `congestion`: the congestion control
// of the connections (set_congestion_control in socket.hpp); `names`: the rank that errors name
// for peer r, where that is not r (empty: r).
std::unique_ptr<Transport> connect_mesh(int rank, int size, Listener listener,
                                        const std::vector<std::string>& addrs, uint64_t session,
                                        const std::string& congestion, const Deadline& d,
                                        std::vector<int> names = {});
// The transport over connected sockets (fds[rank] is -1), for connect_mesh.
std::unique_ptr<Transport> make_transport(int rank, std::vector<int> fds,
                                          std::vector<int> names = {});

}  // namespace pytorch_exec::dc::tcp
