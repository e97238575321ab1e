// Conformance of the DataChannel collectives, ranks as threads: every transport configuration
// (shm or tcp inside a node, tcp across; one node, several nodes, unequal nodes, small shm slots
// so that buffers take several rounds, the cross-node
// step in pipeline chunks of several sizes) x dtype x op x count, against an independent reference
// on fresh random inputs, and the same bits on every rank.  The mpi transport needs processes:
// tests/integration/test_dc.py runs the same checks through dc_check under pytorch_exec.
#include <sys/statvfs.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "testlib.hpp"

using namespace dctest;

namespace {

struct Config {
  const char* name;
  int n;
  std::vector<int> nodes;
  const char* intra;
  const char* shm_bytes;  // PYTORCH_DC_SHM_BYTES, nullptr: default
  int hierarchical;
  int bf16_wire;
  const char* pipeline_bytes = nullptr;  // PYTORCH_DC_PIPELINE_BYTES, nullptr: default
  const char* shm_threads = nullptr;     // PYTORCH_DC_SHM_THREADS, nullptr: default
};

std::ostream& operator<<(std::ostream& o, const Config& c) { return o << c.name; }

const DType kTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                        DType::I32, DType::I64, DType::U8};
const Op kOps[] = {Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg};

class Conformance : public ::testing::TestWithParam<Config> {
 protected:
  static Groups make(const Config& c) {
    if (c.shm_bytes) ::setenv("PYTORCH_DC_SHM_BYTES", c.shm_bytes, 1);
    if (c.pipeline_bytes) ::setenv("PYTORCH_DC_PIPELINE_BYTES", c.pipeline_bytes, 1);
    if (c.shm_threads) ::setenv("PYTORCH_DC_SHM_THREADS", c.shm_threads, 1);
    Options o;
    o.intra = c.intra;
    o.inter = "tcp";
    o.timeout = 60;
    o.hierarchical = c.hierarchical;
    o.bf16_wire = c.bf16_wire;
    auto g = ProcessGroup::threads(c.n, o, c.nodes);
    ::unsetenv("PYTORCH_DC_SHM_BYTES");
    ::unsetenv("PYTORCH_DC_PIPELINE_BYTES");
    ::unsetenv("PYTORCH_DC_SHM_THREADS");
    return g;
  }
  std::mt19937_64 rng{std::random_device{}()};
};

// Sizes: empty, one element, fewer elements than ranks, odd, around the small-message
// threshold (32 KiB), and above the default shm slot for f32 and bf16; with shm lanes, 3.25 MiB
// and an odd element more in every type (three slices: 1 MiB per lane at least).
std::vector<size_t> counts(DType t, Op op, bool lanes) {
  std::vector<size_t> c = {0, 1, 3, 17, 1001, 8191, 8193, 70001};
  if ((t == DType::F32 || t == DType::BF16) && (op == Op::Sum || op == Op::Max))
    c.push_back((1u << 20) + 3);
  if (lanes) c.push_back((13u << 18) / dtype_size(t) + 1);
  return c;
}

TEST_P(Conformance, AllreduceMatchesReferenceForEveryTypeOpAndCount) {
  auto g = make(GetParam());
  int n = GetParam().n;
  for (DType t : kTypes)
    for (Op op : kOps)
      for (size_t count : counts(t, op, GetParam().shm_threads != nullptr)) {
        std::vector<std::vector<char>> in, out(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) in.push_back(random_input(count, t, op, rng));
        bool in_place = count % 2 == 1;
        on_all(g, [&](ProcessGroup& pg, int r) {
          auto& o = out[static_cast<size_t>(r)];
          o = in[static_cast<size_t>(r)];
          if (in_place)
            pg.allreduce(o.data(), count, t, op);
          else
            pg.allreduce(in[static_cast<size_t>(r)].data(), o.data(), count, t, op);
        });
        size_t bytes = count * dtype_size(t);
        if (GetParam().bf16_wire && t == DType::F32) continue;  // checked by its own test
        ASSERT_EQ(check_result(out[0].data(), in, count, t, op), 0u)
            << GetParam() << " in_place " << in_place;
        for (int r = 1; r < n; ++r)
          ASSERT_EQ(0, std::memcmp(out[0].data(), out[static_cast<size_t>(r)].data(), bytes))
              << "rank " << r << " differs from rank 0: " << dtype_name(t) << " " << op_name(op)
              << " " << count;
      }
}

