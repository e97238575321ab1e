#include "exec/frontend/remote_workers.hpp"

#include <algorithm>
#include <cstdlib>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/master_addr.hpp"

namespace pe {
namespace {

// A node let go is told so (Leave): its connection's last bytes get this long, in seconds.
constexpr double kLeaveFlush = 0.05;
// An elastic job's first generation waits this long (or --last-call, if longer) for first nodes
// still starting once --nnodes MIN are ready, as torchrun's rendezvous has a last call: ssh to
// many hosts takes a few seconds more for some (at most PYTORCH_EXEC_DAEMON_TIMEOUT).
constexpr double kFirstNodesWait = 10.0;

// Variables carried to daemons started over ssh or a launch agent (besides -x).
constexpr const char* kCarriedPrefixes[] = {"OMPI_",    "PMIX_MCA_", "NCCL_",
                                            "PYTORCH_", "TORCH_",    "CUDA_"};

}  // namespace

WorkerSetSource workers_for(const JobMap& map, const std::string& host, bool grow,
                            UniqueFd endpoint) {
  WorkerSetSource s;
  // Hosts of the list without ranks (MPI_Comm_spawn may ask for them) need daemons, so a job
  // that lists them has one on this machine too, as mpirun has on every host of its list.
  s.local = !grow && map.nodes.size() == 1 && is_local_host(map.nodes[0].host, host) &&
            map.spawn_hosts.empty();
  if (s.local) {
    s.make = [](const WorkerSetContext& c) -> std::unique_ptr<WorkerSet> {
      return std::make_unique<LocalWorkers>(c.loop, c.listener, c.cfg, c.env, c.map, c.job_id,
                                            c.stdin_how);
    };
  } else {
    auto ep = std::make_shared<UniqueFd>(std::move(endpoint));  // std::function copies
    s.make = [host, ep](const WorkerSetContext& c) -> std::unique_ptr<WorkerSet> {
      return std::make_unique<RemoteWorkers>(c.loop, c.listener, c.cfg, c.env, c.map, c.job_id,
                                             host, c.stdin_how == StdinHow::Forward, c.node_ready,
                                             c.join, c.running, std::move(*ep));
    };
  }
  return s;
}

RemoteWorkers::RemoteWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg,
                             const EnvMap& env, const JobMap& map, const std::string& job_id,
                             const std::string& host, bool stdin_forwarded,
                             std::function<void(const std::string&)> node_ready, JoinFn join,
                             std::function<void(int)> running, UniqueFd endpoint)
    : loop_(loop),
      listener_(listener),
      cfg_(cfg),
      env_(env),
      map_(map),
      job_id_(job_id),
      secret_(cfg.rdzv_key.empty() ? auth::new_secret() : cfg.rdzv_key),
      slurm_(map.slurm && cfg.launch_agent.empty()),
      stdin_forwarded_(stdin_forwarded),
      nodes_(map.nodes.size()),
      tree_(static_cast<int>(map.nodes.size()), cfg.tree_radix,
            {[this](int node, wire::Frame& f) { dispatch_.dispatch(f, node); },
             [this](int node, const std::string& why) { node_lost(node, why); }}),
      beats_(
          loop, ctrl::HeartbeatSettings{cfg.heartbeat_interval, cfg.heartbeat_timeout},
          [this](int node) {
            if (auto* link = nodes_[static_cast<size_t>(node)].direct)
              link->send(ctrl::Heartbeat{});
          },
          [this](int node) {
            lose_silent(node, "lost contact with its daemon (" +
                                  ctrl::silence(beats_.settings().timeout) + ")");
          }),
      modex_(tree_),
      spawn_(tree_, modex_, cfg.oversubscribe,
             {[this](int n) { return nodes_[static_cast<size_t>(n)].live; },
              [this](int n, long k) {
                auto& live = nodes_[static_cast<size_t>(n)].live;
                live = static_cast<size_t>(std::max(0L, static_cast<long>(live) + k));
              },
              [this](int n) { return nodes_[static_cast<size_t>(n)].host; },
              [this](const std::string& h) { return spawn_node(h); },
              [this](const std::string& h) { return listener_.on_spawn_host(h); }}),
      launcher_(loop, cfg, env, map, host, slurm_,
                [this](const std::vector<int>& nodes, const std::string& why, int incarnation) {
                  // An elastic job's one srun for every daemon fails as a whole when one node
                  // cannot take a step (DOWN, drained): each node not connected then gets an
                  // srun of its own, so that only that node is lost.
                  bool retry = slurm_ && cfg_.nnodes_min > 0 && nodes.size() > 1;
                  for (int n : nodes)
                    if (nodes_[static_cast<size_t>(n)].incarnation == incarnation &&
                        !tree_.attached(n) && !tree_.lost(n)) {
                      if (retry)
                        launcher_.launch_node(n, incarnation);
                      else
                        tree_.lose(n, why);
                    }
                }),
      node_ready_(std::move(node_ready)),
      join_(cfg.join_mode() ? std::move(join) : JoinFn()),
      running_(std::move(running)) {
  endpoint_ = std::move(endpoint);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i].host = map_.nodes[i].host;
    by_host_[nodes_[i].host] = static_cast<int>(i);
  }
  if (!nodes_.empty()) own_host_ = nodes_[0].host;
  use_map(map_);
  using namespace ctrl;
  dispatch_
      .on<Joined>([this](int n, Joined&) { on_joined(n); })
      .on<Ready>([this](int n, Ready& m) { on_ready(n, m); })
      .on<Port>([this](int n, Port& m) { on_port(n, m); })
      .on<Output>([this](int, Output& m) {
        Stream s = m.stream == 1 ? Stream::Out : Stream::Err;
        if (m.spawn)
          listener_.on_spawned_output(m.generation, m.spawn, m.rank, s, m.data);
        else
          listener_.on_output(m.generation, valid_rank(m.rank), s, m.data);
      })
      .on<Exit>([this](int n, Exit& m) { on_exit(n, m); })
      .on<Abort>([this](int, Abort& m) {
        listener_.on_abort(m.generation, valid_rank(m.rank), m.pid, m.status, m.message);
      })
      .on<Fence>([this](int n, Fence& m) { modex_.on_fence(n, m); })
      .on<DmodexReq>([this](int n, DmodexReq& m) { modex_.on_request(n, m); })
      .on<DmodexResp>([this](int, DmodexResp& m) { modex_.on_response(m); })
      .on<StartFailed>([this](int n, StartFailed& m) { on_start_failed(n, m); })
      .on<StdinDrained>([this](int n, StdinDrained&) { on_stdin_drained(n); })
      .on<SpawnReq>([this](int n, SpawnReq& m) { spawn_.on_request(n, m); })
      .on<SpawnStarted>([this](int n, SpawnStarted& m) { spawn_.on_started(n, m); })
      .on<Publish>([this](int, Publish& m) { spawn_.on_publish(m); })
      .on<Lookup>([this](int n, Lookup& m) { spawn_.on_lookup(n, m); })
      .on<Unpublish>([this](int, Unpublish& m) { spawn_.on_unpublish(m); })
      .on<Leave>([this](int n, Leave& m) { nodes_[static_cast<size_t>(n)].leaving = m.why; });
}

