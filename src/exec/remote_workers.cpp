#include "exec/remote_workers.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/allocation.hpp"
#include "exec/cli.hpp"

namespace pe {
namespace {

constexpr double kLauncherExitWait = 5.0;

// Variables carried to daemons started over ssh or a launch agent (besides -x).
constexpr const char* kCarriedPrefixes[] = {"OMPI_", "PMIX_MCA_", "NCCL_", "PYTORCH_", "TORCH_", "CUDA_"};

double daemon_timeout(const EnvMap& env) {
  auto it = env.find("PYTORCH_EXEC_DAEMON_TIMEOUT");
  if (it == env.end()) return 60.0;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (!end || *end || !(v > 0)) throw UsageError("PYTORCH_EXEC_DAEMON_TIMEOUT: '" + it->second + "' is not a number of seconds");
  return v;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:,=@+") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string execd_path() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "pytorch_execd";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "pytorch_execd";
}

}  // namespace

struct RemoteWorkers::Node {
  int index = 0;
  std::string host;
  int via = 0;             // the node (a child of the front end) whose connection reaches it
  std::unique_ptr<ctrl::Connection> conn;     // children of the front end only
  std::unique_ptr<ctrl::Connection> waiting;  // a deeper node's first connection, until redirected
  bool connected = false;  // its daemon got through the handshake (to us or to its parent)
  std::string addr;        // the daemon's address as we see it (children of the front end)
  std::vector<std::string> addrs;  // its own addresses, and
  int child_port = 0;      // where its children in the tree connect
  bool job_sent = false;
  bool ready = false;
  bool lost = false;
  size_t live = 0;
  size_t stdin_inflight = 0;
  int port = 0;            // a port free on the node, for MASTER_PORT
};

struct RemoteWorkers::Launcher {
  std::string what;        // argv[0], for messages
  std::vector<int> nodes;
  ChildProcess proc;
  Event out_ev, err_ev;
  LineBuffer out_buf, err_buf;
  bool exited = false;
};

RemoteWorkers::RemoteWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg,
                             const EnvMap& env, const JobMap& map, const std::string& job_id,
                             const std::string& host, bool stdin_forwarded)
    : loop_(loop), listener_(listener), cfg_(cfg), env_(env), map_(map), job_id_(job_id), host_(host),
      secret_(auth::new_secret()), slurm_(map.slurm && cfg.launch_agent.empty()),
      stdin_forwarded_(stdin_forwarded), execd_(execd_path()) {
  for (size_t i = 0; i < map_.nodes.size(); ++i) {
    auto n = std::make_unique<Node>();
    n->index = static_cast<int>(i);
    n->host = map_.nodes[i].host;
    node_by_host_[n->host] = n->index;
    int top = n->index;
    while (ctrl::tree_parent(top, cfg_.tree_radix) >= 0) top = ctrl::tree_parent(top, cfg_.tree_radix);
    n->via = top;
    nodes_.push_back(std::move(n));
  }
}

RemoteWorkers::~RemoteWorkers() {
  acceptor_.reset();
  for (auto& n : nodes_) {  // daemons see the close, kill what is left, exit
    n->conn.reset();
    n->waiting.reset();
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kLauncherExitWait);
  for (auto& l : launchers_) {
    while (!l->exited && std::chrono::steady_clock::now() < deadline) {
      pid_t r = ::waitpid(l->proc.pid, nullptr, WNOHANG);
      if (r == l->proc.pid || (r < 0 && errno == ECHILD)) l->exited = true;
      else ::usleep(5000);
    }
    if (!l->exited) {
      logger("ctrl")->warn("{} (pid {}) did not exit: killing it", l->what, l->proc.pid);
      ::kill(-l->proc.pid, SIGKILL);
      ::waitpid(l->proc.pid, nullptr, 0);
    }
  }
}

std::string RemoteWorkers::format_map() const { return format_job_map(map_, {}); }

std::string RemoteWorkers::host_of_rank(int rank) const {
  return map_.nodes.at(static_cast<size_t>(map_.ranks.at(static_cast<size_t>(rank)).node)).host;
}

EnvMap RemoteWorkers::carried_environment() const {
  if (slurm_) return env_;  // as srun does: the launching shell's whole environment
  EnvMap out;
  for (const auto& [k, v] : env_)
    for (const char* p : kCarriedPrefixes)
      if (k.rfind(p, 0) == 0) out[k] = v;
  return out;
}

