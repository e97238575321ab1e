// The public ProcessGroup: construction (init, threads, split) and the collectives other than
// allreduce (collectives.cpp), each guarded so that an error breaks the group on every rank.
#include <config.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <thread>

#include "dc/group.hpp"
#include "dc/recursive_doubling.hpp"
#include "dc/reduce.hpp"
#include "dc/registry.hpp"
#include "dc/ring.hpp"
#include "dc/socket.hpp"
#include "dc/tcp/transport.hpp"
#include "dc/tree.hpp"

namespace pytorch_exec::dc {

template <typename F>
void ProcessGroup::Impl::guarded(const Deadline& d, F&& f) {
  if (!failed.empty())
    throw Error(d.describe() + ": the process group is unusable after an earlier error: " + failed);
  auto fail = [&](const Error& e) {
    failed = e.what();
    abort_transports(failed);
    if (engine) engine->abort();
  };
  try {
    f();
    // A late rank finds everything it waits for there, though the others gave up on it: it
    // raises too (the call failed on them), not only at its next call.
    if (engine) engine->check_others();
  } catch (const TimeoutError& e) {  // d.expire(): it names the operation, and stays a TimeoutError
    fail(e);
    throw;
  } catch (const Error& e) {
    fail(e);
    throw Error(d.describe() + ": " + e.what());
  }
}

void ProcessGroup::Impl::abort_transports(const std::string& why) {
  if (inter_t) inter_t->abort(why);
  if (intra_t) intra_t->abort(why);
  for (auto& t : lane_t) t->abort(why);
}

void ProcessGroup::Impl::run_guarded(const Deadline& d, const std::function<void()>& f) {
  guarded(d, f);
}

Deadline ProcessGroup::Impl::deadline(double timeout, const std::string& what) const {
  return Deadline::after(seconds(timeout), what);
}

double ProcessGroup::Impl::processes_here() const {
  // The node's ranks, or more where nodes are simulated (PYTORCH_DC_NODE) and the launcher says
  // how many it started here; ranks that are threads all run here.
  double on_node = static_cast<double>(
      std::count(node_of.begin(), node_of.end(), node_of[static_cast<size_t>(rank)]));
  return threads ? size : std::max(on_node, env_number("LOCAL_WORLD_SIZE", 0));
}

bool ProcessGroup::Impl::machine_oversubscribed() const {
  return processes_here() > machine_cpus();
}

int ProcessGroup::Impl::shm_lanes() const {
  // Across nodes, lanes need a lane of their own across too (connect_lanes: tcp), and a
  // hierarchical allreduce to run in.
  if (nodes > 1 && (s.inter != TransportKind::Tcp || !s.hierarchical || tcp_host.empty()))
    return 1;
  if (s.shm_threads > 0) return s.shm_threads;
  // The processors this rank can use (its affinity, its cgroups' quota), shared among the
  // processes of the machine; at most 4 lanes (a few cores copy what the memory of a socket can
  // take).
  return static_cast<int>(
      std::clamp(usable_cpus() / std::max(1.0, processes_here()), 1.0, 4.0));
}

void ProcessGroup::Impl::lay_out(const Deadline& d) {
  std::vector<std::vector<int>> on_node(
      static_cast<size_t>(*std::max_element(node_of.begin(), node_of.end()) + 1));
  for (int r = 0; r < size; ++r)
    on_node[static_cast<size_t>(node_of[static_cast<size_t>(r)])].push_back(r);
  nodes = static_cast<int>(on_node.size());
  node = node_of[static_cast<size_t>(rank)];
  auto& mine = on_node[static_cast<size_t>(node)];
  local_size = static_cast<int>(mine.size());
  local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  min_local = max_local = local_size;
  for (auto& v : on_node) {
    min_local = std::min(min_local, static_cast<int>(v.size()));
    max_local = std::max(max_local, static_cast<int>(v.size()));
  }
  world_c = Comm{inter_t.get(), world, rank};
  flat_c = nodes == 1 ? Comm{intra_t.get(), world, rank} : world_c;
  local_c = Comm{intra_t.get(), {}, local_rank};
  for (int r : mine) local_c.members.push_back(world[static_cast<size_t>(r)]);
  cross_c = Comm{inter_t.get(), {}, node};
  if (local_rank < min_local)
    for (auto& v : on_node)
      cross_c.members.push_back(world[static_cast<size_t>(v[static_cast<size_t>(local_rank)])]);
  for (Comm* c : {&world_c, &flat_c, &local_c, &cross_c}) {
    bool stream = c->t && (c->t->capabilities() & Transport::kByteStream);  // tcp: segments
    c->max_chunk = shared_cpus && stream ? kRingChunkShared : kRingChunk;
  }
  node_major = min_local == max_local;
  for (int r = 0; r < size && node_major; ++r)
    node_major = node_of[static_cast<size_t>(r)] == r / local_size;
  shm_bytes = s.shm_bytes ? s.shm_bytes : nodes > 1 ? 4 << 20 : 512 << 10;
  bool shm = s.intra == TransportKind::Shm && local_size > 1;
  int64_t lanes = shm ? shm_lanes() : 1;
  auto least_of = [&](int64_t* v, size_t n) {  // the smallest of every rank's, in place
    recursive_doubling_allreduce(world_c, v, n, DType::I64, Op::Min,
                                 make_header(Kind::Allreduce, n, DType::I64, Op::Min, 0), d);
  };
  // Across nodes, lanes run in every node at once: the fewest that any rank asks for (a node
  // with one rank, or without shm, has one), so that no node makes lanes that go unused.
  if (nodes > 1) least_of(&lanes, 1);
  // Set up over the node's own connections, not the store: a group made by split() must not
  // depend on the rank that serves the store still being there.
  if (shm) {
    auto barrier = [&] {
      dissemination_barrier(local_c, make_header(Kind::Barrier, 0, DType::U8, Op::Sum, 0), d);
    };
    engine = shm::AllreduceEngine::create(barrier, key + ".node" + std::to_string(node), local_rank,
                                          local_size, shm_bytes, static_cast<int>(lanes), mine);
  }
  if (nodes > 1) {
    // Every node cuts a hierarchical allreduce into the same pieces, each one round of its shm
    // engine (whose cross-node step must match the other nodes'): no larger than the smallest
    // slot of any node (a node whose /dev/shm had no room for the slot asked has a smaller one).
    // And into the same lanes: the fewest that any node made (/dev/shm may have had room for
    // fewer than asked).
    int64_t least[2] = {engine ? static_cast<int64_t>(engine->slot()) : INT64_MAX,
                        engine ? engine->lanes() : 1};
    least_of(least, 2);
    shm_bytes = std::min(shm_bytes, static_cast<size_t>(least[0]));
    cross_lanes = static_cast<int>(least[1]);
    std::vector<int> cross_ranks;  // the group ranks of cross_c's members
    if (local_rank < min_local)
      for (auto& v : on_node) cross_ranks.push_back(v[static_cast<size_t>(local_rank)]);
    if (cross_lanes > 1) connect_lanes(cross_ranks, d);
  }
}

std::vector<std::string> ProcessGroup::Impl::publish_listeners(std::vector<Listener>& ls, int n,
                                                               uint64_t& session,
                                                               const Deadline& d) {
  // A record per rank: its random number, then its addresses.
  constexpr size_t kAddrBytes = 64;
  size_t record = 8 + kAddrBytes * static_cast<size_t>(n);
  std::vector<char> own(record, '\0'), all(record * static_cast<size_t>(size));
  uint64_t mine = random64();
  std::memcpy(own.data(), &mine, 8);
  for (int i = 0; i < n; ++i) {
    ls.emplace_back(0, tcp_host);  // the interface of the group's own tcp listener, if any
    std::string a = (tcp_host.empty() || tcp_host == "0.0.0.0"
                         ? transport_address(env_or("MASTER_ADDR", ""))
                         : tcp_host) +
                    ":" + std::to_string(ls.back().port());
    if (a.size() >= kAddrBytes) throw Error("tcp: address too long: " + a);
    std::memcpy(own.data() + 8 + kAddrBytes * static_cast<size_t>(i), a.data(), a.size());
  }
  allgather(own.data(), all.data(), record, DType::U8, d);
  std::memcpy(&session, all.data(), 8);
  std::vector<std::string> addrs;
  for (int r = 0; r < size; ++r)
    for (int i = 0; i < n; ++i)
      addrs.emplace_back(all.data() + record * static_cast<size_t>(r) + 8 +
                         kAddrBytes * static_cast<size_t>(i));
  return addrs;
}

void ProcessGroup::Impl::connect_lanes(const std::vector<int>& cross_ranks, const Deadline& d) {
  int extra = cross_lanes - 1;
  std::vector<Listener> ls;
  uint64_t session = 0;
  std::vector<std::string> addrs = publish_listeners(ls, extra, session, d);
  for (int l = 1; l <= extra; ++l) {
    Comm c{inter_t.get(), {}, node};  // no members: this local rank owns no shard
    if (!cross_ranks.empty()) {
      std::vector<std::string> peers;
      std::vector<int> names;  // the mesh numbers them by node: errors name their world ranks
      for (int r : cross_ranks) {
        peers.push_back(addrs[static_cast<size_t>(r * extra + l - 1)]);
        names.push_back(world[static_cast<size_t>(r)]);
      }
      // A session of its own for each mesh (lane and local rank)
      uint64_t mesh = session + static_cast<uint64_t>(local_rank * shm::kMaxLanes + l);
      lane_t.push_back(tcp::connect_mesh(node, nodes, std::move(ls[static_cast<size_t>(l - 1)]),
                                         peers, mesh, s.tcp_congestion, d, names));
      c = Comm{lane_t.back().get(), {}, node};
      for (int k = 0; k < nodes; ++k) c.members.push_back(k);
      c.names = names;
      c.max_chunk = cross_c.max_chunk;
    }
    lane_c.push_back(c);
  }
  // Every rank's connections are made before any goes on: one that destroys the group at once
  // must not fail a peer still connecting.
  dissemination_barrier(world_c, make_header(Kind::Barrier, 0, DType::U8, Op::Sum, 0), d);
}

namespace {

std::vector<int> number_nodes(const std::vector<std::string>& names) {
  std::map<std::string, int> index;
  std::vector<int> out;
  for (auto& n : names)
    out.push_back(index.emplace(n, static_cast<int>(index.size())).first->second);
  return out;
}

}  // namespace

std::unique_ptr<ProcessGroup::Impl> make_impl(World w, const Settings& s, Listener* listener) {
  auto d = Deadline::after(s.timeout, "process group set-up (rank " + std::to_string(w.rank) + ")");
  auto g = std::make_unique<ProcessGroup::Impl>();
  g->s = s;
  LevelTransports tr = create_transports(s, w, listener, d);
  g->inter_t = tr.inter;
  g->intra_t = tr.intra;
  g->key = w.key;
  g->threads = w.threads;
  if (static_cast<size_t>(w.rank) < w.addrs.size() && !w.addrs[static_cast<size_t>(w.rank)].empty())
    g->tcp_host = w.addrs[static_cast<size_t>(w.rank)].substr(
        0, w.addrs[static_cast<size_t>(w.rank)].rfind(':'));
  g->rank = w.rank;
  g->size = w.size;
  g->world.resize(static_cast<size_t>(w.size));
  std::iota(g->world.begin(), g->world.end(), 0);
  g->node_of = number_nodes(w.nodes);
  g->domain_of = w.domains;
  g->guarded(d, [&] {
    int32_t shared = g->machine_oversubscribed();
    if (shared) no_busy_polling();
    // Every rank must cut ring messages the same way: agree on shared_cpus.  This also keeps
    // every rank in init until all are done with the store (mpi set-up), so rank 0, which serves
    // it, may exit at any time after.
    if (g->size > 1)
      recursive_doubling_allreduce(Comm{g->inter_t.get(), g->world, g->rank}, &shared, 1,
                                   DType::I32, Op::Max,
                                   make_header(Kind::Allreduce, 1, DType::I32, Op::Max, 0), d);
    g->shared_cpus = shared != 0;
    g->lay_out(d);
  });
  return g;
}

std::shared_ptr<ProcessGroup> ProcessGroup::init(const Options& opts) {
  Settings s = resolve_settings(opts);
  std::unique_ptr<Listener> l;
  // Its address is published; it listens on the interface facing MASTER_ADDR only.
  if (s.uses(TransportKind::Tcp)) l = std::make_unique<Listener>(0, facing_address());
  World w = bootstrap_process(l ? l->port() : 0, s.timeout);
  return std::make_shared<ProcessGroup>(make_impl(std::move(w), s, l.get()));
}

std::vector<std::shared_ptr<ProcessGroup>> ProcessGroup::threads(int n, const Options& opts,
                                                                 std::vector<int> nodes) {
  if (n < 1) throw Error("threads(): need at least one rank");
  if (!nodes.empty() && nodes.size() != static_cast<size_t>(n))
    throw Error("threads(): one node per rank");
  Settings s = resolve_settings(opts);
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i)
    names.push_back("node" + std::to_string(nodes.empty() ? 0 : nodes[static_cast<size_t>(i)]));
  auto store = memory_store();
  uint64_t session = random64();
  std::string key = "threads" + std::to_string(::getpid()) + "." +
                    std::to_string(next_generation()) + "." + std::to_string(session % 100000);
  std::vector<std::shared_ptr<ProcessGroup>> out(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> th;
  for (int i = 0; i < n; ++i) {
    th.emplace_back([&, i] {
      try {
        std::unique_ptr<Listener> l;
        if (s.uses(TransportKind::Tcp)) l = std::make_unique<Listener>(0, "127.0.0.1");
        World w = bootstrap_thread(i, n, names, store, session, key, l ? l->port() : 0, s.timeout);
        out[static_cast<size_t>(i)] =
            std::make_shared<ProcessGroup>(make_impl(std::move(w), s, l.get()));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    });
  }
  for (auto& t : th) t.join();
  for (auto& e : errors)
    if (!e.empty()) throw Error(e);
  return out;
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
int ProcessGroup::node() const { return impl_->node; }
int ProcessGroup::nodes() const { return impl_->nodes; }
int ProcessGroup::local_rank() const { return impl_->local_rank; }
int ProcessGroup::local_size() const { return impl_->local_size; }
int ProcessGroup::domain() const { return impl_->domain_of[static_cast<size_t>(impl_->rank)]; }
int ProcessGroup::domain_of(int rank) const {
  if (rank < 0 || rank >= impl_->size)
    throw Error("domain_of(" + std::to_string(rank) + "): no such rank in a group of " +
                std::to_string(impl_->size));
  return impl_->domain_of[static_cast<size_t>(rank)];
}
int ProcessGroup::shm_lanes() const {
  const Impl& g = *impl_;
  return !g.engine ? 0 : g.nodes > 1 ? g.cross_lanes : g.engine->lanes();
}
const std::string& ProcessGroup::intra_transport() const { return transport_name(impl_->s.intra); }
const std::string& ProcessGroup::inter_transport() const { return transport_name(impl_->s.inter); }
double ProcessGroup::timeout() const { return impl_->s.timeout; }

void need_buffer(const void* p, size_t count, const char* op, size_t elem, size_t blocks) {
  if (count > 0 && count > SIZE_MAX / elem / std::max<size_t>(blocks, 1))
    throw Error(std::string(op) + ": a count of " + std::to_string(count) +
                (elem == 1 ? " bytes" : " elements of " + std::to_string(elem) + " bytes") +
                (blocks > 1 ? ", " + std::to_string(blocks) + " times," : "") +
                " is more than memory can hold");
  if (!p && count > 0)
    throw Error(std::string(op) + ": null buffer with a count of " + std::to_string(count) +
                (elem == 1 ? " bytes" : ""));
}

namespace {

void need_op(Op op, const char* call) {
  if (static_cast<unsigned>(op) > static_cast<unsigned>(Op::Avg))
    throw Error(std::string(call) + ": unknown Op " + std::to_string(static_cast<int>(op)));
}

// Checks the arguments of send/recv; returns the operation's deadline.
Deadline p2p_call(const ProcessGroup::Impl& g, const char* op, const void* buf, size_t bytes,
                  int peer, double timeout) {
  need_buffer(buf, bytes, op);
  if (peer < 0 || peer >= g.size || peer == g.rank)
    throw Error(std::string(op) + ": rank " + std::to_string(peer) +
                " is not another rank of this group");
  return Deadline::call(g.seconds(timeout), op, bytes, -1, -1, peer);
}

}  // namespace

void ProcessGroup::allreduce(void* buf, size_t count, DType t, Op op, double timeout) {
  allreduce(buf, buf, count, t, op, timeout);
}

void ProcessGroup::allreduce(const void* in, void* out, size_t count, DType t, Op op,
                             double timeout) {
  need_op(op, "allreduce");
  need_buffer(in, count, "allreduce", dtype_size(t));
  need_buffer(out, count, "allreduce", dtype_size(t));
  auto d = Deadline::call(impl_->seconds(timeout), "allreduce", count, static_cast<int>(t),
                          static_cast<int>(op));
  if (in != out) std::memcpy(out, in, count * dtype_size(t));
  impl_->guarded(d, [&] { impl_->allreduce(out, count, t, op, d); });
}

void ProcessGroup::reduce_scatter(const void* in, void* out, size_t count, DType t, Op op,
                                  double timeout) {
  Impl& g = *impl_;
  need_op(op, "reduce_scatter");
  need_buffer(in, count, "reduce_scatter", dtype_size(t), static_cast<size_t>(g.size));
  need_buffer(out, count, "reduce_scatter", dtype_size(t));
  auto d = Deadline::call(g.seconds(timeout), "reduce_scatter", count, static_cast<int>(t),
                          static_cast<int>(op));
  g.guarded(d, [&] { g.reduce_scatter(in, out, count, t, op, d); });
}

void ProcessGroup::allgather(const void* in, void* out, size_t count, DType t, double timeout) {
  Impl& g = *impl_;
  need_buffer(in, count, "allgather", dtype_size(t));
  need_buffer(out, count, "allgather", dtype_size(t), static_cast<size_t>(g.size));
  auto d = Deadline::call(g.seconds(timeout), "allgather", count, static_cast<int>(t));
  g.guarded(d, [&] { g.allgather(in, out, count, t, d); });
}

void ProcessGroup::broadcast(void* buf, size_t count, DType t, int root, double timeout) {
  need_buffer(buf, count, "broadcast", dtype_size(t));
  Impl& g = *impl_;
  if (root < 0 || root >= g.size)
    throw Error("broadcast: root " + std::to_string(root) + " is not a rank of this group of " +
                std::to_string(g.size));
  auto d = Deadline::call(g.seconds(timeout), "broadcast", count, static_cast<int>(t), -1, root);
  g.guarded(d, [&] {
    auto h = make_header(Kind::Broadcast, count, t, Op::Sum, ++g.seq, root);
    size_t bytes = count * dtype_size(t);
    // Across nodes the tree and the levels each see only part of the ranks' calls.
    if (g.nodes > 1) check_ring_headers(g.world_c, h, d);
    if (!g.blocks_by_level()) return tree_broadcast(g.world_c, buf, bytes, root, h, d);
    g.host_blocks([&](const BlockLevels& levels) {
      hierarchical_broadcast(levels, buf, bytes, root / g.local_size, root % g.local_size, h, d);
    });
  });
}

void ProcessGroup::barrier(double timeout) {
  Impl& g = *impl_;
  auto d = g.deadline(timeout, "barrier");
  g.guarded(d, [&] {
    auto h = make_header(Kind::Barrier, 0, DType::U8, Op::Sum, ++g.seq);
    if (!g.engine || !g.blocks_by_level()) return dissemination_barrier(g.world_c, h, d);
    // Level by level, through the levels the other collectives use (so that a rank in one of
    // them meets this call's header and raises): the node's shared memory (everyone of the
    // node is here), then among the ranks of this local rank across nodes (then everyone of
    // every node is).
    g.engine->barrier(h, d);
    if (g.nodes > 1) dissemination_barrier(g.cross_c, h, d);
  });
}

void ProcessGroup::send(const void* buf, size_t bytes, int peer, double timeout) {
  Impl& g = *impl_;
  auto d = p2p_call(g, "send", buf, bytes, peer, timeout);
  g.guarded(d, [&] {
    auto h = make_header(Kind::Send, bytes, DType::U8, Op::Sum, 0);
    Request a = g.world_c.isend(peer, &h, sizeof h), b = g.world_c.isend(peer, buf, bytes);
    g.world_c.wait(a, d);
    g.world_c.wait(b, d);
  });
}

void ProcessGroup::recv(void* buf, size_t bytes, int peer, double timeout) {
  Impl& g = *impl_;
  auto d = p2p_call(g, "recv", buf, bytes, peer, timeout);
  g.guarded(d, [&] {
    recv_header(g.world_c, peer, make_header(Kind::Send, bytes, DType::U8, Op::Sum, 0), d);
    g.world_c.wait(g.world_c.irecv(peer, buf, bytes), d);
  });
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, double timeout) {
  Impl& g = *impl_;
  int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(g.size));
  allgather(mine, all.data(), 2, DType::I64, timeout);
  int index = g.splits++;
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < g.size; ++r)
    if (all[2 * static_cast<size_t>(r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  auto c = std::make_unique<Impl>();
  c->s = g.s;
  c->key = g.key + ".s" + std::to_string(index) + "c" + std::to_string(color);
  c->tcp_host = g.tcp_host;
  c->threads = g.threads;
  c->inter_t = g.inter_t;
  c->intra_t = g.intra_t;
  c->shared_cpus = g.shared_cpus;
  c->size = static_cast<int>(members.size());
  std::vector<std::string> node_names;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == g.rank) c->rank = static_cast<int>(i);
    c->world.push_back(g.world[static_cast<size_t>(members[i])]);
    node_names.push_back(std::to_string(g.node_of[static_cast<size_t>(members[i])]));
    c->domain_of.push_back(g.domain_of[static_cast<size_t>(members[i])]);
  }
  c->node_of = number_nodes(node_names);
  auto d = g.deadline(timeout, "split");
  g.guarded(d, [&] { c->lay_out(d); });
  return std::make_shared<ProcessGroup>(std::move(c));
}

}  // namespace pytorch_exec::dc
