// The facts behind the golden files, asserted one by one.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
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
  if (live->gpus().empty()) {
    EXPECT_THROW(place_ranks(*live, analyse(*live), {1, MapBy::Default, BindTo::Gpu, 1}),
                 TopologyError);
  }
  EXPECT_THROW(parse_map_spec("diagonal"), TopologyError);
  EXPECT_THROW(parse_bind_spec("board"), TopologyError);
  EXPECT_EQ(parse_bind_spec("core").to, BindTo::Core);
  EXPECT_EQ(parse_map_spec("gpu").by, MapBy::Gpu);
}

// ---- Open MPI's mapping on processor objects ----

namespace {

// A synthetic machine as an XML file: its path.
std::string synthetic(const std::string& description, const std::string& name) {
  hwloc_topology_t t;
  hwloc_topology_init(&t);
  hwloc_topology_set_synthetic(t, description.c_str());
  hwloc_topology_load(t);
  std::string path = ::testing::TempDir() + name + ".xml";
  hwloc_topology_export_xml(t, path.c_str(), 0);
  hwloc_topology_destroy(t);
  return path;
}

PlacementOptions opts(int n, const std::string& map, const std::string& bind = "") {
  MapSpec m = parse_map_spec(map);
  PlacementOptions o{n, m.by, BindTo::Default, 1};
  o.ppr = m.ppr, o.ppr_object = m.ppr_object, o.pe = m.pe;
  if (!bind.empty()) {
    BindSpec b = parse_bind_spec(bind);
    o.bind_to = b.to, o.overload = b.overload;
  }
  return o;
}

std::vector<std::string> cpusets(const std::vector<RankPlacement>& p) {
  std::vector<std::string> v;
  for (const auto& r : p) v.push_back(r.cpuset);
  return v;
}

std::string error_of(const Topology& t, const Analysis& a, const PlacementOptions& o) {
  try {
    place_ranks(t, a, o);
  } catch (const TopologyError& e) {
    return e.what();
  }
  return "(no error)";
}

// 2 sockets (a NUMA node each) of 4 cores of 2 hwthreads: PUs 0-7 in socket 0, 8-15 in socket 1, cores {0,1},
// {2,3}, ...
struct TwoSockets : ::testing::Test {
  void SetUp() override {
    t = load_topology(LoadOptions{synthetic("pack:2 numa:1 core:4 pu:2", "two-sockets")});
    a = analyse(*t);
  }
  std::unique_ptr<Topology> t;
  Analysis a;
};

}  // namespace

TEST(MapSpecTest, ParsesOpenMpisSyntax) {
  MapSpec m = parse_map_spec("ppr:4:Socket:PE=2:oversubscribe");
  EXPECT_EQ(m.by, MapBy::Ppr);
  EXPECT_EQ(m.ppr, 4);
  EXPECT_EQ(m.ppr_object, MapBy::Socket);
  EXPECT_EQ(m.pe, 2);
  EXPECT_EQ(m.oversubscribe, std::optional<bool>(true));
  EXPECT_EQ(to_string(m), "ppr:4:socket:PE=2");
  EXPECT_EQ(parse_map_spec("package").by, MapBy::Socket);
  EXPECT_EQ(parse_map_spec("NUMA:nooversubscribe").oversubscribe, std::optional<bool>(false));
  EXPECT_EQ(parse_map_spec("ppr:1:node").ppr_object, MapBy::Node);
  EXPECT_TRUE(parse_map_spec("slot:NOLOCAL").nolocal);  // --nolocal
  EXPECT_FALSE(parse_map_spec("slot").nolocal);
  try {
    parse_map_spec("ppr:100000:node");
    ADD_FAILURE() << "accepted ppr:100000:node";
  } catch (const TopologyError& e) {
    EXPECT_EQ(std::string(e.what()), "--map-by ppr:100000:node: N is 1 to 4096 ranks per node");
  }
  // Open MPI 4's comma-separated modifiers; PE=1 on a core is the core.
  MapSpec c = parse_map_spec("socket:PE=2,OVERSUBSCRIBE");
  EXPECT_EQ(c.pe, 2);
  EXPECT_EQ(c.oversubscribe, std::optional<bool>(true));
  EXPECT_EQ(parse_map_spec("core:PE=1").pe, 1);
  for (const char* bad : {"ppr", "ppr:2", "ppr:-1:core", "core:oversubscribe:nooversubscribe", "ppr:2:board", "ppr:99999:core",
                          "core:PE=2", "hwthread:PE=2", "gpu:PE=2", "socket:PE=1:PE=2", "socket:PE=", "socket:PE=x",
                          "socket:span", "socket:", ":socket", "l2cache"})
    EXPECT_THROW(parse_map_spec(bad), TopologyError) << bad;
  BindSpec b = parse_bind_spec("socket:overload-allowed");
  EXPECT_EQ(b.to, BindTo::Socket);
  EXPECT_TRUE(b.overload);
  EXPECT_FALSE(parse_bind_spec("hwthread:if-supported").overload);
  EXPECT_THROW(parse_bind_spec("core:often"), TopologyError);
}