RemoteWorkers::~RemoteWorkers() {
  acceptor_.reset();
  // A node still starting has no daemon to see the close: what started it alone ends now (not
  // after the launchers' wait for the others to exit); all of them before a relay's loss marks
  // the nodes below it lost too.
  for (int i = 0; i < tree_.size(); ++i)
    if (!nodes_[static_cast<size_t>(i)].ready && !tree_.lost(i))
      launcher_.kill_node(i, nodes_[static_cast<size_t>(i)].incarnation);
  for (int i = 0; i < tree_.size(); ++i) tree_.lose(i, "");  // the daemons see the close, exit
}

std::string RemoteWorkers::format_map() const { return format_job_map(gen_, {}); }

void RemoteWorkers::use_map(const JobMap& map) {
  remap_ = gen_.world_size > 0;  // the daemons have the job's own map to begin with
  gen_ = map;
  members_.clear();
  for (const auto& n : gen_.nodes) {
    auto it = by_host_.find(n.host);
    if (it == by_host_.end()) throw Error("a job map with node " + n.host + " outside the job");
    members_.push_back(it->second);
  }
  owner_.clear();
  for (const auto& loc : gen_.ranks) owner_.push_back(members_[static_cast<size_t>(loc.node)]);
}

std::string RemoteWorkers::host_of_rank(int rank) const {
  return nodes_[static_cast<size_t>(owner_.at(static_cast<size_t>(rank)))].host;
}

