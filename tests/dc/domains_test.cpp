// The locality domains of a node as levels of their own, in the shared orchestration
// (engines.hpp: NestedIntra; hierarchical.hpp: domain_levels, hierarchical_allreduce), with host
// engines: ranks are threads, each level a Comm over an in-memory transport of this file (the
// library's own transports need a bootstrap; a Comm is only a transport and its members), the
// domain and rail levels RingIntra, the cross-node step MemcpyCopy and cross_allreduce.  The
// engines are chosen as the GPU path chooses them (gpu/device.cpp): NestedIntra where
// domain_levels says the nodes are laid out alike, one RingIntra over the node otherwise.  Every
// rank's result is checked against a reference computed directly from all inputs.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "dc/hierarchical.hpp"
#include "testlib.hpp"

using namespace pytorch_exec::dc;
using namespace dctest;

namespace {

// Messages between threads: a send is copied into the receiver's queue at once (and completes);
// a receive completes when a message from its peer is there, in the order they were posted.
struct Hub {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> queue;  // by (from, to)
};

class HubTransport final : public Transport {
 public:
  HubTransport(Hub& hub, int rank, int size) : hub_(hub), me_(rank), n_(size) {}
  const char* name() const override { return "hub"; }
  unsigned capabilities() const override { return kPointToPoint; }
  int rank() const override { return me_; }
  int size() const override { return n_; }

  Request isend(int peer, const void* buf, size_t bytes) override {
    if (bytes == 0) return {};
    auto* p = static_cast<const char*>(buf);
    std::lock_guard<std::mutex> l(hub_.m);
    hub_.queue[{me_, peer}].emplace_back(p, p + bytes);
    hub_.cv.notify_all();
    return {};
  }
  Request irecv(int peer, void* buf, size_t bytes) override {
    if (bytes == 0) return {};
    uint64_t id = next_++;
    posted_[id] = {peer, buf, bytes, false};
    order_[peer].push_back(id);
    return {id};
  }
  void wait(Request r, const Deadline& d) override {
    auto it = posted_.find(r.id);
    if (it == posted_.end()) return;
    int peer = it->second.peer;
    std::unique_lock<std::mutex> l(hub_.m);
    auto& q = hub_.queue[{peer, me_}];
    while (!it->second.done) {  // the peer's earlier receives first
      Recv& first = posted_[order_[peer].front()];
      if (!hub_.cv.wait_until(l, d.at, [&] { return !q.empty(); }))
        d.expire("rank " + std::to_string(peer));
      if (q.front().size() != first.bytes)
        throw Error("hub: " + std::to_string(q.front().size()) + " bytes from rank " +
                    std::to_string(peer) + " for a receive of " + std::to_string(first.bytes));
      std::memcpy(first.buf, q.front().data(), first.bytes);
      q.pop_front();
      first.done = true;
      order_[peer].pop_front();
    }
    posted_.erase(it);
  }
  bool progress() override { return false; }
  bool done(Request r) override {
    auto it = posted_.find(r.id);
    return it == posted_.end() || it->second.done;
  }
  void idle(int ms, int) override { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
  void abort(const std::string&) override {}

 private:
  struct Recv {
    int peer = -1;
    void* buf = nullptr;
    size_t bytes = 0;
    bool done = false;
  };
  Hub& hub_;
  int me_, n_;
  uint64_t next_ = 1;
  std::map<uint64_t, Recv> posted_;
  std::map<int, std::deque<uint64_t>> order_;  // by peer, in posting order
};

// A group of threads laid out on nodes and domains (both by rank).
struct Layout {
  std::vector<int> node_of, domain_of;
  int size() const { return static_cast<int>(node_of.size()); }
};

// The ranks of `rank`'s node (in local-rank order) for which `keep(local rank)` holds, as a
// Comm over `t` in which `rank` is member `me`.
Comm level(Transport& t, const Layout& l, int rank, const std::function<bool(int)>& keep) {
  Comm c{&t, {}, 0};
  int local = 0;
  for (int r = 0; r < l.size(); ++r) {
    if (l.node_of[static_cast<size_t>(r)] != l.node_of[static_cast<size_t>(rank)]) continue;
    if (keep(local)) {
      if (r == rank) c.me = c.size();
      c.members.push_back(r);
    }
    ++local;
  }
  return c;
}

// The ranks of every node, by local rank.
std::vector<std::vector<int>> ranks_on_nodes(const Layout& l) {
  std::vector<std::vector<int>> v(
      static_cast<size_t>(*std::max_element(l.node_of.begin(), l.node_of.end()) + 1));
  for (int r = 0; r < l.size(); ++r)
    v[static_cast<size_t>(l.node_of[static_cast<size_t>(r)])].push_back(r);
  return v;
}

struct Case {
  size_t count;
  DType t;
  Op op;
};

// Runs hierarchical_allreduce on every rank of `l` at once and checks every rank's result;
// returns whether the ranks used the nested levels.  `piece_bytes`, `small_bytes`: the
// orchestration's pieces and its threshold for one owner per piece.
bool run(const Layout& l, const Case& c, size_t piece_bytes, size_t small_bytes,
         size_t chunk_bytes) {
  int n = l.size();
  std::mt19937_64 rng(c.count * 31 + static_cast<size_t>(c.op) * 7 + static_cast<size_t>(c.t));
  std::vector<std::vector<char>> in, out;
  for (int r = 0; r < n; ++r) in.push_back(random_input(c.count, c.t, c.op, rng));
  out = in;
  Hub hub;
  std::vector<int> nested(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        HubTransport t(hub, r, n);
        DomainLevels dl = domain_levels(l.node_of, l.domain_of, r);
        nested[static_cast<size_t>(r)] = dl.nested;
        Comm node = level(t, l, r, [](int) { return true; });
        // cross: this local rank on every node (ProcessGroup::Impl::lay_out's cross_c).
        auto nodes = ranks_on_nodes(l);
        int min_local = n;
        for (auto& v : nodes) min_local = std::min(min_local, static_cast<int>(v.size()));
        Comm cross{&t, {}, l.node_of[static_cast<size_t>(r)]};
        if (node.me < min_local)
          for (auto& v : nodes) cross.members.push_back(v[static_cast<size_t>(node.me)]);
        RingIntra whole(node);
        std::optional<Comm> dom, rail;
        std::optional<RingIntra> dom_e, rail_e;
        std::optional<NestedIntra> both;
        IntraEngine* intra = &whole;
        if (dl.nested) {
          int R = dl.per_domain;
          dom = level(t, l, r, [&](int lr) { return lr / R == dl.domain; });
          rail = level(t, l, r, [&](int lr) { return lr % R == dl.rail; });
          EXPECT_EQ(dom->me, dl.rail);
          EXPECT_EQ(rail->me, dl.domain);
          dom_e.emplace(*dom);
          rail_e.emplace(*rail);
          both.emplace(*dom_e, R, *rail_e, dl.domains);
          intra = &*both;
        }
        MemcpyCopy copy(chunk_bytes > 0);
        NodeLevels levels{cross, *intra, copy, min_local, piece_bytes, n, chunk_bytes};
        CrossOptions o;
        o.small_bytes = small_bytes;
        auto d = Deadline::after(60, "test allreduce");
        hierarchical_allreduce(levels, out[static_cast<size_t>(r)].data(), c.count, c.t, c.op,
                               make_header(Kind::Allreduce, c.count, c.t, c.op, 1), d, o);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& x : th) x.join();
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    EXPECT_EQ(check_result(out[static_cast<size_t>(r)].data(), in, c.count, c.t, c.op), 0u);
  }
  return std::count(nested.begin(), nested.end(), 1) == n;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    for (size_t count : {0u, 1u, 7u, 1001u, 65537u}) {
      v.push_back({count, DType::F32, Op::Sum});
      v.push_back({count, DType::F32, Op::Avg});
      v.push_back({count, DType::I32, Op::Max});
    }
    return v;
  }();
  return all;
}

