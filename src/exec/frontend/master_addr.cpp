#include "exec/frontend/master_addr.hpp"

#include <algorithm>

namespace pe {
namespace {

bool loopback(const std::string& a) { return a.rfind("127.", 0) == 0; }

// The address another host's daemon reached us at (so that host can reach it); failing that
// (no other host talks to us directly), the one the kernel sends from toward another host.
// "" when every node is on our host.
std::string toward_others(const std::vector<NodeAddresses>& nodes,
                          const std::function<bool(const std::string&)>& is_ours,
                          const std::function<std::string(const std::string&)>& route_source) {
  for (const auto& n : nodes)
    if (!n.seen.empty() && !is_ours(n.seen) && !n.ours.empty()) return n.ours;
  for (const auto& n : nodes)
    for (const auto& other : n.own) {
      if (is_ours(other)) continue;
      std::string a = route_source(other);
      if (!a.empty() && !loopback(a)) return a;
    }
  return "";
}

}  // namespace

std::string choose_master_addr(int rank0_node, const std::vector<NodeAddresses>& nodes,
                               const std::vector<std::string>& our_addrs,
                               const std::function<std::string(const std::string&)>& route_source) {
  auto is_ours = [&our_addrs](const std::string& a) {
    return loopback(a) || std::find(our_addrs.begin(), our_addrs.end(), a) != our_addrs.end();
  };
  const std::string& seen = nodes.at(static_cast<size_t>(rank0_node)).seen;
  if (!is_ours(seen)) return seen;
  std::string a = toward_others(nodes, is_ours, route_source);
  return a.empty() ? seen : a;
}

}  // namespace pe
