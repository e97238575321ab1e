// The choices of --map-by, --rank-by and --bind-to as values: what the command line produces,
// the control plane carries and placement reads.  No hwloc here, so the launch configuration can
// hold them cheaply.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace pe::topo {

// Ours (gpu, domain) and Open MPI's (slot, node, numa, and the processor objects core,
// hwthread, l3cache, socket, with ppr:N:OBJECT, N ranks per object).
enum class MapBy { Default, Slot, Node, Numa, Gpu, Domain, Core, HwThread, L3Cache, Socket, Ppr };
enum class RankBy {
  Slot,
  Node,
  Numa,
  Gpu,
  Domain,
  Core,
  HwThread,
  L3Cache,
  Socket
};  // slot: placement order (the default)
enum class BindTo { Default, None, Core, Numa, Gpu, HwThread, L3Cache, Socket };

// What a user can name, in the order messages list them (Default and Ppr have no spelling of
// their own: ppr is written ppr:N:OBJECT).
inline constexpr MapBy kMapByChoices[] = {MapBy::Slot,     MapBy::Node,    MapBy::Numa,
                                          MapBy::Gpu,      MapBy::Domain,  MapBy::Core,
                                          MapBy::HwThread, MapBy::L3Cache, MapBy::Socket};
inline constexpr RankBy kRankByChoices[] = {RankBy::Slot,     RankBy::Node,    RankBy::Numa,
                                            RankBy::Gpu,      RankBy::Domain,  RankBy::Core,
                                            RankBy::HwThread, RankBy::L3Cache, RankBy::Socket};
inline constexpr BindTo kBindToChoices[] = {BindTo::None,  BindTo::Core,     BindTo::Numa,
                                            BindTo::Gpu,   BindTo::HwThread, BindTo::L3Cache,
                                            BindTo::Socket};
// The objects ppr:N:OBJECT counts.
inline constexpr MapBy kPprObjects[] = {MapBy::Node,    MapBy::Socket, MapBy::Numa,
                                        MapBy::L3Cache, MapBy::Core,   MapBy::HwThread};

// --map-by in full: OBJECT[:MODIFIER...] or ppr:N:OBJECT[:MODIFIER...], modifiers PE=n,
// oversubscribe and nooversubscribe (Open MPI's spelling, any case).
struct MapSpec {
  MapBy by = MapBy::Default;
  int ppr = 0;                        // ppr:N:OBJECT: N
  MapBy ppr_object = MapBy::Node;     // and OBJECT (one of kPprObjects)
  int pe = 0;                         // PE=n: processors (cores) per rank; 0: not given
  std::optional<bool> oversubscribe;  // :oversubscribe / :nooversubscribe
  bool nolocal = false;               // :nolocal (--nolocal)
};

// --bind-to in full: LEVEL[:overload-allowed][:if-supported].
struct BindSpec {
  BindTo to = BindTo::Default;
  bool overload = false;  // more ranks than the level's objects may share them
};

// The spelling on the command line; "default" for Default.
const char* to_string(MapBy m);
const char* to_string(RankBy r);
const char* to_string(BindTo b);

// The choice spelled `s` (any case; "package" is socket, as in Open MPI 5), if one is.
template <typename E, std::size_t N>
std::optional<E> find_choice(const E (&choices)[N], const std::string& s) {
  std::string low;
  for (char c : s) low += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (low == "package") low = "socket";
  for (E e : choices)
    if (low == to_string(e)) return e;
  return std::nullopt;
}

}  // namespace pe::topo
