#include "exec/frontend/modex_relay.hpp"

#include "common/log.hpp"

namespace pe {

void ModexRelay::reset() {
  fences_.clear();
  requests_.clear();
}

void ModexRelay::on_fence(int node, ctrl::Fence& m) {
  size_t nnodes = map_.nodes.size();
  auto& st = fences_[{m.nspace, m.seq}];
  if (st.arrived.empty()) {
    st.arrived.assign(nnodes, false);
    st.data.resize(nnodes);
  }
  if (st.arrived[static_cast<size_t>(node)])
    throw wire::WireError("fence " + std::to_string(m.seq) + " contributed twice");
  st.arrived[static_cast<size_t>(node)] = true;
  // Nothing collected: the nodes' contributions are empty.
  st.data[static_cast<size_t>(node)] = std::move(m.data);
  if (++st.count < static_cast<int>(nnodes)) return;
  ctrl::FenceDone done{m.nspace, m.seq, 0, {}};
  for (auto& d : st.data) done.data += d;
  logger("ctrl")->debug("fence {} #{} complete: {} bytes from {} nodes", m.nspace, m.seq,
                        done.data.size(), nnodes);
  tree_.broadcast(done);
  fences_.erase({m.nspace, m.seq});
}

void ModexRelay::on_request(int node, ctrl::DmodexReq& m) {
  if (m.rank < 0 || m.rank >= map_.world_size) throw wire::WireError("dmodex request for bad rank");
  int owner = map_.ranks[static_cast<size_t>(m.rank)].node;
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