TEST_F(TwoSockets, CountsItsObjects) {
  EXPECT_EQ(count_objects(*t, MapBy::Node), 1);
  EXPECT_EQ(count_objects(*t, MapBy::Socket), 2);
  EXPECT_EQ(count_objects(*t, MapBy::Core), 8);
  EXPECT_EQ(count_objects(*t, MapBy::HwThread), 16);
}

TEST_F(TwoSockets, MapByCoreTakesCoresInOrderAndBindsToThem) {
  auto p = place_ranks(*t, a, opts(3, "core"));
  EXPECT_EQ(cpusets(p), (std::vector<std::string>{"0-1", "2-3", "4-5"}));
  EXPECT_EQ(p[2].pu, 4);
  // More ranks than cores: mapped in turn and unbound, as mpirun; bound, a core takes as many
  // ranks as it has hardware threads (2 here), more are refused unless overload is allowed.
  auto q = place_ranks(*t, a, opts(9, "core"));
  EXPECT_EQ(q[8].cpuset, "");
  EXPECT_EQ(place_ranks(*t, a, opts(9, "core", "core"))[8].cpuset, "0-1");
  EXPECT_EQ(error_of(*t, a, opts(17, "core", "core")),
            "--bind-to core: more ranks than the 1 core(s) of core 0 hold, one per processor "
            "(processors 0-1) on " + t->source() +
                ": use --bind-to core:overload-allowed, none or numa, or fewer ranks");
  auto r = place_ranks(*t, a, opts(17, "core", "core:overload-allowed"));
  EXPECT_EQ(r[16].cpuset, "0-1");
  // hwthreads, and widening a core to its socket.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(3, "hwthread"))),
            (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(2, "core", "socket"))),
            (std::vector<std::string>{"0-7", "0-7"}));
}

TEST_F(TwoSockets, MapBySocketDealsRanksRoundRobin) {
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(3, "socket"))),
            (std::vector<std::string>{"0-7", "8-15", "0-7"}));
  // --bind-to core: the next free core of the rank's socket.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(4, "socket", "core"))),
            (std::vector<std::string>{"0-1", "8-9", "2-3", "10-11"}));
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(3, "socket", "hwthread"))),
            (std::vector<std::string>{"0", "8", "1"}));
  EXPECT_EQ(error_of(*t, a, opts(18, "socket", "core")).substr(0, 56),
            "--bind-to core: more ranks than the 4 core(s) of socket ");
  // --bind-to numa (or l3cache) inside a wider place: the next NUMA node of it in turn.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(3, "socket", "none"))),
            (std::vector<std::string>{"", "", ""}));
}