EnvMap RemoteWorkers::carried_environment() const {
  if (slurm_) return env_;  // as srun does: the launching shell's whole environment
  EnvMap out;
  for (const auto& [k, v] : env_)
    for (const char* p : kCarriedPrefixes)
      if (k.rfind(p, 0) == 0) out[k] = v;
  return out;
}

void RemoteWorkers::prepare(std::function<void()> ready) {
  ready_ = std::move(ready);
  if (::access(launcher_.execd().c_str(), X_OK) != 0)
    throw ProgramError("cannot find pytorch_execd next to pytorch_exec (" + launcher_.execd() + ")",
                       1);
  acceptor_ = std::make_unique<ctrl::Acceptor>(
      loop_, secret_, [this](const ctrl::Hello& h) { return check_node(h); },
      [this](const std::string& name, std::unique_ptr<ctrl::Connection> conn) {
        on_authenticated(by_host_.at(name), std::move(conn));
      },
      join_ ? cfg_.rdzv_port : 0, std::move(endpoint_));
  addresses_ = local_ipv4_addresses();
  daemon_timeout_ = daemon_timeout(env_);
  first_nodes_ = static_cast<int>(nodes_.size());
  // The first nodes' daemons (not those started later, which have deadlines of their own).
  ready_timer_ = loop_.timer([this] {
    for (int i = 0; i < first_nodes_; ++i)
      if (!nodes_[static_cast<size_t>(i)].ready && !tree_.lost(i) &&
          nodes_[static_cast<size_t>(i)].incarnation == 0)
        lose_silent(i, not_reported());
  });
  ready_timer_.arm(daemon_timeout_);
  quorum_timer_ = loop_.timer([this] { prepared(); });
  logger("ctrl")->info("control plane on port {} ({}); starting {} daemon(s) with {}",
                       acceptor_->port(), join(addresses_, ","), nodes_.size(),
                       slurm_ ? "srun" : "a launch agent");
  launcher_.launch(addresses_, acceptor_->port(), secret_);
}

// A node that proved it knows the secret: one of ours whose daemon we started, or (join mode) a
// node that started by itself and asks to join, which the controller admits or refuses.
ctrl::Verdict RemoteWorkers::check_node(const ctrl::Hello& h) {
  const std::string& name = h.node;
  bool joining = join_ && h.join_slots >= 0;
  auto it = by_host_.find(name);
  if (it != by_host_.end() && !(joining && tree_.lost(it->second))) {
    int n = it->second;
    if (joining && name != own_host_)  // a restarted pod, its old self not yet lost
      return ctrl::Verdict("node '" + name + "' is in the job already (its pytorch_exec "
                           "restarted? it is taken once the other is found lost)",
                           true);
    if (joining) {
      // Another agent on the rendezvous host's machine, as torchrun's may be (nodes simulated
      // on one machine): a node of its own named HOST#2 (#3, ...; one lost before is taken
      // again).
      std::string alias;
      for (int k = 2; alias.empty(); ++k) {
        auto a = by_host_.find(name + "#" + std::to_string(k));
        if (a == by_host_.end() || tree_.lost(a->second)) alias = name + "#" + std::to_string(k);
      }
      ctrl::Verdict v = join_(alias, h.join_slots, h.node_rank);
      if (v.why.empty()) v.name = alias;
      return v;
    }
    if (tree_.attached(n) || tree_.waiting(n) || tree_.lost(n))
      return "node '" + name + "' is already connected";
    return "";
  }
  if (!joining) return "node '" + name + "' is not in the job";
  return join_(name, h.join_slots, h.node_rank);
}

void RemoteWorkers::on_joined(int node) {
  Node& n = nodes_[static_cast<size_t>(node)];
  if (n.job_sent) throw wire::WireError("joined twice");
  n.job_sent = true;
  if (prepared_) remap_ = true;  // it learns the generation's map before a start
  tree_.send(node, ctrl::Job{node_job_for(
                       cfg_, map_, job_id_, node, carried_environment(), slurm_,
                       stdin_forwarded_ ? StdinHow::Forward : StdinHow::DevNull)});
  // A node for spawned processes: it knows the running generation (its PMIx namespace) at once.
  if (n.spawn_only && started_) {
    tree_.send(node, ctrl::Remap{gen_});
    tree_.send(node, ctrl::Start{gen_info_});
  }
}