std::vector<std::string> RemoteWorkers::daemon_argv(int node, bool slurm) const {
  std::string connect;
  for (const auto& a : addresses_) connect += (connect.empty() ? "" : ",") + a + ":" + std::to_string(port_);
  std::vector<std::string> argv{execd_, "--connect", connect};
  if (slurm) {
    argv.push_back("--slurm");
  } else {
    argv.insert(argv.end(), {"--node", map_.nodes.at(static_cast<size_t>(node)).host, "--secret-stdin"});
  }
  return argv;
}

std::vector<std::string> RemoteWorkers::launch_command(int node) const {
  const std::string& host = map_.nodes.at(static_cast<size_t>(node)).host;
  auto daemon = daemon_argv(node, false);
  if (cfg_.launch_agent.empty() && is_local_host(host, host_)) return daemon;
  std::string agent = cfg_.launch_agent.empty() ? "ssh -x -o BatchMode=yes" : cfg_.launch_agent;
  std::vector<std::string> argv;
  bool placed = false;
  for (auto word : split_words(agent)) {
    for (size_t at; (at = word.find("{host}")) != std::string::npos; placed = true) word.replace(at, 6, host);
    argv.push_back(word);
  }
  if (argv.empty()) throw UsageError("--launch-agent is empty");
  if (!placed) argv.push_back(host);
  std::string base = argv[0].substr(argv[0].rfind('/') + 1);
  if (base == "ssh" || base == "rsh") {
    // The remote shell parses the command: one quoted string.
    std::string cmd;
    for (const auto& a : daemon) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
    argv.push_back(cmd);
  } else {
    argv.insert(argv.end(), daemon.begin(), daemon.end());
  }
  return argv;
}

void RemoteWorkers::prepare(std::function<void()> ready) {
  ready_ = std::move(ready);
  if (::access(execd_.c_str(), X_OK) != 0)
    throw ProgramError("cannot find pytorch_execd next to pytorch_exec (" + execd_ + ")", 1);
  acceptor_ = std::make_unique<ctrl::Acceptor>(
      loop_, secret_,
      [this](const std::string& name) -> std::string {
        auto it = node_by_host_.find(name);
        if (it == node_by_host_.end()) return "node '" + name + "' is not in the job";
        const Node& n = *nodes_[static_cast<size_t>(it->second)];
        if (n.connected || n.waiting || n.lost) return "node '" + name + "' is already connected";
        return "";
      },
      [this](const std::string& name, std::unique_ptr<ctrl::Connection> conn) {
        on_authenticated(*nodes_[static_cast<size_t>(node_by_host_.at(name))], std::move(conn));
      });
  port_ = acceptor_->port();
  addresses_ = local_ipv4_addresses();
  sigchld_ev_ = loop_.watch_signal(SIGCHLD, [this] { on_sigchld(); });
  double timeout = daemon_timeout(env_);
  ready_timer_ = loop_.timer([this, timeout] {
    for (auto& n : nodes_)
      if (!n->ready && !n->lost)
        return node_lost(*n, "its daemon did not report within " + std::to_string(static_cast<int>(timeout)) +
                                 " s (PYTORCH_EXEC_DAEMON_TIMEOUT)");
  });
  ready_timer_.arm(timeout);
  logger("ctrl")->info("control plane on port {} ({}); starting {} daemon(s) with {}", port_,
                       join(addresses_, ","), nodes_.size(), slurm_ ? "srun" : "a launch agent");
  launch_daemons();
}

void RemoteWorkers::launch_daemons() {
  if (slurm_) {
    std::vector<std::string> hosts;
    std::vector<int> all;
    for (auto& n : nodes_) {
      hosts.push_back(n->host);
      all.push_back(n->index);
    }
    std::string count = std::to_string(nodes_.size());
    std::vector<std::string> argv{"srun", "--nodes=" + count, "--ntasks=" + count, "--ntasks-per-node=1",
                                  "--nodelist=" + join(hosts, ","), "--overlap", "--whole", "--mpi=none",
                                  "--cpu-bind=none", "--kill-on-bad-exit=0", "--export=ALL",
                                  "--job-name=pytorch_execd", "--input=none"};
    auto d = daemon_argv(0, true);
    argv.insert(argv.end(), d.begin(), d.end());
    start_launcher(std::move(argv), std::move(all), false);
    return;
  }
  for (auto& n : nodes_) start_launcher(launch_command(n->index), {n->index}, true);
}