TEST_F(TwoSockets, PprFillsEachObjectWithItsRanksCores) {
  // ppr:2:socket:PE=2: ranks 0, 1 on socket 0 with cores 0-1 and 2-3, ranks 2, 3 on socket 1.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(4, "ppr:2:socket:PE=2"))),
            (std::vector<std::string>{"0-3", "4-7", "8-11", "12-15"}));
  // Without PE: bound to the object.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(3, "ppr:2:socket"))),
            (std::vector<std::string>{"0-7", "0-7", "8-15"}));
  EXPECT_EQ(place_ranks(*t, a, opts(2, "ppr:2:node"))[1].cpuset, "");  // node: no binding
  EXPECT_EQ(error_of(*t, a, opts(2, "ppr:1:node")),
            "--map-by ppr:1:node: 2 ranks need 2 nodes; " + t->source() + " has 1");
  EXPECT_EQ(error_of(*t, a, opts(5, "ppr:2:socket")),
            "--map-by ppr:2:socket: 5 ranks need 3 sockets; " + t->source() + " has 2");
  // PE beyond the object's cores.
  EXPECT_EQ(error_of(*t, a, opts(4, "ppr:2:socket:PE=3")),
            "--map-by ppr:2:socket:PE=3: 2 ranks of 3 cores need 6 on socket 0, which has 4 "
            "(processors 0-7) on " + t->source() + ": use fewer ranks or a smaller PE");
  // PE=n binds to its cores: a wider --bind-to contradicts it, as mpirun says.
  EXPECT_NE(error_of(*t, a, opts(2, "slot:PE=2", "socket")).find("contradicts it"),
            std::string::npos);
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(2, "slot:PE=3"))),
            (std::vector<std::string>{"0-5", "6-11"}));  // across the sockets, as slots go
  EXPECT_NE(error_of(*t, a, opts(3, "slot:PE=3")).find("3 ranks of 3 cores need 9 on the machine"),
            std::string::npos);
}

TEST_F(TwoSockets, RankfileSlotListsAreLogicalSocketsAndCores) {
  PlacementOptions o = opts(5, "slot");
  // Socket 1's cores 0-2; socket 0's cores 0 and 1; the machine's cores 1 and 2; every core of
  // either socket, then socket 1 whole and socket 0's core 3; anywhere.
  o.places = {"1:0-2", "0:0,1", "1-2", "*:0;1:*", ""};
  auto p = place_ranks(*t, a, o);
  EXPECT_EQ(cpusets(p), (std::vector<std::string>{"8-13", "0-3", "2-5", "0-1,8-15", ""}));
  EXPECT_EQ(p[4].os_cpus, std::vector<int>{});  // no slot=: unbound
  o.hwthread_cpus = true;  // --use-hwthread-cpus: hardware threads for cores
  EXPECT_EQ(cpusets(place_ranks(*t, a, o)),
            (std::vector<std::string>{"8-10", "0-1", "1-2", "0,8-15", ""}));
  // --bind-to none: placed (GPUs near the place), unbound.
  o.bind_to = BindTo::None;
  EXPECT_EQ(cpusets(place_ranks(*t, a, o)), (std::vector<std::string>{"", "", "", "", ""}));
  PlacementOptions bad = opts(1, "slot");
  bad.places = {"2:0"};
  EXPECT_NE(error_of(*t, a, bad).find("--rankfile, local rank 0 of this node: slot=2:0: " +
                                      t->source() + " has 2 socket(s), numbered from 0; no socket 2"),
            std::string::npos);
  bad.places = {"0:4"};
  EXPECT_NE(error_of(*t, a, bad).find("socket 0 of " + t->source() +
                                      " has 4 cores, numbered from 0; no core 4"),
            std::string::npos);
  bad.places = {"0", "1"};  // two places for one rank
  EXPECT_NE(error_of(*t, a, bad).find("places 2 rank(s) here, not 1"), std::string::npos);
}

TEST_F(TwoSockets, CpuSetKeepsItsProcessorsOnly) {
  // --cpu-set 1:1-2;0:3: socket 1's cores 1 and 2, socket 0's core 3.
  restrict_to(*t, "1:1-2;0:3", false);
  a = analyse(*t);
  EXPECT_EQ(t->pu_count(), 6);
  EXPECT_EQ(count_objects(*t, MapBy::Core), 3);
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(3, "core"))),
            (std::vector<std::string>{"6-7", "10-11", "12-13"}));
  // A rank the mapping leaves unbound is bound to the set.
  PlacementOptions o = opts(2, "slot");
  o.confine = true;
  EXPECT_EQ(cpusets(place_ranks(*t, a, o)), (std::vector<std::string>{"6-7,10-13", "6-7,10-13"}));
  o.bind_to = BindTo::None;  // unless --bind-to none
  EXPECT_EQ(cpusets(place_ranks(*t, a, o)), (std::vector<std::string>{"", ""}));
}