// The tree node of a ready node for spawned processes only on `host`, else -1.
int RemoteWorkers::spawn_node(const std::string& host) const {
  auto it = by_host_.find(host);
  if (it == by_host_.end()) return -1;
  const Node& n = nodes_[static_cast<size_t>(it->second)];
  return n.spawn_only && n.ready && !tree_.lost(it->second) ? it->second : -1;
}

void RemoteWorkers::on_authenticated(int node, std::unique_ptr<ctrl::Connection> conn) {
  Node& n = nodes_[static_cast<size_t>(node)];
  ctrl::Connection* c = conn.get();
  auto link = std::make_unique<ctrl::ConnLink>(loop_, std::move(conn));
  bool direct = ctrl::tree_parent(node, cfg_.tree_radix) < 0;
  if (direct) {
    n.direct = link.get();
    n.seen = peer_address(c->fd());
    logger("ctrl")->info("node {} ({}) connected from {}", node, n.host, n.seen);
    beats_.watch(node, ctrl::kStartingTimeout);  // until it is ready (on_ready)
  }
  c->on_frame([this, node](wire::Frame& f) {
    beats_.heard(node);
    if (f.type != static_cast<uint16_t>(ctrl::Msg::Heartbeat)) tree_.frame_from(node, f);
  });
  c->on_closed([this, node](const std::string& why) {
    loop_.post([this, node, why] { tree_.link_closed(node, why); });
  });
  tree_.attach(node, std::move(link));
}

void RemoteWorkers::on_ready(int node, ctrl::Ready& m) {
  Node& n = nodes_[static_cast<size_t>(node)];
  n.port = m.port;
  n.addrs = std::move(m.addrs);
  n.ready = true;
  beats_.settle(node);  // a direct child's link: heartbeats from now on
  tree_.relay_ready(node, n.addrs, m.child_port);
  if (prepared_) {
    n.deadline.disarm();
    logger("ctrl")->info("node {} ({}) ready", node, n.host);
    if (node_ready_) node_ready_(n.host);
    spawn_.on_node_ready(n.host);
  }
  check_ready();
}

// After a start, a node's workers run (or its StartFailed follows): the port of the store for
// the next generation comes with that news.
void RemoteWorkers::on_port(int node, ctrl::Port& m) {
  nodes_[static_cast<size_t>(node)].port = m.port;
  auto it = std::find(unstarted_.begin(), unstarted_.end(), node);
  if (it == unstarted_.end()) return;
  unstarted_.erase(it);
  if (unstarted_.empty() && running_) running_(gen_info_.generation);
}

// The controller put the node in map_ already.  Its place in the tree is new, or a lost node's.
void RemoteWorkers::add_node(int slot) {
  if (ctrl::tree_parent(slot, cfg_.tree_radix) >= 0)
    throw Error("node " + std::to_string(slot) + " would not be a child of the front end");
  if (slot == static_cast<int>(nodes_.size())) {
    nodes_.emplace_back();
    tree_.add_node();
  } else {
    int incarnation = nodes_.at(static_cast<size_t>(slot)).incarnation;
    auto old = by_host_.find(nodes_[static_cast<size_t>(slot)].host);
    if (old != by_host_.end() && old->second == slot) by_host_.erase(old);
    nodes_[static_cast<size_t>(slot)] = Node{};
    nodes_[static_cast<size_t>(slot)].incarnation = incarnation + 1;
    tree_.revive(slot);
  }
  Node& n = nodes_[static_cast<size_t>(slot)];
  n.host = map_.nodes.at(static_cast<size_t>(slot)).host;
  n.spawn_only = map_.nodes[static_cast<size_t>(slot)].ranks.empty();
  by_host_[n.host] = slot;
  n.deadline = loop_.timer([this, slot] { lose_silent(slot, not_reported()); });
  n.deadline.arm(daemon_timeout_);
  if (join_) {  // it is connecting by itself: its connection is accepted next
    logger("ctrl")->info("node {} ({}) joins", slot, n.host);
    return;
  }
  logger("ctrl")->info("node {} ({}): starting its daemon", slot, n.host);
  launcher_.launch_node(slot, n.incarnation);
}