TEST_P(Conformance, ReduceScatterAllgatherBroadcastAndBarrier) {
  auto g = make(GetParam());
  int n = GetParam().n;
  for (DType t : {DType::F32, DType::I64, DType::BF16})
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{40000}}) {
      size_t es = dtype_size(t);
      std::vector<std::vector<char>> in, rs(static_cast<size_t>(n)), ag(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r)
        in.push_back(random_input(count * static_cast<size_t>(n), t, Op::Sum, rng));
      on_all(g, [&](ProcessGroup& pg, int r) {
        auto& mine = rs[static_cast<size_t>(r)];
        mine.assign(count * es + 1, 0);
        pg.reduce_scatter(in[static_cast<size_t>(r)].data(), mine.data(), count, t, Op::Sum);
        auto& all = ag[static_cast<size_t>(r)];
        all.assign(count * es * static_cast<size_t>(n) + 1, 0);
        pg.allgather(mine.data(), all.data(), count, t);
        pg.barrier();
      });
      // Every rank's allgather of the reduce_scatter blocks is the allreduce of the inputs.
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(check_result(ag[static_cast<size_t>(r)].data(), in,
                               count * static_cast<size_t>(n), t, Op::Sum),
                  0u)
            << "rank " << r << " count " << count;
      for (int root = 0; root < n; ++root) {
        auto data = random_input(count * 100 + 3, t, Op::Sum, rng);
        std::vector<std::vector<char>> got(static_cast<size_t>(n));
        on_all(g, [&](ProcessGroup& pg, int r) {
          auto& b = got[static_cast<size_t>(r)];
          b = r == root ? data : std::vector<char>(data.size(), 0);
          pg.broadcast(b.data(), count * 100 + 3, t, root);
        });
        for (int r = 0; r < n; ++r)
          ASSERT_EQ(got[static_cast<size_t>(r)], data) << "broadcast from " << root << " to " << r;
      }
    }
}

// reduce_scatter with every op and the layouts the conformance configurations give (one node,
// several nodes level by level, unequal nodes and flat rings), against the reference allreduce:
// rank r's block is elements [r * count, (r + 1) * count) of it.  Inputs and outputs apart and
// in place (the output is the rank's block of the input); allgather with the input in its place
// in the output.
TEST_P(Conformance, ReduceScatterEveryOpAndAllgatherInPlace) {
  auto g = make(GetParam());
  int n = GetParam().n;
  for (DType t : {DType::F32, DType::I32, DType::F64})
    for (Op op : kOps)
      for (size_t count : {size_t{1}, size_t{7}, size_t{3000}, size_t{70001}}) {
        size_t es = dtype_size(t), bb = count * es;
        std::vector<std::vector<char>> in;
        for (int r = 0; r < n; ++r)
          in.push_back(random_input(count * static_cast<size_t>(n), t, op, rng));
        std::vector<char> apart(bb * static_cast<size_t>(n)), inplace(apart.size());
        on_all(g, [&](ProcessGroup& pg, int r) {
          auto& mine = in[static_cast<size_t>(r)];
          char* at = apart.data() + static_cast<size_t>(r) * bb;
          pg.reduce_scatter(mine.data(), at, count, t, op);
          std::vector<char> buf = mine;
          char* place = buf.data() + static_cast<size_t>(r) * bb;
          pg.reduce_scatter(buf.data(), place, count, t, op);
          std::memcpy(inplace.data() + static_cast<size_t>(r) * bb, place, bb);
        });
        ASSERT_EQ(check_result(apart.data(), in, count * static_cast<size_t>(n), t, op), 0u)
            << dtype_name(t) << " " << op_name(op) << " count " << count;
        ASSERT_EQ(inplace, apart) << "in place, count " << count;
        std::vector<std::vector<char>> all(static_cast<size_t>(n));
        on_all(g, [&](ProcessGroup& pg, int r) {
          auto& out = all[static_cast<size_t>(r)];
          out.assign(bb * static_cast<size_t>(n), 0);
          char* place = out.data() + static_cast<size_t>(r) * bb;
          std::memcpy(place, apart.data() + static_cast<size_t>(r) * bb, bb);
          pg.allgather(place, out.data(), count, t);
        });
        for (int r = 0; r < n; ++r)
          ASSERT_EQ(all[static_cast<size_t>(r)], apart) << "allgather in place on rank " << r;
      }
}

