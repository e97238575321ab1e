// The facts behind the golden files, asserted one by one.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <hwloc.h>

#include "fixtures.hpp"
#include "topology/placement.hpp"

using namespace pe::topo;

namespace {

std::vector<int> gpu_of(const std::vector<RankPlacement>& p) {
  std::vector<int> v;
  for (const auto& r : p) v.push_back(r.gpus.empty() ? -1 : r.gpus.front());
  return v;
}

// A machine of two NUMA nodes of 4 and 2 cores (hwloc's synthetic one, restricted), as an XML
// file: its path.
std::string uneven_machine() {
  hwloc_topology_t t;
  hwloc_topology_init(&t);
  hwloc_topology_set_synthetic(t, "numa:2 core:4 pu:1");
  hwloc_topology_load(t);
  hwloc_bitmap_t keep = hwloc_bitmap_alloc();
  hwloc_bitmap_list_sscanf(keep, "0-5");
  hwloc_topology_restrict(t, keep, 0);
  hwloc_bitmap_free(keep);
  std::string path = ::testing::TempDir() + "uneven-numa.xml";
  hwloc_topology_export_xml(t, path.c_str(), 0);
  hwloc_topology_destroy(t);
  return path;
}

}  // namespace

TEST(PlacementTest, BindingToCoresFillsUnevenDomainsByTheirCores) {
  auto t = load_topology(LoadOptions{uneven_machine()});
  auto a = analyse(*t);
  ASSERT_EQ(a.domains.size(), 2u);
  // 6 ranks on 4 + 2 cores: 4 and 2 (an even split, 3 and 3, did not fit the second).
  auto p = place_ranks(*t, a, {6, MapBy::Default, BindTo::Core, 1});
  std::vector<int> domains;
  std::set<std::string> cores;
  for (const auto& r : p) {
    domains.push_back(r.domain);
    cores.insert(r.cpuset);
  }
  EXPECT_EQ(domains, (std::vector<int>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(cores.size(), 6u);
  // Fewer ranks: shares of the cores too (2 of 3 ranks where 4 of 6 cores are).
  auto q = place_ranks(*t, a, {3, MapBy::Default, BindTo::None, 1});
  EXPECT_EQ(q[0].domain, 0);
  EXPECT_EQ(q[1].domain, 0);
  EXPECT_EQ(q[2].domain, 1);
}

TEST(PathTest, Dgx2IsOneNvSwitchIslandWithSixLinksPerPair) {
  auto l = load("dgx2-16xV100-nvswitch");
  ASSERT_EQ(l.a.domains.size(), 1u);
  EXPECT_EQ(l.a.domains[0].kind, "nvlink");
  EXPECT_EQ(l.a.domains[0].gpus.size(), 16u);
  EXPECT_EQ(gpu_path(*l.t, l.a.nvlinks, 0, 15).str(), "NV6");
  EXPECT_EQ(gpu_path(*l.t, l.a.nvlinks, 3, 3).str(), "X");
}

TEST(PathTest, Power8HasTwoNvLinkPairs) {
  auto l = load("power8-4xP100-nvlink");
  ASSERT_EQ(l.a.domains.size(), 2u);
  EXPECT_EQ(l.a.domains[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(l.a.domains[1].gpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(gpu_path(*l.t, l.a.nvlinks, 0, 1).str(), "NV2");  // 2 x 20 GB/s P100 links
  EXPECT_EQ(gpu_path(*l.t, l.a.nvlinks, 1, 2).str(), "SYS");
}

TEST(PathTest, LassenGpusPairUpBehindSwitchesAndReachTheirSocketsNics) {
  auto l = load("lassen-ac922-4xV100-4xmlx5");
  EXPECT_EQ(gpu_path(*l.t, l.a.nvlinks, 0, 1).str(), "PIX");
  EXPECT_EQ(gpu_path(*l.t, l.a.nvlinks, 0, 2).str(), "SYS");
  ASSERT_EQ(l.a.domains.size(), 2u);
  EXPECT_EQ(nic_names(*l.t, l.a.domains[0].nics),
            (std::vector<std::string>{"mlx5_0", "mlx5_1"}));  // RDMA before Ethernet
  EXPECT_EQ(nic_names(*l.t, l.a.domains[1].nics), (std::vector<std::string>{"mlx5_2", "mlx5_3"}));
  EXPECT_EQ(l.a.domains[0].nic_path, "NODE");
}

TEST(PathTest, RelionGpusAndNicShareOneSwitch) {
  auto l = load("relion-x1904gt-2xP100-mlx5");
  EXPECT_EQ(gpu_path(*l.t, l.a.nvlinks, 0, 1).str(), "PIX");
  EXPECT_EQ(pci_path(*l.t, l.t->gpus()[0].obj, l.t->nics()[0].obj).str(), "PIX");
  ASSERT_EQ(l.a.domains.size(), 1u);
  EXPECT_EQ(l.a.domains[0].kind, "root-complex");
  EXPECT_EQ(l.a.domains[0].cpuset, "0-17,36-53");
}

TEST(PlacementTest, RanksFollowDomainsAndBindNearTheirGpu) {
  auto l = load("power8-4xP100-nvlink");
  auto p = place_ranks(*l.t, l.a, {4, MapBy::Default, BindTo::Default, 1});
  EXPECT_EQ(gpu_of(p), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(p[0].cpuset, l.a.domains[0].cpuset);
  EXPECT_EQ(p[3].cpuset, l.a.domains[1].cpuset);
  auto numa = place_ranks(*l.t, l.a, {4, MapBy::Numa, BindTo::Default, 1});
  EXPECT_EQ(gpu_of(numa), (std::vector<int>{0, 2, 1, 3}));
}

TEST(PlacementTest, MoreRanksThanGpusKeepConsecutiveRanksTogether) {
  auto l = load("relion-x1904gt-2xP100-mlx5");
  auto p = place_ranks(*l.t, l.a, {5, MapBy::Default, BindTo::Core, 1});
  EXPECT_EQ(gpu_of(p), (std::vector<int>{0, 0, 0, 1, 1}));
  // One core each, all different, all near the GPUs.
  std::set<std::string> cores;
  for (const auto& r : p) {
    EXPECT_EQ(r.os_cpus.size(), 2u);  // a core with two hardware threads
    cores.insert(r.cpuset);
  }
  EXPECT_EQ(cores.size(), 5u);
  EXPECT_EQ(p[0].nics, (std::vector<std::string>{"mlx5_0"}));
}

TEST(PlacementTest, GpusPerRankTakesNeighbours) {
  auto l = load("dgx2-16xV100-nvswitch");
  auto p = place_ranks(*l.t, l.a, {8, MapBy::Default, BindTo::None, 2});
  ASSERT_EQ(p.size(), 8u);
  EXPECT_EQ(p[3].gpus, (std::vector<int>{6, 7}));
  EXPECT_TRUE(p[3].cpuset.empty());
  // One NVLink island over two sockets: each rank still binds next to its own GPU.
  auto b = place_ranks(*l.t, l.a, {16, MapBy::Default, BindTo::Default, 1});
  EXPECT_EQ(b[0].cpuset, "0-1");
  EXPECT_EQ(b[15].cpuset, "24-25");
}

TEST(PlacementTest, NoGpusMeansNumaDomainsAndNoBindingByDefault) {
  auto t = load_topology(LoadOptions{});
  auto a = analyse(*t);
  ASSERT_GE(a.domains.size(), 1u);
  auto p = place_ranks(*t, a, {3, MapBy::Default, BindTo::Default, 1});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_TRUE(p[0].gpus.empty());
  EXPECT_TRUE(p[0].cpuset.empty());
  auto c = place_ranks(*t, a, {1, MapBy::Default, BindTo::Core, 1});
  EXPECT_FALSE(c[0].os_cpus.empty());
  // More ranks than cores to bind them to: refused, as mpirun does, not two ranks on one core.
  int cores = hwloc_get_nbobjs_by_type(t->raw(), HWLOC_OBJ_CORE);
  try {
    place_ranks(*t, a, {cores + 1, MapBy::Default, BindTo::Core, 1});
    ADD_FAILURE() << "no error for " << cores + 1 << " ranks on " << cores << " cores";
  } catch (const TopologyError& e) {
    EXPECT_NE(std::string(e.what()).find("--bind-to core: more ranks than the"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(format_topology(*t, a).empty());
}

TEST(PlacementTest, ImpossibleRequestsAreClearErrors) {
  auto l = load("relion-x1904gt-2xP100-mlx5");
  EXPECT_THROW(place_ranks(*l.t, l.a, {2, MapBy::Default, BindTo::Default, 3}), TopologyError);
  EXPECT_THROW(place_ranks(*l.t, l.a, {2, MapBy::Default, BindTo::Default, 0}), TopologyError);
  auto live = load_topology(LoadOptions{});
  if (live->gpus().empty())
    EXPECT_THROW(place_ranks(*live, analyse(*live), {1, MapBy::Default, BindTo::Gpu, 1}),
                 TopologyError);
  try {
    parse_map_by("diagonal");
    FAIL();
  } catch (const TopologyError& e) {
    EXPECT_STREQ(e.what(), "--map-by: expected slot, node, numa, gpu or domain, got 'diagonal'");
  }
  EXPECT_THROW(parse_bind_to("socket"), TopologyError);
  EXPECT_EQ(parse_bind_to("core"), BindTo::Core);
  EXPECT_EQ(parse_map_by("gpu"), MapBy::Gpu);
}