void RemoteWorkers::start_launcher(std::vector<std::string> argv, std::vector<int> nodes, bool secret_on_stdin) {
  auto l = std::make_unique<Launcher>();
  l->what = argv[0];
  l->nodes = std::move(nodes);
  SpawnSpec spec;
  auto path = env_.count("PATH") ? env_.at("PATH") : std::string("/usr/bin:/bin");
  try {
    spec.path = resolve_program(argv[0], "", path);
  } catch (const Error& e) {
    for (int i : l->nodes) node_lost(*nodes_[static_cast<size_t>(i)], std::string("cannot start its daemon: ") + e.what());
    return;
  }
  spec.argv = std::move(argv);
  EnvMap env = environment_from(environ);
  if (!secret_on_stdin) env["PYTORCH_EXEC_SECRET"] = auth::to_hex(secret_);
  spec.envp = to_envp(env);
  spec.stdin_pipe = true;
  logger("ctrl")->debug("launching: {}", join(spec.argv, " "));
  l->proc = spawn_child(spec);
  if (secret_on_stdin) {
    std::string line = auth::to_hex(secret_) + "\n";
    write_all(l->proc.stdin_w.get(), line.data(), line.size());
  }
  l->proc.stdin_w.reset();
  // The launchers' own output (ssh or srun errors, daemon messages) goes to our stderr, line by
  // line, except srun's note that the cluster cannot bind CPUs (we asked it not to).
  Launcher* lp = l.get();
  auto forward = [this, lp](bool out) {
    UniqueFd& fd = out ? lp->proc.stdout_r : lp->proc.stderr_r;
    LineBuffer& lb = out ? lp->out_buf : lp->err_buf;
    char buf[65536];
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    std::string text;
    if (n > 0) {
      text = std::string(lb.append(buf, static_cast<size_t>(n)));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      (out ? lp->out_ev : lp->err_ev) = Event();
      text = lb.take_rest();
      if (!text.empty()) text += "\n";
    }
    for (const auto& line : split(text, '\n')) {
      if (line.empty()) continue;
      if (line.find("lacks support for cpu binding") != std::string::npos) {
        logger("ctrl")->debug("{}: {}", lp->what, line);
        continue;
      }
      std::string l2 = line + "\n";
      write_all(2, l2.data(), l2.size());
    }
  };
  l->out_ev = loop_.watch_readable(l->proc.stdout_r.get(), [forward] { forward(true); });
  l->err_ev = loop_.watch_readable(l->proc.stderr_r.get(), [forward] { forward(false); });
  launchers_.push_back(std::move(l));
}

void RemoteWorkers::on_sigchld() {
  for (auto& l : launchers_) {
    if (l->exited) continue;
    int status = 0;
    if (::waitpid(l->proc.pid, &status, WNOHANG) != l->proc.pid) continue;
    l->exited = true;
    logger("ctrl")->info("{} (pid {}) {}", l->what, l->proc.pid, describe_wait_status(status));
    for (int i : l->nodes) {
      Node& n = *nodes_[static_cast<size_t>(i)];
      if (!n.connected && !n.lost)
        node_lost(n, "its daemon could not be started (" + l->what + " " + describe_wait_status(status) + ")");
    }
  }
}

void RemoteWorkers::on_authenticated(Node& n, std::unique_ptr<ctrl::Connection> conn) {
  if (ctrl::tree_parent(n.index, cfg_.tree_radix) >= 0) {
    n.waiting = std::move(conn);  // redirected to its parent once that one is ready
    n.waiting->on_frame([](wire::Frame&) {});  // its "joined" counts when it reaches its parent
    n.waiting->on_closed([this, np = &n](const std::string& why) {
      loop_.post([this, np, why] { if (np->waiting) node_lost(*np, "lost contact with its daemon (" + why + ")"); });
    });
    redirect_waiting();
    return;
  }
  n.conn = std::move(conn);
  n.connected = true;
  n.addr = peer_address(n.conn->fd());
  Node* np = &n;
  n.conn->on_frame([this, np](wire::Frame& fr) { on_child_frame(*np, fr); });
  n.conn->on_closed([this, np](const std::string& why) {
    loop_.post([this, np, why] { node_lost(*np, "lost contact with its daemon (" + why + ")"); });
  });
  logger("ctrl")->info("node {} ({}) connected from {}", n.index, n.host, n.addr);
}

