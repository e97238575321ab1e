#include "exec/frontend/spawn_relay.hpp"

#include <algorithm>

#include "common/log.hpp"
#include "common/net.hpp"
#include "exec/node/node_runner.hpp"

namespace pe {

SpawnRelay::SpawnRelay(ctrl::TreeRoot& tree, ModexRelay& modex, bool oversubscribe, Hooks hooks)
    : tree_(tree), modex_(modex), oversubscribe_(oversubscribe), hooks_(std::move(hooks)) {}

void SpawnRelay::reset(const GenerationInfo& gen, const JobMap& map, std::vector<int> members) {
  gen_ = gen;
  map_ = map;
  members_ = std::move(members);
  spawned_ = 0;
  pending_.clear();
  published_.clear();
}

void SpawnRelay::refuse(int node, uint64_t id, int parent_rank, const std::string& why) {
  std::string line =
      "pytorch_exec: MPI_Comm_spawn from rank " + std::to_string(parent_rank) + ": " + why + "\n";
  write_all(2, line.data(), line.size());
  if (!tree_.lost(node)) tree_.send(node, ctrl::SpawnResp{id, why, ""});
}

void SpawnRelay::on_request(int node, ctrl::SpawnReq& m) {
  std::vector<int> used;
  for (int member : members_) used.push_back(static_cast<int>(hooks_.live(member)));
  SpawnJob sj;
  try {
    sj = plan_spawn(m.req, map_, used, oversubscribe_);
  } catch (const SpawnError& e) {
    return refuse(node, m.id, m.req.parent_rank, e.what());
  }
  sj.generation = gen_.generation;
  sj.number = ++spawned_;
  sj.nspace = spawn_namespace(namespace_name(gen_.job_id, gen_.generation), sj.number);
  // The tree node of each child node, and of each child rank.
  std::vector<int> tree_node;
  for (const auto& n : sj.map.nodes) {
    size_t g = 0;
    while (map_.nodes[g].host != n.host) ++g;
    tree_node.push_back(members_[g]);
  }
  std::vector<int> owner;
  for (const auto& loc : sj.map.ranks) owner.push_back(tree_node[static_cast<size_t>(loc.node)]);
  modex_.add_namespace(sj.nspace, owner);
  Pending p{node, m.id, m.req.parent_rank, {}, {}, ""};
  for (int member : members_)
    if (!tree_.lost(member)) p.waiting.push_back(member);
  for (size_t i = 0; i < sj.map.nodes.size(); ++i) {
    long n = static_cast<long>(sj.map.nodes[i].ranks.size());
    p.planned[tree_node[i]] = n;
    hooks_.add_live(tree_node[i], n);
  }
  logger("ctrl")->info("spawn {} from rank {}: {} process(es) on {} node(s)", sj.nspace,
                       m.req.parent_rank, sj.map.world_size, sj.map.nodes.size());
  pending_[sj.nspace] = std::move(p);
  for (int member : pending_[sj.nspace].waiting) tree_.send(member, ctrl::SpawnStart{sj});
}

void SpawnRelay::on_started(int node, ctrl::SpawnStarted& m) {
  auto it = pending_.find(m.nspace);
  if (it == pending_.end()) return;  // of an earlier generation
  Pending& p = it->second;
  auto w = std::find(p.waiting.begin(), p.waiting.end(), node);
  if (w == p.waiting.end()) throw wire::WireError("spawn-started twice or from a stranger");
  p.waiting.erase(w);
  if (!m.error.empty()) {
    // What did not start is not running there.
    hooks_.add_live(node, static_cast<long>(m.started) - p.planned[node]);
    if (p.error.empty()) p.error = "node " + hooks_.host(node) + ": " + m.error;
  }
  if (!p.waiting.empty()) return;
  Pending done = std::move(p);
  std::string nspace = m.nspace;
  pending_.erase(it);
  if (!done.error.empty()) return refuse(done.from_node, done.id, done.parent_rank, done.error);
  if (!tree_.lost(done.from_node)) tree_.send(done.from_node, ctrl::SpawnResp{done.id, "", nspace});
}

void SpawnRelay::on_publish(ctrl::Publish& m) {
  for (auto& [k, v] : m.kv) published_[k] = std::move(v);
}

void SpawnRelay::on_lookup(int node, ctrl::Lookup& m) {
  ctrl::LookupResp r{m.id, {}};
  for (const auto& k : m.keys)
    if (auto it = published_.find(k); it != published_.end()) r.found.emplace_back(*it);
  tree_.send(node, r);
}

void SpawnRelay::on_unpublish(ctrl::Unpublish& m) {
  for (const auto& k : m.keys) published_.erase(k);
}

}  // namespace pe
