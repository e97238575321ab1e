// bench/topology: discovery + mapping time for a dry run of 1024 nodes x 8 ranks from an hwloc
// XML file (default: the DGX-2 fixture, 16 GPUs on NVSwitches).  Two cases:
//   shared:  the topology is loaded and analysed once (all nodes of one type), then 8 ranks are
//            placed and the map line of every rank is formatted for each of the 1024 nodes;
//   reload:  every node's topology is loaded from the XML and analysed again (1024 node types).
// Prints the time of each against the 1 s budget.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "topology/placement.hpp"

using namespace pe::topo;
using Clock = std::chrono::steady_clock;

namespace {

size_t map_nodes(const Topology& t, const Analysis& a, int nodes, int per_node, bool reload,
                 const std::string& file) {
  size_t bytes = 0;
  for (int n = 0; n < nodes; ++n) {
    std::unique_ptr<Topology> own;
    Analysis own_a;
    const Topology* tp = &t;
    const Analysis* ap = &a;
    if (reload) {
      own = load_topology(LoadOptions{file});
      own_a = analyse(*own);
      tp = own.get();
      ap = &own_a;
    }
    auto ranks =
        place_ranks(*tp, *ap, PlacementOptions{per_node, MapBy::Default, BindTo::Default, 1});
    for (const auto& r : ranks)
      bytes +=
          ("rank " + std::to_string(n * per_node + r.local_rank) + ": " + describe_placement(r))
              .size();
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file = argc > 1 ? argv[1] : std::string(PE_FIXTURES) + "/dgx2-16xV100-nvswitch.xml";
  const int nodes = 1024, per_node = 8;
  auto t0 = Clock::now();
  auto t = load_topology(LoadOptions{file});
  auto a = analyse(*t);
  size_t bytes = map_nodes(*t, a, nodes, per_node, false, file);
  double shared = std::chrono::duration<double>(Clock::now() - t0).count();
  auto t1 = Clock::now();
  bytes += map_nodes(*t, a, nodes, per_node, true, file);
  double reload = std::chrono::duration<double>(Clock::now() - t1).count();
  std::printf("topology: dry-run mapping of %d nodes x %d ranks from %s (%zu bytes of map)\n",
              nodes, per_node, file.c_str(), bytes);
  std::printf(
      "  one node type (load + analyse once, place and format 1024 nodes): %8.1f ms  "
      "ratio to 1 s budget %.3f (%s)\n",
      shared * 1e3, shared, shared <= 1.0 ? "within budget" : "OVER budget");
  std::printf(
      "  every node loaded from XML and analysed again:                    %8.1f ms  "
      "ratio to 1 s budget %.3f (%s)\n",
      reload * 1e3, reload, reload <= 1.0 ? "within budget" : "OVER budget");
  return 0;
}
