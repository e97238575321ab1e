// Choosing MASTER_ADDR for a multi-node job: rank 0's node as the other nodes reach it.  A node
// on another host: its address as the front end sees it.  A node on the front end's host: its
// daemon reached us at whichever of our addresses it tried first (a container bridge's, maybe),
// so take ours that faces the other hosts.  Pure, for unit tests.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace pe {

struct NodeAddresses {
  std::string seen;              // as the front end sees it ("": not a child of the front end)
  std::string ours;              // the front end's own address on that connection
  std::vector<std::string> own;  // what the node reported of itself
};

// `route_source(addr)`: the address the kernel would send from toward addr ("" unknown).
std::string choose_master_addr(int rank0_node, const std::vector<NodeAddresses>& nodes,
                               const std::vector<std::string>& our_addrs,
                               const std::function<std::string(const std::string&)>& route_source);

}  // namespace pe
