#include <pytorch_exec/version.h>

#include "exec/ctrl/messages.hpp"

#include <signal.h>

namespace pe::ctrl {

void Encoder::operator()(const std::string& s, uint32_t max) {
  if (s.size() > max) throw wire::WireError("a field of " + std::to_string(s.size()) + " bytes");
  w_.blob(s);
}

void Encoder::operator()(const std::vector<std::string>& v, uint32_t, uint32_t) {
  w_.u32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) w_.blob(s);
}

void Encoder::operator()(const std::vector<int>& v, uint32_t) {
  w_.u32(static_cast<uint32_t>(v.size()));
  for (int x : v) w_.i32(x);
}

void Encoder::operator()(const std::vector<std::pair<std::string, std::string>>& v) {
  w_.u32(static_cast<uint32_t>(v.size()));
  for (const auto& [k, x] : v) w_.str(k).str(x);
}

void Encoder::operator()(const EnvMap& v) {
  w_.u32(static_cast<uint32_t>(v.size()));
  for (const auto& [k, x] : v) w_.str(k).str(x);
}

void Encoder::operator()(const JobMap& m) {
  w_.i32(m.world_size).u32(static_cast<uint32_t>(m.nodes.size()));
  for (const auto& n : m.nodes) {
    w_.str(n.host).i32(n.node_rank).i32(n.slots);
    (*this)(n.ranks, 0);
  }
}

namespace {

// A count read from a frame, bounded by what the rest of the frame can hold (`min_bytes` each).
uint32_t bounded_count(wire::Reader& r, uint32_t max, size_t min_bytes, const char* what) {
  uint32_t n = r.u32();
  if (n > max || n > r.remaining() / min_bytes)
    throw wire::WireError(std::string(what) + " longer than its frame");
  return n;
}

}  // namespace

void Decoder::operator()(std::vector<std::string>& v, uint32_t max_count, uint32_t max_len) {
  uint32_t n = bounded_count(r_, max_count, 4, "string list");
  v.clear();
  for (uint32_t i = 0; i < n; ++i) v.push_back(max_len ? r_.str(max_len) : r_.str());
}

void Decoder::operator()(std::vector<int>& v, uint32_t max_count) {
  uint32_t n = bounded_count(r_, max_count, 4, "integer list");
  v.clear();
  for (uint32_t i = 0; i < n; ++i) v.push_back(r_.i32());
}

void Decoder::operator()(std::vector<std::pair<std::string, std::string>>& v) {
  uint32_t n = bounded_count(r_, UINT32_MAX, 8, "variable list");
  v.clear();
  for (uint32_t i = 0; i < n; ++i) {
    std::string k = r_.str();
    v.emplace_back(std::move(k), r_.str());
  }
}

void Decoder::operator()(EnvMap& v) {
  uint32_t n = bounded_count(r_, UINT32_MAX, 8, "environment");
  v.clear();
  for (uint32_t i = 0; i < n; ++i) {
    std::string k = r_.str();
    v[k] = r_.str();
  }
}

void Decoder::operator()(JobMap& map) {
  count(map.world_size, 1 << 24);
  uint32_t nnodes = bounded_count(r_, UINT32_MAX, 16, "node list");
  if (nnodes == 0) throw wire::WireError("a job map without nodes");
  map.nodes.clear();
  map.ranks.assign(static_cast<size_t>(map.world_size), RankLocation{-1, 0});
  for (uint32_t i = 0; i < nnodes; ++i) {
    NodeMap n;
    n.host = r_.str(kMaxName);
    n.node_rank = r_.i32();
    count(n.slots, 1 << 24);
    (*this)(n.ranks, 1u << 24);
    for (size_t lr = 0; lr < n.ranks.size(); ++lr) {
      int rank = n.ranks[lr];
      if (rank < 0 || rank >= map.world_size || map.ranks[static_cast<size_t>(rank)].node >= 0)
        throw wire::WireError("bad rank " + std::to_string(rank) + " in the job map");
      map.ranks[static_cast<size_t>(rank)] =
          RankLocation{static_cast<int>(i), static_cast<int>(lr)};
    }
    map.nodes.push_back(std::move(n));
  }
  for (const auto& loc : map.ranks)
    if (loc.node < 0) throw wire::WireError("the job map leaves a rank out");
}

