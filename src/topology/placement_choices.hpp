// The choices of --map-by, --rank-by and --bind-to as values: what the command line produces,
// the control plane carries and placement reads.  No hwloc here, so the launch configuration can
// hold them cheaply.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace pe::topo {

enum class MapBy { Default, Slot, Node, Numa, Gpu, Domain };
enum class RankBy { Slot, Node, Numa, Gpu, Domain };  // slot: placement order (the default)
enum class BindTo { Default, None, Core, Numa, Gpu };

// What a user can name, in the order messages list them (Default has no spelling).
inline constexpr MapBy kMapByChoices[] = {MapBy::Slot, MapBy::Node, MapBy::Numa, MapBy::Gpu,
                                          MapBy::Domain};
inline constexpr RankBy kRankByChoices[] = {RankBy::Slot, RankBy::Node, RankBy::Numa, RankBy::Gpu,
                                            RankBy::Domain};
inline constexpr BindTo kBindToChoices[] = {BindTo::None, BindTo::Core, BindTo::Numa, BindTo::Gpu};

// The spelling on the command line; "default" for Default.
const char* to_string(MapBy m);
const char* to_string(RankBy r);
const char* to_string(BindTo b);

// The choice spelled `s`, if one is.
template <typename E, std::size_t N>
std::optional<E> find_choice(const E (&choices)[N], const std::string& s) {
  for (E e : choices)
    if (s == to_string(e)) return e;
  return std::nullopt;
}

}  // namespace pe::topo