// 2 nodes x 2 domains x 2 ranks, local ranks domain by domain.
Layout two_by_two_by_two() { return {{0, 0, 0, 0, 1, 1, 1, 1}, {3, 3, 5, 5, 3, 3, 5, 5}}; }

TEST(DomainLevels, NestedWhereEveryNodeIsLaidOutAlike) {
  Layout l = two_by_two_by_two();
  for (int r = 0; r < l.size(); ++r) {
    DomainLevels dl = domain_levels(l.node_of, l.domain_of, r);
    EXPECT_TRUE(dl.nested);
    EXPECT_EQ(dl.domains, 2);
    EXPECT_EQ(dl.per_domain, 2);
    EXPECT_EQ(dl.domain, (r % 4) / 2) << r;
    EXPECT_EQ(dl.rail, r % 2) << r;
  }
  // Ranks of a node need not be consecutive in the group, nor its domains numbered alike.
  DomainLevels dl =
      domain_levels({0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, {7, 1, 7, 1, 7, 1, 2, 0, 2, 0, 2, 0}, 9);
  EXPECT_TRUE(dl.nested);
  EXPECT_EQ(dl.domains, 2);
  EXPECT_EQ(dl.per_domain, 3);
  EXPECT_EQ(dl.domain, 1);  // local rank 4 of node 1
  EXPECT_EQ(dl.rail, 1);
}

TEST(DomainLevels, OtherwiseOneLevelPerNode) {
  auto flat = [](std::vector<int> node_of, std::vector<int> domain_of) {
    for (int r = 0; r < static_cast<int>(node_of.size()); ++r)
      if (domain_levels(node_of, domain_of, r).nested) return false;
    return true;
  };
  EXPECT_TRUE(flat({0, 0, 0, 0}, {0, 0, 1, 1}));                                      // one node
  EXPECT_TRUE(flat({0, 0, 1, 1}, {0, 0, 0, 0}));                                      // one domain
  EXPECT_TRUE(flat({0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 1, 1, 0, 1, 1, 1}));              // 2+2, 1+3
  EXPECT_TRUE(flat({0, 0, 0, 0, 1, 1, 1, 1, 1, 1}, {0, 0, 1, 1, 0, 0, 1, 1, 2, 2}));  // D 2, 3
  EXPECT_TRUE(flat({0, 0, 0, 0, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1, 0, 1}));              // interleaved
  EXPECT_TRUE(flat({0, 0, 1, 1}, {0, 1, 0, 1}));                    // one rank a domain
  EXPECT_TRUE(flat({0, 0, 0, 0, 1, 1, 1}, {0, 0, 1, 1, 0, 0, 1}));  // 4 and 3 ranks
}

TEST(NestedIntra, TwoNodesTwoDomainsTwoRanks) {
  Layout l = two_by_two_by_two();
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + op_name(c.op) + " count " +
                 std::to_string(c.count));
    // One owner for small pieces (the default threshold), every owner, and pieces and pipeline
    // chunks that cut the large counts.
    EXPECT_TRUE(run(l, c, size_t(1) << 40, 32 << 10, 0));
    EXPECT_TRUE(run(l, c, size_t(1) << 40, 0, 0));
    EXPECT_TRUE(run(l, c, 64 << 10, 0, 1000));
  }
}