TEST_P(Conformance, SendRecvAndSplit) {
  auto g = make(GetParam());
  int n = GetParam().n;
  std::vector<int> results(static_cast<size_t>(n), -1);
  on_all(g, [&](ProcessGroup& pg, int r) {
    // A ring of sends: even ranks send first, odd ranks receive first.
    std::vector<int> out(1000, r), in(1000, -1);
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (n > 1) {
      if (r % 2 == 0) {
        pg.send(out.data(), 4000, next);
        pg.recv(in.data(), 4000, prev);
      } else {
        pg.recv(in.data(), 4000, prev);
        pg.send(out.data(), 4000, next);
      }
      EXPECT_EQ(in[999], prev);
    }
    // Split into even and odd ranks, reverse order by key; allreduce the rank in each.
    auto sub = pg.split(r % 2, -r);
    ASSERT_TRUE(sub);
    EXPECT_EQ(sub->size(), (n - r % 2 + 1) / 2);
    int64_t v = r;
    sub->allreduce(&v, 1, DType::I64, Op::Sum);
    results[static_cast<size_t>(r)] = static_cast<int>(v);
    auto none = pg.split(r == 0 ? 0 : -1);
    EXPECT_EQ(!none, r != 0);
  });
  for (int r = 0; r < n; ++r) {
    int want = 0;
    for (int q = r % 2; q < n; q += 2) want += q;
    EXPECT_EQ(results[static_cast<size_t>(r)], want) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports, Conformance,
    ::testing::Values(
        Config{"one_rank", 1, {}, "shm", nullptr, 1, 0},
        Config{"shm_2_ranks_one_node", 2, {}, "shm", nullptr, 1, 0},
        Config{"shm_2_ranks_small_slots", 2, {}, "shm", "8192", 1, 0},
        Config{"shm_4_ranks_one_node", 4, {}, "shm", nullptr, 1, 0},
        Config{"shm_3_ranks_small_slots", 3, {}, "shm", "8192", 1, 0},
        Config{"tcp_4_ranks_one_node", 4, {}, "tcp", nullptr, 1, 0},
        Config{"tcp_3_nodes_one_rank_each", 3, {0, 1, 2}, "shm", nullptr, 1, 0},
        Config{"hier_shm_2x2", 4, {0, 0, 1, 1}, "shm", nullptr, 1, 0},
        Config{"hier_shm_unequal_3_1_2", 6, {0, 1, 0, 2, 0, 2}, "shm", "65536", 1, 0},
        Config{"hier_tcp_unequal_2_1", 3, {0, 1, 0}, "tcp", "65536", 1, 0},
        // 4 MiB pieces: a local rank without a block holds paced sends back
        // past its (no) receives in the reduce-scatter.
        Config{"hier_tcp_unequal_2_1_large_pieces", 3, {0, 1, 0}, "tcp", "4194304", 1, 0},
        Config{"flat_tcp_2x2_not_hierarchical", 4, {0, 0, 1, 1}, "shm", nullptr, 0, 0},
        // Nodes of equal size whose ranks are not node by node: flat rings for reduce_scatter
        // and allgather.
        Config{"hier_shm_2x2_interleaved", 4, {0, 1, 0, 1}, "shm", nullptr, 1, 0},
        // Rings inside the nodes (tcp), level by level; three nodes whose small slots take a few
        // nodes' blocks per round or part of one.
        Config{"hier_tcp_2x2", 4, {0, 0, 1, 1}, "tcp", nullptr, 1, 0},
        Config{"hier_shm_3x2_small_slots", 6, {0, 0, 1, 1, 2, 2}, "shm", "8192", 1, 0},
        Config{"hier_shm_2x2_bf16_wire", 4, {0, 0, 1, 1}, "shm", nullptr, 1, 1},
        // The cross-node step in pipeline chunks, staged through the memcpy engine's buffers:
        // chunks of odd byte counts (cut to whole elements), and larger than
        // most shards; unequal ranks per node, shm and rings inside.
        Config{"hier_shm_unequal_3_1_2_pipeline_1000", 6, {0, 1, 0, 2, 0, 2}, "shm", "65536", 1,
               0, "1000"},
        Config{"hier_tcp_unequal_2_1_pipeline_3001", 3, {0, 1, 0}, "tcp", "65536", 1, 0, "3001"},
        Config{"hier_shm_2x2_pipeline_4096", 4, {0, 0, 1, 1}, "shm", nullptr, 1, 0, "4096"},
        Config{"hier_shm_3x2_pipeline_1m_bf16_wire", 6, {0, 0, 1, 1, 2, 2}, "shm", nullptr, 1, 1,
               "1048576"},
        // Lanes of the shm engine: the allreduces of 3.25 MiB in 3 slices (the 4 MiB f32 ones
        // too, 2 MiB bf16 in 2), with the default slots and with small ones; across nodes each
        // lane with its own tcp connections, also with small slots, pipeline chunks and bf16 on
        // the wire; unequal nodes (one without shm) have one lane.
        Config{"shm_2_ranks_3_lanes", 2, {}, "shm", nullptr, 1, 0, nullptr, "3"},
        Config{"shm_3_ranks_small_slots_4_lanes", 3, {}, "shm", "8192", 1, 0, nullptr, "4"},
        Config{"hier_shm_2x2_2_lanes", 4, {0, 0, 1, 1}, "shm", nullptr, 1, 0, nullptr, "2"},
        Config{"hier_shm_3x2_small_slots_3_lanes", 6, {0, 0, 1, 1, 2, 2}, "shm", "8192", 1, 0,
               nullptr, "3"},
        Config{"hier_shm_2x3_pipeline_4096_bf16_wire_2_lanes", 6, {0, 0, 0, 1, 1, 1}, "shm",
               nullptr, 1, 1, "4096", "2"},
        Config{"hier_shm_unequal_3_1_2_3_lanes", 6, {0, 1, 0, 2, 0, 2}, "shm", "65536", 1, 0,
               nullptr, "3"}),
    [](const ::testing::TestParamInfo<Config>& i) { return std::string(i.param.name); });

// f32 carried as bf16 between nodes: within the documented error (2^-8 relative per rounding,
// one rounding per node hop), and the same bits on every rank.
TEST(Bf16Wire, ErrorWithinTheDocumentedBound) {
  Options o;
  o.bf16_wire = 1;
  o.timeout = 60;
  auto g = ProcessGroup::threads(4, o, {0, 0, 1, 1});
  std::mt19937_64 rng{std::random_device{}()};
  for (size_t count : {size_t{7}, size_t{100000}}) {
    std::vector<std::vector<char>> in, out(4);
    for (int r = 0; r < 4; ++r) in.push_back(random_input(count, DType::F32, Op::Sum, rng));
    on_all(g, [&](ProcessGroup& pg, int r) {
      out[static_cast<size_t>(r)] = in[static_cast<size_t>(r)];
      pg.allreduce(out[static_cast<size_t>(r)].data(), count, DType::F32, Op::Sum);
    });
    auto ref = reference(in, count, DType::F32, Op::Sum);
    size_t inexact = 0;
    for (size_t i = 0; i < count; ++i) {
      double abs_sum = 0;
      for (auto& b : in) abs_sum += std::fabs(get(b.data(), i, DType::F32));
      double got = get(out[0].data(), i, DType::F32);
      ASSERT_LE(std::fabs(got - ref[i]), 2 * std::ldexp(1.0, -8) * abs_sum + 1e-6)
          << "element " << i;
      inexact += got != static_cast<float>(ref[i]);
    }
    if (count > 1000) {
      EXPECT_GT(inexact, 0u) << "bf16 on the wire should round something";
    }
    for (int r = 1; r < 4; ++r) {
      ASSERT_EQ(out[0], out[static_cast<size_t>(r)]);
    }
  }
}

}  // namespace

