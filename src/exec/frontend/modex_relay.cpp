#include "exec/frontend/modex_relay.hpp"

#include <algorithm>

#include "common/log.hpp"

namespace pe {

void ModexRelay::reset(std::vector<int> members, std::vector<int> owner) {
  members_ = std::move(members);
  owner_ = std::move(owner);
  fences_.clear();
  requests_.clear();
}

void ModexRelay::on_fence(int node, ctrl::Fence& m) {
  size_t nnodes = members_.size();
  auto at = std::find(members_.begin(), members_.end(), node);
  if (at == members_.end()) throw wire::WireError("a fence from a node outside the generation");
  size_t i = static_cast<size_t>(at - members_.begin());
  auto& st = fences_[{m.nspace, m.seq}];
  if (st.arrived.empty()) {
    st.arrived.assign(nnodes, false);
    st.data.resize(nnodes);
  }
  if (st.arrived[i]) throw wire::WireError("fence " + std::to_string(m.seq) + " contributed twice");
  // A node's contribution comes in pieces; past the limit only the size is counted.
  st.bytes += m.data.size();
  if (st.bytes <= ctrl::kMaxFenceBytes)
    st.data[i] += m.data;
  else
    st.data.assign(nnodes, std::string());
  if (m.more) return;
  st.arrived[i] = true;
  if (++st.count < static_cast<int>(nnodes)) return;
  finish_fence(m.nspace, m.seq, st);
  fences_.erase({m.nspace, m.seq});
}

// Every node's data back to every node, in pieces; a fence over the limit fails on every node
// with its own message (not as a lost node).
void ModexRelay::finish_fence(const std::string& nspace, uint32_t seq, FenceState& st) {
  if (st.bytes > ctrl::kMaxFenceBytes) {
    logger("ctrl")->error(
        "fence {} #{}: the nodes' data ({} bytes) exceeds the {} MiB a fence across nodes can "
        "carry",
        nspace, seq, st.bytes, ctrl::kMaxFenceBytes >> 20);
    tree_.broadcast(ctrl::FenceDone{nspace, seq, -1, {}, false});
    return;
  }
  std::string all;
  all.reserve(st.bytes);
  for (auto& d : st.data) all += d, d = std::string();
  logger("ctrl")->debug("fence {} #{} complete: {} bytes from {} nodes", nspace, seq, all.size(),
                        st.data.size());
  ctrl::for_each_fence_piece(all, [&](std::string piece, bool more) {
    tree_.broadcast(ctrl::FenceDone{nspace, seq, 0, std::move(piece), more});
  });
}

void ModexRelay::on_request(int node, ctrl::DmodexReq& m) {
  if (m.rank < 0 || static_cast<size_t>(m.rank) >= owner_.size())
    throw wire::WireError("dmodex request for bad rank");
  int owner = owner_[static_cast<size_t>(m.rank)];
  if (tree_.lost(owner)) return tree_.send(node, ctrl::DmodexResp{m.id, -1, ""});
  uint64_t mine = next_id_++;
  requests_[mine] = Route{node, m.id};
  tree_.send(owner, ctrl::DmodexReq{mine, m.nspace, m.rank});
}

void ModexRelay::on_response(ctrl::DmodexResp& m) {
  auto it = requests_.find(m.id);
  if (it == requests_.end()) throw wire::WireError("dmodex response for an unknown request");
  Route route = it->second;
  requests_.erase(it);
  if (tree_.lost(route.from_node)) return;
  tree_.send(route.from_node, ctrl::DmodexResp{route.from_id, m.status, std::move(m.data)});
}

}  // namespace pe
