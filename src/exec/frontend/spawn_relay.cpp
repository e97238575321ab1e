#include "exec/frontend/spawn_relay.hpp"

#include <algorithm>

#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
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
  stopped_.clear();
  published_.clear();
}

void SpawnRelay::refuse(int node, uint64_t id, int parent_rank, const std::string& why) {
  std::string line =
      "pytorch_exec: MPI_Comm_spawn from rank " + std::to_string(parent_rank) + ": " + why + "\n";
  write_all(2, line.data(), line.size());
  if (!tree_.lost(node)) tree_.send(node, ctrl::SpawnResp{id, why, ""});
}

// The processes on each node the placement may use: the generation's, then the hosts of the
// job's list that run no ranks.
// Spawns still waiting for a daemon count too: their processes are placed, not yet started.
std::vector<int> SpawnRelay::used() const {
  std::map<std::string, int> placed;
  for (const auto& [nspace, p] : pending_)
    if (p.planned.empty())
      for (const auto& n : p.job.map.nodes) placed[n.host] += static_cast<int>(n.ranks.size());
  std::vector<int> out;
  for (size_t g = 0; g < members_.size(); ++g)
    out.push_back(static_cast<int>(hooks_.live(members_[g])) + placed[map_.nodes[g].host]);
  for (const auto& h : map_.spawn_hosts) {
    int n = hooks_.node_of(h.host);
    out.push_back((n < 0 ? 0 : static_cast<int>(hooks_.live(n))) + placed[h.host]);
  }
  return out;
}

// The tree node of a node of the generation, or of a ready host without ranks; else -1.
int SpawnRelay::tree_node(const std::string& host) const {
  for (size_t g = 0; g < map_.nodes.size(); ++g)
    if (map_.nodes[g].host == host) return members_[g];
  return hooks_.node_of(host);
}

void SpawnRelay::on_request(int node, ctrl::SpawnReq& m) {
  Pending p{node, m.id, m.req.parent_rank, {}, {}, {}, {}, ""};
  try {
    p.job = plan_spawn(m.req, map_, used(), oversubscribe_, true);
  } catch (const SpawnError& e) {
    return refuse(node, m.id, m.req.parent_rank, e.what());
  }
  // Hosts without a daemon yet get one (or are being given one for an earlier request).
  for (const auto& n : p.job.map.nodes) {
    if (tree_node(n.host) >= 0) continue;
    std::string why = hooks_.start_host(n.host);
    if (!why.empty()) return refuse(node, m.id, m.req.parent_rank, "node " + n.host + ": " + why);
    p.starting.push_back(n.host);
  }
  SpawnJob& sj = p.job;
  sj.generation = gen_.generation;
  sj.number = ++spawned_;
  sj.nspace = spawn_namespace(namespace_name(gen_.job_id, gen_.generation), sj.number);
  auto it = pending_.emplace(sj.nspace, std::move(p)).first;
  if (it->second.starting.empty()) return launch(it);
  logger("ctrl")->info("spawn {}: waiting for the daemon(s) of {}", it->first,
                       join(it->second.starting, ","));
}

// Every node of the spawn has a daemon: each node of the generation, and each other node with
// processes of it, registers the namespace and starts its part.
void SpawnRelay::launch(PendingIt it) {
  Pending& p = it->second;
  const SpawnJob& sj = p.job;
  std::vector<int> nodes;  // the tree node of each of the spawn's nodes
  for (const auto& n : sj.map.nodes) nodes.push_back(tree_node(n.host));
  if (std::find(nodes.begin(), nodes.end(), -1) != nodes.end()) {
    p.error = "a node of the spawn has no daemon";
    return finish(it);
  }
  std::vector<int> owner;
  for (const auto& loc : sj.map.ranks) owner.push_back(nodes[static_cast<size_t>(loc.node)]);
  modex_.add_namespace(sj.nspace, owner);
  for (int member : members_)
    if (!tree_.lost(member)) p.waiting.push_back(member);
  for (size_t i = 0; i < sj.map.nodes.size(); ++i) {
    long n = static_cast<long>(sj.map.nodes[i].ranks.size());
    p.planned[nodes[i]] = n;
    hooks_.add_live(nodes[i], n);
    if (std::find(p.waiting.begin(), p.waiting.end(), nodes[i]) == p.waiting.end())
      p.waiting.push_back(nodes[i]);
  }
  logger("ctrl")->info("spawn {} from rank {}: {} process(es) on {} node(s)", sj.nspace,
                       p.parent_rank, sj.map.world_size, sj.map.nodes.size());
  for (int n : p.waiting) tree_.send(n, ctrl::SpawnStart{sj});
}

void SpawnRelay::on_started(int node, ctrl::SpawnStarted& m) {
  auto it = pending_.find(m.nspace);
  if (it == pending_.end()) return;  // of an earlier generation
  Pending& p = it->second;
  if (std::find(p.waiting.begin(), p.waiting.end(), node) == p.waiting.end())
    throw wire::WireError("spawn-started twice or from a stranger");
  // What did not start is not running there.
  if (!m.error.empty()) hooks_.add_live(node, static_cast<long>(m.started) - p.planned[node]);
  answered(it, node, m.error);
}

void SpawnRelay::on_node_ready(const std::string& host) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    auto& starting = it->second.starting;
    auto s = std::find(starting.begin(), starting.end(), host);
    if (s != starting.end()) {
      starting.erase(s);
      if (starting.empty()) launch(it);
    }
    it = next;
  }
}

void SpawnRelay::on_node_lost(int node, const std::string& why) {
  std::string host = hooks_.host(node);
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    Pending& p = it->second;
    if (std::find(p.starting.begin(), p.starting.end(), host) != p.starting.end()) {
      p.error = "node " + host + ": " + why;
      finish(it);  // not started anywhere yet
    } else if (std::find(p.waiting.begin(), p.waiting.end(), node) != p.waiting.end()) {
      answered(it, node, why);
    }
    it = next;
  }
}

// `node` answered (or is gone, with `error`): once every node has, the spawn is done.
void SpawnRelay::answered(PendingIt it, int node, const std::string& error) {
  Pending& p = it->second;
  p.waiting.erase(std::find(p.waiting.begin(), p.waiting.end(), node));
  if (!error.empty() && p.error.empty()) p.error = "node " + hooks_.host(node) + ": " + error;
  if (p.waiting.empty()) finish(it);
}

// The asking node gets the namespace, or the reason; a spawn that failed has what did start
// stopped first.
void SpawnRelay::finish(PendingIt it) {
  Pending done = std::move(it->second);
  std::string nspace = it->first;
  pending_.erase(it);
  if (!done.error.empty()) {
    if (!done.planned.empty()) {
      logger("ctrl")->info("spawn {} failed: stopping its processes", nspace);
      stopped_.insert(done.job.number);
      for (const auto& [n, count] : done.planned)
        if (!tree_.lost(n)) tree_.send(n, ctrl::SpawnStop{done.job.generation, done.job.number});
    }
    return refuse(done.from_node, done.id, done.parent_rank, done.error);
  }
  if (!tree_.lost(done.from_node)) tree_.send(done.from_node, ctrl::SpawnResp{done.id, "", nspace});
}

bool SpawnRelay::stopped(int generation, int spawn) const {
  return generation == gen_.generation && stopped_.count(spawn) > 0;
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