void Decoder::count(int& v, int max) {
  v = r_.i32();
  if (v < 0 || v > max) throw wire::WireError("bad count " + std::to_string(v));
}

void Decoder::port(int& v) {
  v = r_.i32();
  if (v <= 0 || v > 65535) throw wire::WireError("bad port " + std::to_string(v));
}

std::string protocol_mismatch(const std::string& payload) {
  if (payload.size() < 4) return "no control protocol (not a pytorch_exec)";
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(payload[static_cast<size_t>(i)]);
  if ((v & 0xffff0000u) != kProtocolMagic)
    return "an older control protocol, without a version (control protocol 1)";
  if (v != kProtocol) return "control protocol " + std::to_string(v & 0xffffu);
  return "";
}

std::string protocol_here() {
  return "control protocol " + std::to_string(kProtocolVersion) + " (pytorch_exec " +
         PYTORCH_EXEC_VERSION_STRING + ")";
}

void validate(const Job& m) {
  const NodeJob& j = m.job;
  if (j.node < 0 || j.node >= static_cast<int>(j.map.nodes.size()))
    throw wire::WireError("bad node index");
  if (j.tree_radix < 1) throw wire::WireError("bad tree radix");
  if (j.stdin_mode == StdinMode::OneRank && (j.stdin_rank < 0 || j.stdin_rank >= j.map.world_size))
    throw wire::WireError("bad stdin rank");
  const PlacementRequest& pr = j.placement;
  bool object = false;
  for (topo::MapBy o : topo::kPprObjects) object = object || pr.ppr_object == o;
  if (!object || (pr.map_by == topo::MapBy::Ppr && pr.ppr < 1))
    throw wire::WireError("bad ppr mapping");
}

void validate(const Routed& m) {
  if (m.inner.type == static_cast<uint16_t>(Msg::Routed))
    throw wire::WireError("nested routed frame");
}

void validate(const Signal& m) {
  if (m.sig <= 0 || m.sig >= NSIG) throw wire::WireError("bad signal number");
}

void validate(const SpawnStart& m) {
  const SpawnJob& j = m.job;
  if (j.apps.empty() || j.appnum.size() != static_cast<size_t>(j.map.world_size))
    throw wire::WireError("a spawn without applications for its ranks");
  for (int a : j.appnum)
    if (a < 0 || static_cast<size_t>(a) >= j.apps.size())
      throw wire::WireError("bad application number");
}

namespace {

template <class F, size_t... I>
bool for_type(uint16_t type, F&& f, std::index_sequence<I...>) {
  return ((static_cast<uint16_t>(std::tuple_element_t<I, AllMessages>::kType) == type
               ? (f(static_cast<std::tuple_element_t<I, AllMessages>*>(nullptr)), true)
               : false) ||
          ...);
}

// Calls f((M*)nullptr) for the message type `type`; false when there is none.
template <class F>
bool for_type(uint16_t type, F&& f) {
  return for_type(type, f, std::make_index_sequence<std::tuple_size_v<AllMessages>>{});
}

}  // namespace

const char* msg_name(uint16_t type) {
  const char* name = "unknown";
  for_type(type, [&name](auto* m) { name = std::remove_pointer_t<decltype(m)>::kName; });
  return name;
}

void decode_any(uint16_t type, std::string_view payload) {
  bool known =
      for_type(type, [payload](auto* m) { decode<std::remove_pointer_t<decltype(m)>>(payload); });
  if (!known) throw wire::WireError("unknown message type " + std::to_string(type));
}

}  // namespace pe::ctrl