// A node that does not answer (a daemon that never reported, or went silent): lost, and what
// started its daemon alone is ended (a launch agent waiting for an unreachable host, an srun of
// its own; the srun of several nodes is left alone).
void RemoteWorkers::lose_silent(int node, const std::string& why) {
  tree_.lose(node, why);
  launcher_.kill_node(node, nodes_[static_cast<size_t>(node)].incarnation);
}

std::string RemoteWorkers::not_reported() const {
  return "its daemon did not report within " + std::to_string(static_cast<int>(daemon_timeout_)) +
         " s (PYTORCH_EXEC_DAEMON_TIMEOUT)";
}

void RemoteWorkers::remove_node(int slot, const std::string& why) {
  Node& n = nodes_.at(static_cast<size_t>(slot));
  logger("ctrl")->info("node {} ({}): closing its connection ({})", slot, n.host, why);
  if (n.direct) {  // told first, so that it does not report a lost front end (a host that
                   // reads nothing is not waited for: the event loop goes on)
    n.direct->send(ctrl::Leave{why});
    n.direct->conn().flush_and_close(kLeaveFlush);
  }
  tree_.lose(slot, why);  // the daemon sees its connection close, stops its workers, exits
}

void RemoteWorkers::end_job(int status) {
  if (!join_) return;
  tree_.broadcast(ctrl::JobEnd{status});
  for (auto& n : nodes_)
    if (n.direct) n.direct->finish();  // flushed before the links are dropped
}

void RemoteWorkers::on_exit(int node, ctrl::Exit& m) {
  if (m.e.spawn == 0) valid_rank(m.e.rank);
  m.e.stopped = m.e.spawn && spawn_.stopped(m.e.generation, m.e.spawn);
  Node& n = nodes_[static_cast<size_t>(node)];
  if (n.live > 0) --n.live;
  listener_.on_exit(m.e);
}

void RemoteWorkers::on_start_failed(int node, ctrl::StartFailed& m) {
  Node& n = nodes_[static_cast<size_t>(node)];
  if (n.spawn_only && n.live == 0)  // only the spawns that wait for it fail
    return tree_.lose(node, "cannot start: " + m.message);
  n.live = static_cast<size_t>(std::max(0, m.started));
  listener_.on_start_failed(n.host, "cannot start the workers: " + m.message);
}

void RemoteWorkers::on_stdin_drained(int node) {
  nodes_[static_cast<size_t>(node)].stdin_inflight = 0;
  if (stdin_backlog() == 0) listener_.on_stdin_drained();
}

void RemoteWorkers::node_lost(int node, std::string why) {
  const Node& lost = nodes_[static_cast<size_t>(node)];
  bool idle_spawn_node = lost.spawn_only && lost.live == 0;
  // The nodes below it in the tree go with it (their daemons see their parent go and exit).
  for (int i = 0; i < tree_.size(); ++i) {
    if (!ctrl::in_subtree(node, i, cfg_.tree_radix)) continue;
    Node& m = nodes_[static_cast<size_t>(i)];
    beats_.forget(i);
    m.ready = false;
    m.live = 0;
    m.stdin_inflight = 0;
    m.direct = nullptr;
  }
  if (why.empty()) return;  // shutting down
  // A node that said it leaves (one that joined by itself, its pytorch_exec signalled) did not
  // lose contact: it left.
  if (const std::string& leaving = nodes_[static_cast<size_t>(node)].leaving; !leaving.empty())
    why = "left the job (" + leaving + ")";
  logger("ctrl")->info("node {} ({}) lost: {}", node, nodes_[static_cast<size_t>(node)].host, why);
  std::vector<std::string> below;
  for (int i = 0; i < tree_.size(); ++i) {
    if (!ctrl::in_subtree(node, i, cfg_.tree_radix)) continue;
    spawn_.on_node_lost(i, why);
    if (i != node) below.push_back(nodes_[static_cast<size_t>(i)].host);
  }
  const std::string& host = nodes_[static_cast<size_t>(node)].host;
  if (!idle_spawn_node) {
    listener_.on_nodes_lost(host, why, below);
    // An elastic job may start without it now: looked at once every loss at hand is reported.
    return loop_.post([this] { check_ready(); });
  }
  // A node for spawned processes that runs none yet: only the spawns waiting for it fail.  The
  // nodes below it, if any, are lost with it.
  listener_.on_spawn_host_lost(host, why);
  if (!below.empty())
    listener_.on_nodes_lost(below.front(),
                            "lost with the relay " + host + " above it (" + why + ")",
                            std::vector<std::string>(below.begin() + 1, below.end()));
  check_ready();  // an elastic job starts without it
}