TEST_F(TwoSockets, CpuSetLeavesNoEmptyNumaNodesOrSockets) {
  // Socket 0 alone: socket 1's NUMA node, with memory but no processor left, is no domain.
  restrict_to(*t, "0:*", false);
  a = analyse(*t);
  EXPECT_EQ(t->numa_count(), 1);
  EXPECT_EQ(a.domains.size(), 1u);
  EXPECT_EQ(count_objects(*t, MapBy::Socket), 1);
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(2, "numa"))), (std::vector<std::string>{"0-7", "0-7"}));
}

TEST_F(TwoSockets, CpuSetNamesWhatTheMachineLacks) {
  try {
    restrict_to(*t, "0:4", false);
    ADD_FAILURE() << "accepted core 4 of socket 0";
  } catch (const TopologyError& e) {
    EXPECT_NE(std::string(e.what()).find("--cpu-set 0:4: socket 0 of "), std::string::npos)
        << e.what();
  }
  restrict_to(*t, "15", true);  // hardware thread 15 alone
  EXPECT_EQ(t->pu_count(), 1);
}

TEST_F(TwoSockets, CpuListBindsEveryRankOrOneEach) {
  PlacementOptions o = opts(3, "slot");
  o.cpu_list = "0,4";
  EXPECT_EQ(cpusets(place_ranks(*t, a, o)),
            (std::vector<std::string>{"0-1,8-9", "0-1,8-9", "0-1,8-9"}));
  o.cpu_list_ordered = true;  // --bind-to cpu-list:ordered
  o.nranks = 2;
  EXPECT_EQ(cpusets(place_ranks(*t, a, o)), (std::vector<std::string>{"0-1", "8-9"}));
  o.nranks = 3;
  EXPECT_NE(error_of(*t, a, o).find("3 ranks here, 2 processors in the list"), std::string::npos);
  EXPECT_EQ(expand_slot_list("1:0-1,3;2;*:0;0:*"),
            (std::vector<std::string>{"1:0", "1:1", "1:3", "2", "*:0", "0:*"}));
}

TEST(SlotListTest, ParsesOpenMpisLogicalForm) {
  auto l = parse_slot_list("1:0-2;*:3;4,6-7;0:*");
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0].socket, 1);
  EXPECT_EQ(l[0].cores, (std::vector<std::pair<int, int>>{{0, 2}}));
  EXPECT_EQ(l[1].socket, -2);
  EXPECT_EQ(l[2].socket, -1);
  EXPECT_EQ(l[2].cores, (std::vector<std::pair<int, int>>{{4, 4}, {6, 7}}));
  EXPECT_TRUE(l[3].cores.empty());
  for (const char* bad : {"", "x", "1:", "1:2:3", "3-1", "-1", "a:1", "1;;2", "99999999"}) {
    try {
      parse_slot_list(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const TopologyError& e) {
      EXPECT_NE(std::string(e.what()).find("slot=" + std::string(bad) + ": "), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(TwoSockets, PeCountsHardwareThreadsWhenAsked) {
  PlacementOptions o = opts(3, "slot:PE=3");
  o.hwthread_cpus = true;  // --use-hwthread-cpus
  EXPECT_EQ(cpusets(place_ranks(*t, a, o)), (std::vector<std::string>{"0-2", "3-5", "6-8"}));
  o = opts(3, "ppr:3:socket:PE=3");
  o.hwthread_cpus = true;
  EXPECT_NE(error_of(*t, a, o).find("3 ranks of 3 hwthreads need 9 on socket 0, which has 8"),
            std::string::npos)
      << error_of(*t, a, o);
}

TEST_F(TwoSockets, PeOnNumaAndSocketsDealsAndStacks) {
  // numa:PE=2 (mpirun's -c 2): NUMA nodes in turn, the next two cores of each.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(4, "numa:PE=2"))),
            (std::vector<std::string>{"0-3", "8-11", "4-7", "12-15"}));
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(2, "socket:PE=1", "hwthread"))),
            (std::vector<std::string>{"0-1", "8-9"}));
}

