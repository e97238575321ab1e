#include <config.h>

#include "dc/registry.hpp"

#include <array>
#include <vector>

#include "dc/bootstrap.hpp"
#include "dc/settings.hpp"
#include "dc/socket.hpp"
#include "dc/tcp/transport.hpp"
#ifdef HAVE_MPI
#include "dc/mpi/transport.hpp"
#endif

namespace pytorch_exec::dc {
namespace {

using Factory = std::shared_ptr<Transport> (*)(const World&, Listener*, const Settings&,
                                               const Deadline&);

std::shared_ptr<Transport> make_tcp(const World& w, Listener* listener, const Settings& s,
                                    const Deadline& d) {
  if (!listener) throw Error("the tcp transport needs the listener that the bootstrap published");
  return tcp::connect_mesh(w.rank, w.size, std::move(*listener), w.addrs, w.session,
                           s.tcp_congestion, d);
}

#ifdef HAVE_MPI
std::shared_ptr<Transport> make_mpi(const World& w, Listener*, const Settings&, const Deadline&) {
  if (w.threads) throw Error("the mpi transport needs one process per rank (not threads)");
  return mpi::create(w.rank, w.size,
                     [&](const std::string& mine) { return w.allgather("mpi", mine); });
}
#endif

struct Entry {
  TransportKind kind;
  std::string name;
  bool node_only;  // not a Transport: the node's shared-memory engine (no factory here)
  Factory make;    // nullptr for a point-to-point kind: not in this build
};

constexpr size_t kKinds = 3;

// Indexed by kind, and in the order in which a world creates its transports (the same on every
// rank).
const std::array<Entry, kKinds>& table() {
  static const std::array<Entry, kKinds> t = {{
      {TransportKind::Shm, "shm", true, nullptr},
      {TransportKind::Tcp, "tcp", false, make_tcp},
#ifdef HAVE_MPI
      {TransportKind::Mpi, "mpi", false, make_mpi},
#else
      {TransportKind::Mpi, "mpi", false, nullptr},
#endif
  }};
  return t;
}

const Entry& entry(TransportKind k) { return table()[static_cast<size_t>(k)]; }

}  // namespace

const std::string& transport_name(TransportKind k) { return entry(k).name; }

std::optional<TransportKind> transport_kind(const std::string& name) {
  for (const Entry& e : table())
    if (e.name == name) return e.kind;
  return std::nullopt;
}

bool transport_built(TransportKind k) { return entry(k).node_only || entry(k).make; }

bool transport_point_to_point(TransportKind k) { return !entry(k).node_only; }

std::string transport_names(bool inside_node) {
  std::vector<std::string> names;
  for (const Entry& e : table())
    if (transport_built(e.kind) && (inside_node || !e.node_only)) names.push_back(e.name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

LevelTransports create_transports(const Settings& s, const World& w, Listener* listener,
                                  const Deadline& d) {
  TransportKind intra = s.intra, inter = s.inter;
  if (!transport_point_to_point(inter))
    throw Error("the " + transport_name(inter) + " transport cannot serve across nodes");
  std::array<std::shared_ptr<Transport>, kKinds> made;
  for (const Entry& e : table()) {
    if (e.node_only || (e.kind != intra && e.kind != inter)) continue;
    if (!e.make)
      throw Error("the " + e.name +
                  " transport is not available: this libpytorch_dc was built "
                  "without it");
    made[static_cast<size_t>(e.kind)] = e.make(w, listener, s, d);
  }
  LevelTransports out;
  out.inter = made[static_cast<size_t>(inter)];
  out.intra = entry(intra).node_only ? out.inter : made[static_cast<size_t>(intra)];
  return out;
}

}  // namespace pytorch_exec::dc