namespace {

// Back-to-back small allreduces let one rank run a round ahead of the other; each round's call
// and data must stay its own (a single call slot once made the slower rank check the faster
// rank's next call and report a mismatch).
// The lanes asked for are there: each rank has a helper thread for every lane beyond the first,
// on one node and across nodes.  The helpers of this process, by name.
size_t lane_helpers() {
  size_t n = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(e.path() / "comm");
    std::string name;
    n += std::getline(f, name) && name.rfind("dc-shm-lane", 0) == 0;
  }
  return n;
}

TEST(ShmLanes, EveryLaneBeyondTheFirstHasAHelperOnEveryRank) {
  struct statvfs v {};
  if (::statvfs("/dev/shm", &v) != 0 ||
      static_cast<double>(v.f_bavail) * v.f_frsize <
          static_cast<double>(v.f_blocks) * v.f_frsize / 2 + (64 << 20))
    GTEST_SKIP() << "/dev/shm has too little room for lanes (they need half of it free)";
  for (auto nodes : {std::vector<int>{}, std::vector<int>{0, 0, 1, 1}}) {
    Options o;
    o.timeout = 60;
    ::setenv("PYTORCH_DC_SHM_THREADS", "3", 1);
    auto g = ProcessGroup::threads(nodes.empty() ? 2 : 4, o, nodes);
    ::unsetenv("PYTORCH_DC_SHM_THREADS");
    EXPECT_EQ(lane_helpers(), nodes.empty() ? 4u : 8u)
        << (nodes.empty() ? "one node, 2 ranks" : "2 nodes of 2 ranks");
    for (auto& pg : g) EXPECT_EQ(pg->shm_lanes(), 3);
    g.clear();
    EXPECT_EQ(lane_helpers(), 0u) << "the helpers end with their group";
  }
  // A node with one rank has no shared memory, so the group has one lane, and the other node
  // makes none that would go unused.
  ::setenv("PYTORCH_DC_SHM_THREADS", "3", 1);
  Options o;
  o.timeout = 60;
  auto g = ProcessGroup::threads(4, o, {0, 0, 0, 1});
  ::unsetenv("PYTORCH_DC_SHM_THREADS");
  EXPECT_EQ(lane_helpers(), 0u) << "nodes of 3 ranks and 1";
  for (int r = 0; r < 4; ++r) EXPECT_EQ(g[static_cast<size_t>(r)]->shm_lanes(), r < 3 ? 1 : 0);
}

