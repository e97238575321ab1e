// Rail-aligned NICs and the plan of the GPU levels, on the real machines of tests/fixtures/hwloc,
// alone and combined into multi-node jobs.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "fixtures.hpp"
#include "topology/gpu_levels.hpp"

using namespace pe::topo;

namespace {

using Names = std::vector<std::string>;
using Ints = std::vector<int>;

std::vector<RankPlacement> place(const Loaded& l, int n, int gpus_per_rank = 1) {
  PlacementOptions o;
  o.nranks = n;
  o.gpus_per_rank = gpus_per_rank;
  return place_ranks(*l.t, l.a, o);
}

// A job of `counts[k]` ranks on machines[k], ranks numbered node by node.
GpuPlan plan(const std::vector<const Loaded*>& machines, const Ints& counts) {
  std::vector<NodeRanks> nodes;
  int next = 0;
  for (size_t k = 0; k < machines.size(); ++k) {
    NodeRanks n{machines[k]->t.get(), &machines[k]->a, {}, place(*machines[k], counts[k])};
    for (int i = 0; i < counts[k]; ++i) n.ranks.push_back(next++);
    nodes.push_back(std::move(n));
  }
  return plan_gpu_levels(nodes);
}

std::vector<const Ring*> level(const GpuPlan& p, int lv) {
  std::vector<const Ring*> v;
  for (const auto& r : p.rings)
    if (r.level == lv) v.push_back(&r);
  return v;
}

}  // namespace

// The case of issue 18: four H100s of one NVLink island, each behind its own PCIe switch.  The
// island's domain has all four mlx5 (SYS from some GPU); each rank gets the one beside its GPU.
TEST(RailNics, Xe8640RanksGetTheNicBesideTheirGpu) {
  auto l = load("xe8640-4xH100-4xmlx5");
  ASSERT_EQ(l.a.domains.size(), 1u);
  EXPECT_EQ(l.a.domains[0].kind, "nvlink");
  EXPECT_EQ(nic_names(*l.t, l.a.domains[0].nics), (Names{"mlx5_2", "mlx5_0", "mlx5_1", "mlx5_3"}));
  auto p = place(l, 4);
  EXPECT_EQ(p[0].nics, (Names{"mlx5_0", "mlx5_1"}));  // both ports of the card beside GPU 0
  EXPECT_EQ(p[1].nics, Names{"mlx5_2"});
  EXPECT_EQ(p[3].nics, Names{"mlx5_3"});
  for (int i : {0, 1, 3}) EXPECT_EQ(p[static_cast<size_t>(i)].nic_path, "PIX") << i;
  // GPU 2 has no NIC behind its switch: every mlx5 is SYS, mlx5_3 in its own package.
  EXPECT_EQ(p[2].nics, Names{"mlx5_3"});
  EXPECT_EQ(p[2].nic_path, "SYS");
}

TEST(RailNics, EachGpuOfLassenGetsOneOfItsTwoEquallyNearNics) {
  auto l = load("lassen-ac922-4xV100-4xmlx5");
  auto p = place(l, 4);
  // GPU 0 and 1 find mlx5_0 and mlx5_1 equally near (NODE; the Ethernet ports at NODE too come
  // after them; mlx5_2/3 are SYS): one each.  Likewise GPUs 2 and 3 with mlx5_2 and mlx5_3.
  EXPECT_EQ(p[0].nics, Names{"mlx5_0"});
  EXPECT_EQ(p[1].nics, Names{"mlx5_1"});
  EXPECT_EQ(p[2].nics, Names{"mlx5_2"});
  EXPECT_EQ(p[3].nics, Names{"mlx5_3"});
  for (const auto& r : p) EXPECT_EQ(r.nic_path, "NODE");
  EXPECT_EQ(describe_placement(p[1]), "GPU 1, domain 0, NIC mlx5_1 (NODE), cpus 8-87");
}

TEST(RailNics, RanksOnOneGpuShareItsNic) {
  auto p = place(load("lassen-ac922-4xV100-4xmlx5"), 8);
  Names want = {"mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"};
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i].nics, Names{want[i]}) << "rank " << i;
}