TEST(ProcessorMappingTest, RanksShareTheGpusOfTheirSocketEvenly) {
  // xe8640: 2 sockets of 4 NUMA nodes (SNC), GPUs 0, 1 near socket 0 and 2, 3 near socket 1.
  auto l = load("xe8640-4xH100-4xmlx5");
  auto p = place_ranks(*l.t, l.a, opts(8, "ppr:4:socket:PE=8"));
  std::map<int, int> per_gpu;
  hwloc_obj_t s0 = hwloc_get_obj_by_type(l.t->raw(), HWLOC_OBJ_PACKAGE, 0);
  for (const auto& r : p) {
    ASSERT_EQ(r.gpus.size(), 1u);
    ++per_gpu[r.gpus[0]];
    // Each rank's GPU is near its own socket.
    const auto& g = *std::find_if(l.t->gpus().begin(), l.t->gpus().end(),
                                  [&r](const Gpu& x) { return x.index == r.gpus[0]; });
    hwloc_bitmap_t near = hwloc_bitmap_alloc();
    hwloc_bitmap_list_sscanf(near, g.cpuset.c_str());
    EXPECT_EQ(hwloc_bitmap_isset(s0->cpuset, static_cast<unsigned>(r.pu)),
              hwloc_bitmap_intersects(near, s0->cpuset))
        << "rank " << r.local_rank;
    hwloc_bitmap_free(near);
    EXPECT_EQ(r.os_cpus.size(), 16u);  // 8 cores of 2 hwthreads
  }
  EXPECT_EQ(per_gpu, (std::map<int, int>{{0, 2}, {1, 2}, {2, 2}, {3, 2}}));
  // NUMA nodes without processors are no places: ppr:1:numa counts the 8 with cores.
  EXPECT_EQ(count_objects(*l.t, MapBy::Numa), 8);
}

TEST(ProcessorMappingTest, RanksOfTheWholeMachineShareAllItsGpus) {
  // ppr:4:node: each place is the machine, so no socket is nearer: the 4 GPUs one each.
  auto l = load("xe8640-4xH100-4xmlx5");
  std::set<int> gpus;
  for (const auto& r : place_ranks(*l.t, l.a, opts(4, "ppr:4:node"))) gpus.insert(r.gpus.at(0));
  EXPECT_EQ(gpus.size(), 4u);
}

TEST_F(TwoSockets, BindingToCoresOfSmallerPlacesCountsThem) {
  // hwthreads 0 and 1 are one core of 2 hwthreads: two ranks there are no overload (mpirun's
  // rule), a third is.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(2, "hwthread", "core"))),
            (std::vector<std::string>{"0-1", "0-1"}));
  EXPECT_EQ(error_of(*t, a, opts(17, "hwthread", "core")),
            "--bind-to core: more ranks than the 1 core(s) of hwthread 0 hold, one per processor "
            "(processors 0-1) on " + t->source() +
                ": use --bind-to core:overload-allowed, none or numa, or fewer ranks");
  EXPECT_EQ(place_ranks(*t, a, opts(17, "hwthread", "core:overload-allowed"))[16].cpuset, "0-1");
  // ppr:3:core: 3 ranks on a core of 2 hwthreads.
  EXPECT_NE(error_of(*t, a, opts(3, "ppr:3:core", "core")).find("more ranks than the 1 core(s)"),
            std::string::npos);
  EXPECT_EQ(place_ranks(*t, a, opts(4, "ppr:2:core"))[0].cpuset, "");  // unbound, as mpirun
  // PE cores shared in turn when overload is allowed.
  EXPECT_EQ(cpusets(place_ranks(*t, a, opts(3, "ppr:3:socket:PE=2", "core:overload-allowed"))),
            (std::vector<std::string>{"0-3", "4-7", "0-3"}));
  // --rank-by core follows the bound core.
  auto p = place_ranks(*t, a, opts(4, "socket", "core"));
  EXPECT_EQ(p[1].pu, 8);
  EXPECT_EQ(p[2].pu, 2);
}

TEST(ProcessorMappingTest, RankByObjectsRenumbersByThePlace) {
  auto l = load("relion-x1904gt-2xP100-mlx5");
  auto p = place_ranks(*l.t, l.a, opts(4, "core"));
  for (size_t i = 1; i < p.size(); ++i) EXPECT_LT(p[i - 1].pu, p[i].pu);
  EXPECT_EQ(count_objects(*l.t, MapBy::Socket), 2);
  EXPECT_EQ(count_objects(*l.t, MapBy::Core), 36);
}