// `n` ranks (on `nodes`) with `lanes` lanes; rank 1 calls an allreduce of a single element, the
// others of 16 MiB: every rank raises, well before the timeout.
void one_rank_calls_one_element(int n, const std::vector<int>& nodes, int lanes) {
  Options o;
  o.timeout = 30;
  ::setenv("PYTORCH_DC_SHM_THREADS", std::to_string(lanes).c_str(), 1);
  auto g = ProcessGroup::threads(n, o, nodes);
  ::unsetenv("PYTORCH_DC_SHM_THREADS");
  for (auto& pg : g) ASSERT_EQ(pg->shm_lanes(), lanes);
  auto start = std::chrono::steady_clock::now();
  auto e = errors_of(g, [](ProcessGroup& pg, int r) {
    std::vector<float> v(4 << 20, 1.0f);
    pg.allreduce(v.data(), r == 1 ? 1 : v.size(), DType::F32, Op::Sum);
  });
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 10.0) << "the lanes waited for their timeout (30 s)";
  for (auto& s : e) EXPECT_FALSE(s.empty()) << "every rank must get an error";
}

// A rank whose call has a single element is no owner (it compares no headers); the owner of the
// node raises in lane 0 and only the abort of every lane ends the other ranks' lanes 1 to 3,
// which wait for this rank's contributions, before their timeout.
TEST(ShmLanes, AnErrorInOneLaneEndsTheOthersOnEveryRank) { one_rank_calls_one_element(3, {}, 4); }

// Across nodes (rank 1's call has one lane, the others' 3): its node's owner raises in lane 0;
// its lanes 1 and 2, and the other node's, which wait for rank 1 in shared memory or for the
// first node's owners on their own connections, end too.
TEST(ShmLanes, AnErrorInOneLaneEndsTheOthersAcrossNodes) {
  one_rank_calls_one_element(4, {0, 0, 1, 1}, 3);
}

TEST(ShmRounds, ManySmallAllreducesBackToBack) {
  for (int n : {2, 3}) {
    Options o;
    o.timeout = 60;
    auto g = ProcessGroup::threads(n, o);
    on_all(g, [n](ProcessGroup& pg, int r) {
      for (int i = 0; i < 20000; ++i) {
        int64_t v[2] = {r + i, 1};
        pg.allreduce(v, 2, DType::I64, Op::Sum);
        ASSERT_EQ(v[0], static_cast<int64_t>(n) * i + n * (n - 1) / 2) << "iteration " << i;
        ASSERT_EQ(v[1], n);
      }
    });
  }
}

}  // namespace
