// Golden outputs over the six real machines: the --display-topology printout and the rank
// placement for several -n / --map-by / --bind-to / --gpus-per-rank choices.  Regenerate with
// PE_REGEN_GOLDEN=1 (writes tests/topology/golden/*.txt in the source tree) and review the diff.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "topology/placement.hpp"

using namespace pe::topo;

namespace {

const char* kFixtures[] = {"dgx2-16xV100-nvswitch",      "power8-4xP100-nvlink",
                           "lassen-ac922-4xV100-4xmlx5", "relion-x1904gt-2xP100-mlx5",
                           "supermicro-x9drg-k40m-mlx5", "xe8640-4xH100-4xmlx5"};

std::string report(const std::string& fixture) {
  auto t = load_topology(LoadOptions{std::string(PE_FIXTURES) + "/" + fixture + ".xml"});
  auto a = analyse(*t);
  std::ostringstream os;
  std::string text = format_topology(*t, a);
  // The source line carries the absolute path of the fixture: keep only its name.
  text.replace(text.find(PE_FIXTURES), std::string(PE_FIXTURES).size() + 1, "");
  os << text;
  int g = static_cast<int>(t->gpus().size());
  struct Case {
    std::string title;
    PlacementOptions o;
  };
  std::vector<Case> cases = {
      {"-n " + std::to_string(g), {g, MapBy::Default, BindTo::Default, 1}},
      {"-n " + std::to_string(2 * g) + " --bind-to core", {2 * g, MapBy::Default, BindTo::Core, 1}},
      {"-n " + std::to_string(g) + " --map-by numa --bind-to numa",
       {g, MapBy::Numa, BindTo::Numa, 1}},
      {"-n " + std::to_string(g) + " --map-by gpu --bind-to none",
       {g, MapBy::Gpu, BindTo::None, 1}},
  };
  // Open MPI's mapping on processor objects.
  auto mpi = [](int n, MapBy by, int ppr, MapBy object, int pe, BindTo bind) {
    PlacementOptions o{n, by, bind, 1};
    o.ppr = ppr, o.ppr_object = object, o.pe = pe;
    return o;
  };
  cases.push_back(
      {"-n 4 --map-by socket", mpi(4, MapBy::Socket, 0, MapBy::Node, 0, BindTo::Default)});
  cases.push_back({"-n 4 --map-by socket --bind-to core",
                   mpi(4, MapBy::Socket, 0, MapBy::Node, 0, BindTo::Core)});
  cases.push_back({"-n 4 --map-by ppr:2:socket:PE=2",
                   mpi(4, MapBy::Ppr, 2, MapBy::Socket, 2, BindTo::Default)});
  cases.push_back(
      {"-n 4 -c 2 (numa:PE=2)", mpi(4, MapBy::Numa, 0, MapBy::Node, 2, BindTo::Default)});
  cases.push_back(
      {"-n 4 --map-by hwthread", mpi(4, MapBy::HwThread, 0, MapBy::Node, 0, BindTo::Default)});
  if (g >= 2)
    cases.push_back({"-n " + std::to_string(g / 2) + " --gpus-per-rank 2",
                     {g / 2, MapBy::Default, BindTo::Default, 2}});
  for (const auto& c : cases) {
    os << "\n== " << c.title << "\n";
    try {  // a refusal (more ranks than cores to bind them to) is part of the reviewed output
      os << format_placement(place_ranks(*t, a, c.o));
    } catch (const TopologyError& e) {
      std::string what = e.what();
      what.replace(what.find(PE_FIXTURES), std::string(PE_FIXTURES).size() + 1, "");
      os << "error: " << what << "\n";
    }
  }
  return os.str();
}

}  // namespace

class GoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenTest, MatchesTheReviewedOutput) {
  std::string name = GetParam();
  std::string path = std::string(PE_GOLDEN) + "/" + name + ".txt";
  std::string got = report(name);
  if (std::getenv("PE_REGEN_GOLDEN")) {
    std::ofstream(path) << got;
    GTEST_SKIP() << "regenerated " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing golden file " << path << " (run with PE_REGEN_GOLDEN=1)";
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(got, want.str()) << "output for " << name << " changed; if intended, regenerate with "
                             << "PE_REGEN_GOLDEN=1 and review the diff";
}

INSTANTIATE_TEST_SUITE_P(RealMachines, GoldenTest, ::testing::ValuesIn(kFixtures));