// Deeper nodes whose parent is ready go to it.
void RemoteWorkers::redirect_waiting() {
  for (auto& n : nodes_) {
    if (!n->waiting) continue;
    Node& parent = *nodes_[static_cast<size_t>(ctrl::tree_parent(n->index, cfg_.tree_radix))];
    if (!parent.ready) continue;
    wire::Writer w;
    w.u32(static_cast<uint32_t>(parent.addrs.size()));
    for (const auto& a : parent.addrs) w.str(a);
    w.i32(parent.child_port);
    n->waiting->send(ctrl::Msg::Redirect, w.data());
    n->waiting->flush_and_close(1.0);
    auto* c = n->waiting.release();
    loop_.post([c] { delete c; });
    n->connected = true;
    logger("ctrl")->info("node {} ({}) sent to its parent, node {}", n->index, n->host, parent.index);
  }
}

void RemoteWorkers::send_job(Node& n) {
  ctrl::JobDescription j;
  j.job_id = job_id_;
  j.node = n.index;
  j.cfg = cfg_;
  j.env = carried_environment();
  j.replace_env = slurm_;
  j.stdin_forwarded = stdin_forwarded_;
  j.tree_radix = cfg_.tree_radix;
  j.map = map_;
  send_to(n, ctrl::Msg::Job, ctrl::encode_job(j));
}

void RemoteWorkers::send_to(Node& n, ctrl::Msg type, std::string_view payload) {
  if (n.conn) return n.conn->send(type, payload);
  Node& top = *nodes_[static_cast<size_t>(n.via)];
  if (top.conn) top.conn->send(ctrl::Msg::Routed, ctrl::wrap(static_cast<uint32_t>(n.index), static_cast<uint16_t>(type), payload));
}

void RemoteWorkers::broadcast(ctrl::Msg type, std::string_view payload) {
  std::string routed = ctrl::wrap(ctrl::kAllNodes, static_cast<uint16_t>(type), payload);
  for (auto& n : nodes_)
    if (n->conn) n->conn->send(ctrl::Msg::Routed, routed);
}

// A frame from a child of the front end: its own, or one it relays for a node below it.
void RemoteWorkers::on_child_frame(Node& child, wire::Frame& f) {
  if (f.type != static_cast<uint16_t>(ctrl::Msg::Routed)) return on_node_frame(child, f);
  ctrl::Routed r = ctrl::unwrap(f.payload);
  if (r.node >= nodes_.size() || !ctrl::in_subtree(child.index, static_cast<int>(r.node), cfg_.tree_radix))
    throw wire::WireError("routed frame from node " + std::to_string(r.node) + ", not below node " +
                          std::to_string(child.index));
  Node& from = *nodes_[r.node];
  if (r.inner.type == static_cast<uint16_t>(ctrl::Msg::Lost)) {
    wire::Reader rd(r.inner.payload);
    std::string why = rd.str();
    return node_lost(from, why);
  }
  if (from.lost) return;
  on_node_frame(from, r.inner);
}

void RemoteWorkers::node_lost(Node& n, const std::string& why) {
  if (n.lost) return;
  // The nodes below it in the tree go with it (their daemons see their parent go and exit).
  for (auto& m : nodes_) {
    if (m->lost || !ctrl::in_subtree(n.index, m->index, cfg_.tree_radix)) continue;
    m->lost = true;
    m->ready = false;
    m->live = 0;
    m->stdin_inflight = 0;
    for (auto* c : {&m->conn, &m->waiting}) {
      if (!*c) continue;
      (*c)->close();
      // Destroyed later: this may run inside one of the connection's callbacks.
      auto* raw = c->release();
      loop_.post([raw] { delete raw; });
    }
  }
  logger("ctrl")->info("node {} ({}) lost: {}", n.index, n.host, why);
  listener_.on_node_lost(n.host, why);
}

void RemoteWorkers::check_ready() {
  if (prepared_) return;
  for (auto& n : nodes_)
    if (!n->ready) return;
  prepared_ = true;
  ready_timer_.disarm();
  logger("ctrl")->info("all {} daemons ready", nodes_.size());
  ready_();
}

