#include "exec/frontend/modex_relay.hpp"

#include <algorithm>

#include "common/log.hpp"
#include "pmix_rdzv/modex_router.hpp"

namespace pe {

void ModexRelay::reset(std::vector<int> members, std::vector<int> owner) {
  members_ = std::move(members);
  owner_ = std::move(owner);
  spawned_.clear();
  fences_.clear();
  requests_.clear();
}

void ModexRelay::add_namespace(const std::string& nspace, std::vector<int> owner) {
  spawned_[nspace] = std::move(owner);
}

const std::vector<int>& ModexRelay::owners(const std::string& nspace) const {
  auto it = spawned_.find(nspace);
  return it == spawned_.end() ? owner_ : it->second;
}

std::vector<int> ModexRelay::nodes_of(const std::string& key) const {
  std::vector<pmix::ProcId> procs;
  try {
    procs = pmix::parse_participants(key);
  } catch (const std::exception& e) {
    throw wire::WireError(e.what());
  }
  std::vector<int> nodes;
  for (const auto& p : procs) {
    const auto& own = owners(p.nspace);
    if (p.rank < 0) {
      nodes.insert(nodes.end(), own.begin(), own.end());
    } else {
      if (static_cast<size_t>(p.rank) >= own.size())
        throw wire::WireError("a fence over rank " + std::to_string(p.rank) + " of " + p.nspace);
      nodes.push_back(own[static_cast<size_t>(p.rank)]);
    }
  }
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

void ModexRelay::on_fence(int node, ctrl::Fence& m) {
  auto& st = fences_[{m.nspace, m.seq}];
  if (st.nodes.empty()) {
    try {
      st.nodes = nodes_of(m.nspace);
    } catch (...) {
      fences_.erase({m.nspace, m.seq});
      throw;
    }
    st.arrived.assign(st.nodes.size(), false);
    st.data.resize(st.nodes.size());
  }
  size_t nnodes = st.nodes.size();
  auto at = std::find(st.nodes.begin(), st.nodes.end(), node);
  if (at == st.nodes.end()) throw wire::WireError("a fence from a node outside its participants");
  size_t i = static_cast<size_t>(at - st.nodes.begin());
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
    send_done(st, ctrl::FenceDone{nspace, seq, -1, {}, false});
    return;
  }
  std::string all;
  all.reserve(st.bytes);
  for (auto& d : st.data) all += d, d = std::string();
  logger("ctrl")->debug("fence {} #{} complete: {} bytes from {} nodes", nspace, seq, all.size(),
                        st.data.size());
  ctrl::for_each_fence_piece(all, [&](std::string piece, bool more) {
    send_done(st, ctrl::FenceDone{nspace, seq, 0, std::move(piece), more});
  });
}

// To the fence's nodes only (every node of the tree: one broadcast; not when there are others,
// spares or nodes for spawned processes, which know nothing of the fence).
void ModexRelay::send_done(const FenceState& st, ctrl::FenceDone m) {
  if (st.nodes.size() == static_cast<size_t>(tree_.size())) return tree_.broadcast(m);
  for (int n : st.nodes)
    if (!tree_.lost(n)) tree_.send(n, m);
}

void ModexRelay::on_request(int node, ctrl::DmodexReq& m) {
  const auto& own = owners(m.nspace);
  if (m.rank < 0 || static_cast<size_t>(m.rank) >= own.size())
    throw wire::WireError("dmodex request for bad rank");
  int owner = own[static_cast<size_t>(m.rank)];
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