TEST(RailNics, ARankOnTwoGpusGetsBothTheirNics) {
  auto p = place(load("lassen-ac922-4xV100-4xmlx5"), 2, 2);
  EXPECT_EQ(p[0].nics, (Names{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(p[1].nics, (Names{"mlx5_2", "mlx5_3"}));
}

TEST(RailNics, OneNicIsSharedByEveryGpuThatHasItNearest) {
  auto p = place(load("relion-x1904gt-2xP100-mlx5"), 2);
  EXPECT_EQ(p[0].nics, Names{"mlx5_0"});
  EXPECT_EQ(p[1].nics, Names{"mlx5_0"});
  EXPECT_EQ(p[0].nic_path, "PIX");
}

TEST(RailNics, NoNicsNoneGiven) {
  auto p = place(load("dgx2-16xV100-nvswitch"), 16);
  for (const auto& r : p) EXPECT_TRUE(r.nics.empty());
  EXPECT_NE(describe_placement(p[0]).find(", NIC none, "), std::string::npos);
}

TEST(GpuLevels, OneIslandOnOneNodeIsOneNcclCommunicator) {
  auto l = load("dgx2-16xV100-nvswitch");
  GpuPlan p = plan({&l}, {16});
  ASSERT_TRUE(p.gpus);
  EXPECT_TRUE(p.flat);
  ASSERT_EQ(p.rings.size(), 1u);
  EXPECT_EQ(p.rings[0].engine, "nccl");
  EXPECT_EQ(p.rings[0].ranks.size(), 16u);
  EXPECT_EQ(format_gpu_plan(p),
            "GPU levels: one NCCL communicator of all 16 ranks (one node, one locality domain)\n");
}

TEST(GpuLevels, RanksSharingAGpuUseSharedMemoryNotNccl) {
  auto l = load("relion-x1904gt-2xP100-mlx5");
  GpuPlan p = plan({&l}, {4});
  ASSERT_TRUE(p.flat);
  EXPECT_EQ(p.rings[0].engine, "shm");
}

TEST(GpuLevels, LassenHasNcclInsideEachSocketAndSharedMemoryAcross) {
  auto l = load("lassen-ac922-4xV100-4xmlx5");
  GpuPlan p = plan({&l}, {4});
  EXPECT_FALSE(p.flat);
  EXPECT_EQ(p.shards, 0);
  auto l1 = level(p, 1), l2 = level(p, 2);
  ASSERT_EQ(l1.size(), 2u);
  EXPECT_EQ(l1[0]->ranks, (Ints{0, 1}));
  EXPECT_EQ(l1[1]->ranks, (Ints{2, 3}));
  EXPECT_EQ(l1[0]->engine, "nccl");
  ASSERT_EQ(l2.size(), 2u);  // rail 0: the first GPU of each socket; rail 1: the second
  EXPECT_EQ(l2[0]->ranks, (Ints{0, 2}));
  EXPECT_EQ(l2[1]->ranks, (Ints{1, 3}));
  EXPECT_EQ(l2[0]->engine, "shm");  // GPU 0 to GPU 2 is SYS
  EXPECT_TRUE(level(p, 3).empty());
}

TEST(GpuLevels, Power8NvlinkIslandsAreTheDomains) {
  auto l = load("power8-4xP100-nvlink");
  GpuPlan p = plan({&l}, {4});
  auto l1 = level(p, 1);
  ASSERT_EQ(l1.size(), 2u);
  EXPECT_EQ(l1[0]->ranks, (Ints{0, 1}));
  EXPECT_EQ(level(p, 2).size(), 2u);
}

TEST(GpuLevels, TwoLassenNodesGiveEveryRankAShardOverItsOwnNic) {
  auto l = load("lassen-ac922-4xV100-4xmlx5");
  GpuPlan p = plan({&l, &l}, {4, 4});
  EXPECT_EQ(p.shards, 4);
  auto l3 = level(p, 3);
  ASSERT_EQ(l3.size(), 4u);
  // Shard s: rail s / 2 of domain s % 2.
  EXPECT_EQ(l3[0]->ranks, (Ints{0, 4}));
  EXPECT_EQ(l3[1]->ranks, (Ints{2, 6}));
  EXPECT_EQ(l3[2]->ranks, (Ints{1, 5}));
  EXPECT_EQ(l3[3]->ranks, (Ints{3, 7}));
  EXPECT_EQ(l3[1]->nics, (Names{"mlx5_2", "mlx5_2"}));
  EXPECT_EQ(p.shard_of, (Ints{0, 2, 1, 3, 0, 2, 1, 3}));
  EXPECT_EQ(level(p, 1).size(), 4u);
  EXPECT_EQ(level(p, 2).size(), 4u);
}

TEST(GpuLevels, TwoXe8640NodesAreOneNcclLevelAndFourRailAlignedShards) {
  auto l = load("xe8640-4xH100-4xmlx5");
  GpuPlan p = plan({&l, &l}, {4, 4});
  auto l1 = level(p, 1);
  ASSERT_EQ(l1.size(), 2u);
  EXPECT_EQ(l1[1]->ranks, (Ints{4, 5, 6, 7}));
  EXPECT_EQ(l1[1]->engine, "nccl");
  EXPECT_TRUE(level(p, 2).empty());
  auto l3 = level(p, 3);
  ASSERT_EQ(l3.size(), 4u);
  EXPECT_EQ(l3[1]->ranks, (Ints{1, 5}));
  EXPECT_EQ(l3[0]->nics, (Names{"mlx5_0,mlx5_1", "mlx5_0,mlx5_1"}));
  EXPECT_EQ(l3[2]->nics, (Names{"mlx5_3", "mlx5_3"}));
}

TEST(GpuLevels, UnequalNodesCutAsManyShardsAsTheSmallestHas) {
  auto lassen = load("lassen-ac922-4xV100-4xmlx5");
  auto relion = load("relion-x1904gt-2xP100-mlx5");
  GpuPlan p = plan({&lassen, &relion}, {4, 2});
  EXPECT_EQ(p.shards, 2);
  auto l3 = level(p, 3);
  ASSERT_EQ(l3.size(), 2u);
  EXPECT_EQ(l3[0]->ranks, (Ints{0, 4}));
  EXPECT_EQ(l3[1]->ranks, (Ints{2, 5}));
  EXPECT_EQ(p.shard_of, (Ints{0, -1, 1, -1, 0, 1}));
}

TEST(GpuLevels, OneGpuSharedByTwoSimulatedNodesIsOneCrossNodeRing) {
  auto l = load("supermicro-x9drg-k40m-mlx5");
  GpuPlan p = plan({&l, &l}, {1, 1});
  ASSERT_EQ(p.rings.size(), 1u);
  EXPECT_EQ(p.rings[0].level, 3);
  EXPECT_EQ(p.rings[0].engine, "net");
  EXPECT_EQ(p.rings[0].ranks, (Ints{0, 1}));
  EXPECT_EQ(p.rings[0].nics, (Names{"mlx5_0", "mlx5_0"}));
}

TEST(GpuLevels, RanksWithoutGpusHaveNoPlan) {
  auto l = load("relion-x1904gt-2xP100-mlx5");
  NodeRanks n{l.t.get(), &l.a, {0}, {RankPlacement{}}};
  GpuPlan p = plan_gpu_levels({n});
  EXPECT_FALSE(p.gpus);
  EXPECT_EQ(format_gpu_plan(p), "GPU levels: none (ranks without GPUs: the host path)\n");
}

// Whatever the machines: level 1 partitions each node's ranks by domain, a rank is on at most one
// level-2 ring and owns at most one shard, and every shard has one owner on every node.
TEST(GpuLevels, InvariantsOnEveryFixturePair) {
  const char* names[] = {"dgx2-16xV100-nvswitch",      "power8-4xP100-nvlink",
                         "lassen-ac922-4xV100-4xmlx5", "relion-x1904gt-2xP100-mlx5",
                         "supermicro-x9drg-k40m-mlx5", "xe8640-4xH100-4xmlx5"};
  std::vector<Loaded> ls;
  for (const char* n : names) ls.push_back(load(n));
  for (const auto& a : ls)
    for (const auto& b : ls) {
      Ints counts = {static_cast<int>(a.t->gpus().size()), static_cast<int>(b.t->gpus().size())};
      GpuPlan p = plan({&a, &b}, counts);
      SCOPED_TRACE(a.t->source() + " + " + b.t->source());
      std::map<int, int> in_l2;
      for (const Ring* r : level(p, 2))
        for (int x : r->ranks) EXPECT_EQ(in_l2[x]++, 0) << "rank " << x;
      auto l3 = level(p, 3);
      EXPECT_EQ(static_cast<int>(l3.size()), p.shards);
      EXPECT_GE(p.shards, 1);
      std::set<int> owners;
      for (const Ring* r : l3) {
        ASSERT_EQ(r->ranks.size(), 2u);
        EXPECT_LT(r->ranks[0], counts[0]);
        EXPECT_GE(r->ranks[1], counts[0]);
        for (int x : r->ranks) EXPECT_TRUE(owners.insert(x).second) << "rank " << x;
      }
    }
}