void RemoteWorkers::on_node_frame(Node& n, wire::Frame& f) {
  using ctrl::Msg;
  wire::Reader r(f.payload);
  auto valid_rank = [this](int rank) {
    if (rank < 0 || rank >= map_.world_size) throw wire::WireError("bad rank " + std::to_string(rank));
    return rank;
  };
  switch (static_cast<Msg>(f.type)) {
    case Msg::Joined:
      r.finish();
      if (n.job_sent) throw wire::WireError("joined twice");
      n.connected = true;
      n.job_sent = true;
      send_job(n);
      return;
    case Msg::Ready: {
      n.port = r.i32();
      n.child_port = r.i32();
      uint32_t count = r.u32();
      if (count > 256) throw wire::WireError("too many addresses");
      n.addrs.clear();
      for (uint32_t i = 0; i < count; ++i) n.addrs.push_back(r.str(256));
      r.finish();
      n.connected = true;
      n.ready = true;
      redirect_waiting();
      check_ready();
      return;
    }
    case Msg::Port:
      n.port = r.i32();
      r.finish();
      return;
    case Msg::Output: {
      int gen = r.i32();
      int rank = valid_rank(r.i32());
      uint8_t s = r.u8();
      std::string data = r.str(wire::kMaxPayload);
      r.finish();
      listener_.on_output(gen, rank, s == 1 ? Stream::Out : Stream::Err, data);
      return;
    }
    case Msg::Exit: {
      WorkerExit e = ctrl::decode_exit(f.payload);
      valid_rank(e.rank);
      if (n.live > 0) --n.live;
      listener_.on_exit(e);
      return;
    }
    case Msg::Abort: {
      int gen = r.i32();
      int rank = valid_rank(r.i32());
      int pid = r.i32();
      int status = r.i32();
      std::string msg = r.str();
      r.finish();
      listener_.on_abort(gen, rank, pid, status, msg);
      return;
    }
    case Msg::Fence:
      return on_fence(n, r);
    case Msg::DmodexReq:
      return on_dmodex_request(n, r);
    case Msg::DmodexResp:
      return on_dmodex_response(n, r);
    case Msg::StartFailed: {
      int started = r.i32();
      std::string msg = r.str();
      r.finish();
      n.live = static_cast<size_t>(std::max(0, started));
      listener_.on_node_lost(n.host, "cannot start the workers: " + msg);
      return;
    }
    case Msg::StdinDrained: {
      r.finish();
      n.stdin_inflight = 0;
      if (stdin_backlog() == 0) listener_.on_stdin_drained();
      return;
    }
    default:
      throw wire::WireError(std::string("unexpected ") + ctrl::msg_name(f.type) + " frame");
  }
}

void RemoteWorkers::on_fence(Node& n, wire::Reader& r) {
  std::string ns = r.str();
  uint32_t seq = r.u32();
  r.u8();  // collect: the nodes' contributions are empty when nothing is collected
  std::string data = r.str(wire::kMaxPayload);
  r.finish();
  auto& st = fences_[{ns, seq}];
  if (st.arrived.empty()) {
    st.arrived.assign(nodes_.size(), false);
    st.data.resize(nodes_.size());
  }
  if (st.arrived[static_cast<size_t>(n.index)]) throw wire::WireError("fence " + std::to_string(seq) + " contributed twice");
  st.arrived[static_cast<size_t>(n.index)] = true;
  st.data[static_cast<size_t>(n.index)] = std::move(data);
  if (++st.count < static_cast<int>(nodes_.size())) return;
  std::string all;
  for (auto& d : st.data) all += d;
  logger("ctrl")->debug("fence {} #{} complete: {} bytes from {} nodes", ns, seq, all.size(), nodes_.size());
  wire::Writer w;
  w.str(ns).u32(seq).i32(0).blob(all);
  broadcast(ctrl::Msg::FenceDone, w.data());
  fences_.erase({ns, seq});
}

