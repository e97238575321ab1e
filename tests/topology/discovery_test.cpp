// Discovery over real machines' hwloc exports (tests/fixtures/hwloc, see its README).  The
// expected values were read off `lstopo-no-graphics --input FILE` and the fixtures' README.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include "topology/topology.hpp"

using pe::topo::load_topology;
using pe::topo::LoadOptions;
using pe::topo::Topology;

namespace {

std::unique_ptr<Topology> fixture(const std::string& name) {
  return load_topology(LoadOptions{std::string(PE_FIXTURES) + "/" + name});
}

std::vector<std::string> nic_names(const Topology& t) {
  std::vector<std::string> v;
  for (const auto& n : t.nics()) v.push_back(n.name);
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST(DiscoveryTest, Dgx2HasSixteenNvmlGpusOnFourRootComplexes) {
  auto t = fixture("dgx2-16xV100-nvswitch.xml");
  ASSERT_EQ(t->gpus().size(), 16u);
  std::set<int> rcs;
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(t->gpus()[i].index, static_cast<int>(i));
    EXPECT_EQ(t->gpus()[i].name, "nvml" + std::to_string(i));
    rcs.insert(t->gpus()[i].root_complex);
  }
  EXPECT_EQ(rcs.size(), 4u);
  EXPECT_TRUE(t->nics().empty());
}

TEST(DiscoveryTest, RelionHasTwoGpusAndTheNicBehindOneRootComplex) {
  auto t = fixture("relion-x1904gt-2xP100-mlx5.xml");
  ASSERT_EQ(t->gpus().size(), 2u);
  EXPECT_EQ(t->gpus()[0].name, "cuda0");
  EXPECT_EQ(t->gpus()[1].name, "cuda1");
  EXPECT_EQ(t->gpus()[0].pci.str(), "0000:04:00.0");
  EXPECT_EQ(t->gpus()[1].pci.str(), "0000:07:00.0");
  EXPECT_EQ(t->root_complexes().size(), 1u);
  EXPECT_EQ(t->gpus()[0].root_complex, 0);
  EXPECT_EQ(t->gpus()[1].root_complex, 0);
  EXPECT_EQ(t->gpus()[0].numa, 0);
  EXPECT_EQ(nic_names(*t), (std::vector<std::string>{"enp12s0f0", "enp12s0f1", "mlx5_0"}));
  auto mlx =
      std::find_if(t->nics().begin(), t->nics().end(), [](auto& n) { return n.name == "mlx5_0"; });
  EXPECT_EQ(mlx->netdevs, (std::vector<std::string>{"hsi0"}));
  EXPECT_EQ(t->numa_count(), 2);
}

TEST(DiscoveryTest, SupermicroCountsOnlyTheCudaGpu) {
  auto t = fixture("supermicro-x9drg-k40m-mlx5.xml");
  ASSERT_EQ(t->gpus().size(), 1u);  // two more NVIDIA boards have no CUDA device
  EXPECT_EQ(t->gpus()[0].name, "cuda0");
  EXPECT_EQ(t->gpus()[0].pci.str(), "0000:84:00.0");
  EXPECT_EQ(t->root_complexes().size(), 2u);
  EXPECT_EQ(t->gpus()[0].root_complex, 1);
  EXPECT_EQ(t->gpus()[0].numa, 1);
  EXPECT_EQ(nic_names(*t), (std::vector<std::string>{"eth0", "eth1", "mlx5_0"}));
}

TEST(DiscoveryTest, LassenHasFourGpusAndFourMlx5OnTwoSockets) {
  auto t = fixture("lassen-ac922-4xV100-4xmlx5.xml");
  ASSERT_EQ(t->gpus().size(), 4u);
  std::vector<std::string> mlx;
  for (const auto& n : t->nics())
    if (n.name.rfind("mlx5_", 0) == 0) mlx.push_back(n.name);
  std::sort(mlx.begin(), mlx.end());
  EXPECT_EQ(mlx, (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}));
  std::set<int> numas;
  for (const auto& g : t->gpus()) numas.insert(g.numa);
  EXPECT_EQ(numas.size(), 2u);  // two GPUs per socket
  EXPECT_EQ(t->pu_count(), 160);
}

TEST(DiscoveryTest, Power8HasFourGpusOnFourRootComplexes) {
  auto t = fixture("power8-4xP100-nvlink.xml");
  ASSERT_EQ(t->gpus().size(), 4u);
  std::set<int> rcs;
  for (const auto& g : t->gpus()) rcs.insert(g.root_complex);
  EXPECT_EQ(rcs.size(), 4u);
}

TEST(DiscoveryTest, TheLiveMachineLoads) {
  auto t = load_topology(LoadOptions{});
  EXPECT_EQ(t->source(), "this machine");
  EXPECT_GE(t->pu_count(), 1);
  EXPECT_GE(t->numa_count(), 1);
}

TEST(DiscoveryTest, BadFilesGiveOneClearSentence) {
  try {
    load_topology(LoadOptions{"/no/such/topology.xml"});
    FAIL() << "no error";
  } catch (const pe::topo::TopologyError& e) {
    EXPECT_STREQ(e.what(), "topology file '/no/such/topology.xml': No such file or directory");
  }
  std::string junk = ::testing::TempDir() + "/junk.xml";
  std::ofstream(junk) << "<not hwloc>";
  try {
    load_topology(LoadOptions{junk});
    FAIL() << "no error";
  } catch (const pe::topo::TopologyError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a valid hwloc XML file"), std::string::npos);
  }
}