// Every number of owners the orchestration may ask for, straight on the engine (one node).
TEST(NestedIntra, AnyNumberOfOwners) {
  Layout l = two_by_two_by_two();
  for (int owners = 1; owners <= 4; ++owners) {
    SCOPED_TRACE("owners " + std::to_string(owners));
    Hub hub;
    std::vector<std::vector<char>> in, out;
    std::mt19937_64 rng(static_cast<uint64_t>(owners));
    for (int r = 0; r < 4; ++r) in.push_back(random_input(1001, DType::I32, Op::Sum, rng));
    out = in;
    std::vector<int> crossed(4), first(4, -1);
    std::vector<std::thread> th;
    for (int r = 0; r < 4; ++r)
      th.emplace_back([&, r] {
        HubTransport t(hub, r, 4);
        DomainLevels dl = domain_levels(l.node_of, l.domain_of, r);
        Comm dom = level(t, l, r, [&](int lr) { return lr / 2 == dl.domain; });
        Comm rail = level(t, l, r, [&](int lr) { return lr % 2 == dl.rail; });
        RingIntra de(dom), re(rail);
        NestedIntra both(de, 2, re, 2);
        IntraEngine::Cross cross = [&](void* p, size_t k) {
          crossed[static_cast<size_t>(r)] += static_cast<int>(k);
          first[static_cast<size_t>(r)] =
              static_cast<int>(static_cast<char*>(p) - out[static_cast<size_t>(r)].data()) / 4;
        };
        both.allreduce(out[static_cast<size_t>(r)].data(), 1001, DType::I32, Op::Sum, owners, cross,
                       4, make_header(Kind::Allreduce, 1001, DType::I32, Op::Sum, 1),
                       Deadline::after(60, "test"));
      });
    for (auto& x : th) x.join();
    // Every element crossed exactly once, by min(owners, D) x (owners / that) owners.
    int sum = 0, owning = 0;
    for (int k : crossed) {
      sum += k;
      owning += k > 0;
    }
    EXPECT_EQ(sum, 1001);
    EXPECT_EQ(owning, owners == 3 ? 2 : owners);
    // Every owner: shard s = p * D + i, owned by local rank (s % D) * R + s / D (the plan of
    // topo::plan_gpu_levels), starts where shard s - 1 ends.
    if (owners == 4) {
      int at = 0;
      for (int sh = 0; sh < 4; ++sh) {
        size_t owner = static_cast<size_t>((sh % 2) * 2 + sh / 2);
        EXPECT_EQ(first[owner], at) << "shard " << sh;
        at += crossed[owner];
      }
    }
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(check_result(out[static_cast<size_t>(r)].data(), in, 1001, DType::I32, Op::Sum),
                0u);
  }
}

// Unequal layouts fall back to one level per node, and still reduce right.
TEST(NestedIntra, UnequalLayoutsFallBack) {
  Layout uneven{{0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 1, 1, 0, 1, 1, 1}};
  Layout interleaved{{0, 0, 0, 0, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1, 0, 1}};
  Layout sizes{{0, 0, 0, 0, 1, 1, 1, 1, 1, 1}, {0, 0, 1, 1, 0, 0, 1, 1, 1, 1}};
  for (const Layout& l : {uneven, interleaved, sizes})
    for (const Case& c : cases()) {
      SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + op_name(c.op) + " count " +
                   std::to_string(c.count));
      EXPECT_FALSE(run(l, c, size_t(1) << 40, 0, 0));
    }
}

}  // namespace