void RemoteWorkers::on_dmodex_request(Node& n, wire::Reader& r) {
  uint64_t id = r.u64();
  std::string ns = r.str();
  int rank = r.i32();
  r.finish();
  if (rank < 0 || rank >= map_.world_size) throw wire::WireError("dmodex request for bad rank");
  Node& owner = *nodes_[static_cast<size_t>(map_.ranks[static_cast<size_t>(rank)].node)];
  if (owner.lost) {
    wire::Writer w;
    w.u64(id).i32(-1).blob("");
    send_to(n, ctrl::Msg::DmodexResp, w.data());
    return;
  }
  uint64_t mine = next_dmodex_++;
  dmodex_[mine] = DmodexRoute{n.index, id};
  wire::Writer w;
  w.u64(mine).str(ns).i32(rank);
  send_to(owner, ctrl::Msg::DmodexReq, w.data());
}

void RemoteWorkers::on_dmodex_response(Node&, wire::Reader& r) {
  uint64_t mine = r.u64();
  int st = r.i32();
  std::string data = r.str(wire::kMaxPayload);
  r.finish();
  auto it = dmodex_.find(mine);
  if (it == dmodex_.end()) throw wire::WireError("dmodex response for an unknown request");
  DmodexRoute route = it->second;
  dmodex_.erase(it);
  Node& to = *nodes_[static_cast<size_t>(route.from_node)];
  if (to.lost) return;
  wire::Writer w;
  w.u64(route.from_id).i32(st).blob(data);
  send_to(to, ctrl::Msg::DmodexResp, w.data());
}

// MASTER_ADDR: rank 0's node as the other nodes reach it.  A node on another host: its address
// as we see it.  A node on our own host: its daemon reached us at whichever of our addresses it
// tried first (a container bridge's, maybe), so take ours that faces the other hosts.
std::string RemoteWorkers::master_addr() {
  const Node& n0 = *nodes_[static_cast<size_t>(map_.ranks.at(0).node)];
  if (!is_own_address(n0.addr)) return n0.addr;
  std::string a = address_toward_others();
  return a.empty() ? n0.addr : a;
}

bool RemoteWorkers::is_own_address(const std::string& a) const {
  return a.rfind("127.", 0) == 0 || std::find(addresses_.begin(), addresses_.end(), a) != addresses_.end();
}

// The address another host's daemon reached us at (so that host can reach it); failing that (no
// other host talks to us directly), the one the kernel sends from toward another host.  "" when
// every node is on our host.
std::string RemoteWorkers::address_toward_others() const {
  for (const auto& n : nodes_) {
    if (!n->conn || n->addr.empty() || is_own_address(n->addr)) continue;
    std::string a = local_address(n->conn->fd());
    if (!a.empty()) return a;
  }
  for (const auto& n : nodes_)
    for (const auto& other : n->addrs) {
      if (is_own_address(other)) continue;
      std::string a = route_source_address(other);
      if (!a.empty() && a.rfind("127.", 0) != 0) return a;
    }
  return "";
}

int RemoteWorkers::master_port() {
  Node& n = *nodes_[static_cast<size_t>(map_.ranks.at(0).node)];
  return n.port;
}

void RemoteWorkers::start(const GenerationInfo& gen) {
  generation_ = gen.generation;
  fences_.clear();
  dmodex_.clear();
  for (auto& n : nodes_) {
    if (n->lost) throw Error("node " + n->host + " is not connected");
    n->live = map_.nodes[static_cast<size_t>(n->index)].ranks.size();
  }
  broadcast(ctrl::Msg::Start, ctrl::encode_generation(gen));
}

void RemoteWorkers::signal_all(int sig) {
  wire::Writer w;
  w.i32(sig);
  broadcast(ctrl::Msg::Signal, w.data());
}

size_t RemoteWorkers::live() const {
  size_t total = 0;
  for (const auto& n : nodes_) total += n->live;
  return total;
}

void RemoteWorkers::stdin_write(int rank, std::string_view data) {
  Node& n = *nodes_[static_cast<size_t>(map_.ranks.at(static_cast<size_t>(rank)).node)];
  if (n.lost) return;
  wire::Writer w;
  w.i32(rank).blob(data);
  send_to(n, ctrl::Msg::Stdin, w.data());
  n.stdin_inflight += data.size();
}

void RemoteWorkers::stdin_close_all() {
  broadcast(ctrl::Msg::StdinClose, {});
}

size_t RemoteWorkers::stdin_backlog() const {
  size_t total = 0;
  for (const auto& n : nodes_) total += n->stdin_inflight;
  return total;
}

}  // namespace pe