// Every node has reported, or is lost (an elastic job goes on without it).  An elastic job
// does not wait for them all: once --nnodes MIN nodes with ranks are ready, the others (spares
// too) have kFirstNodesWait (or --last-call) to join the first generation, as in torchrun's
// rendezvous; those still starting then join a later one when ready, as arrivals do.
void RemoteWorkers::check_ready() {
  if (prepared_) return;
  int ready = 0, ranked = 0, starting = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].ready) {
      ++ready;
      ranked += !nodes_[i].spawn_only;
    } else if (!tree_.lost(static_cast<int>(i))) {
      ++starting;
    }
  }
  if (ready == 0) return;
  if (starting == 0) return prepared();
  if (cfg_.nnodes_min > 0 && !join_ && ranked >= cfg_.nnodes_min && !quorum_timer_.pending()) {
    double wait = std::min(daemon_timeout_, std::max(cfg_.last_call, kFirstNodesWait));
    logger("ctrl")->info("{} of {} daemons ready: the others have {} s more", ready,
                         nodes_.size(), wait);
    quorum_timer_.arm(wait);
  }
}

void RemoteWorkers::prepared() {
  if (prepared_) return;
  prepared_ = true;
  quorum_timer_.disarm();
  size_t ready = 0;
  for (const auto& n : nodes_) ready += n.ready;
  if (ready == nodes_.size()) ready_timer_.disarm();  // else it still bounds the others' start
  logger("ctrl")->info("{} of {} daemons ready", ready, nodes_.size());
  ready_();
}

int RemoteWorkers::valid_rank(int rank) const {
  if (rank < 0 || rank >= gen_.world_size)
    throw wire::WireError("bad rank " + std::to_string(rank));
  return rank;
}

RemoteWorkers::Node& RemoteWorkers::node_of_rank(int rank) {
  return nodes_[static_cast<size_t>(owner_.at(static_cast<size_t>(rank)))];
}

std::string RemoteWorkers::master_addr() {
  std::vector<NodeAddresses> view;
  for (const auto& n : nodes_)
    view.push_back(
        NodeAddresses{n.seen, n.direct ? local_address(n.direct->conn().fd()) : "", n.addrs});
  return choose_master_addr(owner_.at(0), view, addresses_, route_source_address);
}

int RemoteWorkers::master_port() { return node_of_rank(0).port; }

void RemoteWorkers::start(const GenerationInfo& gen) {
  modex_.reset(members_, owner_);
  spawn_.reset(gen, gen_, members_);
  for (auto& n : nodes_) n.live = 0;
  for (size_t g = 0; g < members_.size(); ++g) {
    int i = members_[g];
    if (tree_.lost(i))
      throw Error("node " + nodes_[static_cast<size_t>(i)].host + " is not connected");
    nodes_[static_cast<size_t>(i)].live = gen_.nodes[g].ranks.size();
  }
  if (remap_) tree_.broadcast(ctrl::Remap{gen_});
  remap_ = false;
  gen_info_ = gen;
  started_ = true;
  unstarted_ = members_;
  tree_.broadcast(ctrl::Start{gen});
}

void RemoteWorkers::signal_all(int sig) { tree_.broadcast(ctrl::Signal{sig}); }

void RemoteWorkers::notify_failure(int generation, int spawn, int rank, int exit_code,
                                   bool aborted) {
  tree_.broadcast(ctrl::ProcFailed{generation, rank, exit_code, aborted, spawn});
}

size_t RemoteWorkers::live() const {
  size_t total = 0;
  for (const auto& n : nodes_) total += n.live;
  return total;
}

void RemoteWorkers::stdin_write(int rank, std::string_view data) {
  int node = owner_.at(static_cast<size_t>(rank));
  if (tree_.lost(node)) return;
  tree_.send(node, ctrl::Stdin{rank, std::string(data)});
  nodes_[static_cast<size_t>(node)].stdin_inflight += data.size();
}

void RemoteWorkers::stdin_close_all() { tree_.broadcast(ctrl::StdinClose{}); }

size_t RemoteWorkers::stdin_backlog() const {
  size_t total = 0;
  for (const auto& n : nodes_) total += n.stdin_inflight;
  return total;
}

}  // namespace pe
