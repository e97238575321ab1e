// The transport registry: every transport kind the DataChannel knows (its name, the levels it
// serves, whether this build has it) and the one place where transports are created.  Names are
// turned into kinds once, by resolve_settings (settings.cpp); later code compares kinds only.
//
// shm is a kind (it is chosen like the others) but not a Transport: it is the node's
// shared-memory allreduce engine (shm/engine.hpp), created by the group's layout; inside a node
// the group then moves its point-to-point bytes over the inter-node transport.
//
// Threads: create_transports() is called by the thread that sets up a group; the rest is pure.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dc/transport.hpp"

namespace pytorch_exec::dc {

struct World;
class Listener;
struct Settings;

enum class TransportKind : uint8_t { Shm, Tcp, Mpi };

// "shm", "tcp" or "mpi".
const std::string& transport_name(TransportKind k);
// The kind called `name`; nullopt when no kind is.
std::optional<TransportKind> transport_kind(const std::string& name);
// Whether this libpytorch_dc has kind `k` (mpi: only when built with MPI).
bool transport_built(TransportKind k);
// Whether `k` moves bytes between any two ranks (tcp, mpi), so that it serves across nodes too.
bool transport_point_to_point(TransportKind k);
// The names of the kinds of this build that serve inside a node or across nodes, for messages:
// "shm, tcp or mpi".
std::string transport_names(bool inside_node);

// The point-to-point transports of a world's levels; `intra` is `inter` where the level inside a
// node is shm, or where both levels name the same kind.
struct LevelTransports {
  std::shared_ptr<Transport> intra, inter;
};
// The transports of the levels s.intra and s.inter.  All ranks of `w` call this together.
// `listener`: this rank's tcp listener, whose address the bootstrap published (needed where a
// level is tcp).  Throws Error.
LevelTransports create_transports(const Settings& s, const World& w, Listener* listener,
                                  const Deadline& d);

}  // namespace pytorch_exec::dc
