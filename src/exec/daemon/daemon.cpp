#include "exec/daemon/daemon.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/frontend/workers.hpp"

namespace pe {
namespace {

constexpr int kKeepaliveSeconds = 10;
// What srun sets for a node and its step, which a rank takes from its daemon (on_job).
constexpr const char* kNodeStepVariables[] = {
    "SLURMD_NODENAME",       "SLURM_STEP_ID",           "SLURM_STEPID",
    "SLURM_STEP_NODELIST",   "SLURM_CPUS_ON_NODE",      "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_SRUN_COMM_HOST",
    "SLURM_SRUN_COMM_PORT",  "SLURM_STEP_LAUNCHER_PORT", "SLURM_NODE_ALIASES"};
constexpr int kUpstream = -1;  // the parent's link, for the heartbeats
// The parent is given longer than the children: a front end stopped for a moment (Ctrl-Z) or
// a relay that is slow should not end the node's ranks at once.  At least this long, and three
// heartbeat timeouts.
constexpr double kMinUpstreamTimeout = 10;
constexpr size_t kMaxHandshakeFrame = 4096;
// What is queued toward the front end: above the high mark the ranks' pipes and the children's
// links are no longer read, until it is down to the low mark (check_upstream).
constexpr size_t kOutputHighWater = 8u << 20;
constexpr size_t kOutputLowWater = 1u << 20;
// How long a rank's MPI_Comm_spawn waits for the front end (which answers within moments).
constexpr double kSpawnTimeout = 120.0;

void say(const std::string& node, const std::string& line) {
  std::string s = "pytorch_execd (" + node + "): " + line + "\n";
  write_all(2, s.data(), s.size());
}

// Join mode: this process is the user's pytorch_exec.
void say_joined(const std::string& line) {
  std::string s = "pytorch_exec: " + line + "\n";
  write_all(2, s.data(), s.size());
}

// The front end (or a relaying daemon) refused our hello; `retry`: it may take us later.
struct Refusal : Error {
  Refusal(const std::string& why, bool r) : Error(why), retry(r) {}
  bool retry;
};

// Join mode's attempts to reach the host: the first retry after this long, doubling up to
// kJoinRetryMax.
// One try at one of the front end's addresses gets this long before it is made anew.
constexpr double kConnectAttempt = 3.0;
constexpr double kJoinRetryFirst = 0.1;
constexpr double kJoinRetryMax = 2.0;
constexpr int kJoinNotice = 10, kJoinNoticeEvery = 60;

// Reads exactly one frame from a blocking-style exchange during the handshake, so that nothing
// that follows it is consumed.  Throws TimeoutError, IoError or WireError.
wire::Frame read_frame(int fd, std::chrono::steady_clock::time_point deadline) {
  auto read_exact = [&](char* p, size_t n) {
    while (n > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      struct pollfd pf {
        fd, POLLIN, 0
      };
      if (left.count() <= 0 || ::poll(&pf, 1, static_cast<int>(left.count())) == 0)
        throw TimeoutError("the front end did not answer the handshake in time");
      ssize_t r = ::recv(fd, p, n, 0);
      if (r == 0)
        throw IoError("the front end closed the connection during the handshake (wrong secret?)");
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        throw SystemError("read from the front end", errno);
      }
      p += r;
      n -= static_cast<size_t>(r);
    }
  };
  char header[wire::kHeaderSize];
  read_exact(header, sizeof header);
  wire::FrameDecoder dec(kMaxHandshakeFrame);
  dec.feed(header, sizeof header);
  wire::Frame f;
  uint32_t len;
  std::memcpy(&len, header + 8, 4);  // validated by the decoder above (magic, size)
  dec.next(f);
  std::string payload(len, '\0');
  read_exact(payload.data(), len);
  dec.feed(payload.data(), payload.size());
  if (!dec.next(f)) throw wire::WireError("incomplete handshake frame");
  return f;
}

}  // namespace

Daemon::Daemon(DaemonOptions opts) : opts_(std::move(opts)) {
  using namespace ctrl;
  // Before the job and after it alike: the job's end (join mode), the front end letting us go.
  auto job_end = [this](JobEnd& m) { job_status_ = m.status; };
  auto let_go = [this](Leave& m) { let_go_ = m.why.empty() ? "let go" : m.why; };
  before_job_.on<Job>([this](Job& m) { on_job(m); })
      .on<Redirect>([this](Redirect& m) { on_redirect(m); })
      .on<JobEnd>(job_end)
      .on<Leave>(let_go);
  dispatch_.on<Start>([this](Start& m) { on_start(m); })
      .on<JobEnd>(job_end)
      .on<Leave>(let_go)
      .on<Remap>([this](Remap& m) { on_remap(m); })
      .on<Signal>([this](Signal& m) {
        // The front end stops itself after SIGTSTP (Ctrl-Z): its silence until SIGCONT says
        // nothing (its connection still closes if it dies).
        if (m.sig == SIGTSTP || m.sig == SIGCONT) beats_->hold(kUpstream, m.sig == SIGTSTP);
        agent_->signal_all(m.sig);
      })
      .on<ProcFailed>([this](ProcFailed& m) {
        agent_->notify_failure(m.generation, m.spawn, m.rank, m.exit_code, m.aborted);
      })
      .on<Stdin>([this](Stdin& m) { on_stdin(m); })
      .on<StdinClose>([this](StdinClose&) {
        if (agent_) agent_->stdin_close_all();
      })
      .on<FenceDone>([this](FenceDone& m) { on_fence_done(m); })
      .on<DmodexReq>([this](DmodexReq& m) { on_dmodex_request(m); })
      .on<DmodexResp>([this](DmodexResp& m) {
        on_reply(dmodex_, m.id, m.status, std::move(m.data), "dmodex-response");
      })
      .on<SpawnStart>([this](SpawnStart& m) { on_spawn_start(m); })
      .on<SpawnStop>([this](SpawnStop& m) { agent_->stop_spawned(m.generation, m.spawn); })
      .on<SpawnResp>([this](SpawnResp& m) { answer_spawn(m.id, m.error, m.nspace); })
      .on<LookupResp>([this](LookupResp& m) {
        auto it = lookups_.find(m.id);
        if (it == lookups_.end()) throw wire::WireError("lookup-response for an unknown request");
        auto done = std::move(it->second);
        lookups_.erase(it);
        done(pmix::Published(m.found.begin(), m.found.end()));
      });
}

Daemon::~Daemon() = default;

void Daemon::handshake(const std::vector<std::pair<std::string, int>>& targets) {
  // Every address at once and again until the connect timeout: one that is firewalled or cut
  // off for a while does not hold up another that answers.
  UniqueFd fd;
  try {
    fd = connect_first(targets, opts_.connect_timeout, kConnectAttempt);
  } catch (const Error& e) {
    throw IoError(std::string("cannot reach ") +
                  (redirected_ ? "the parent daemon" : "the front end") + ": " + e.what());
  }
  tune_control_socket(fd.get(), kKeepaliveSeconds);
  std::string peer = peer_address(fd.get());
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(opts_.connect_timeout));
  wire::Frame ch = read_frame(fd.get(), deadline);
  if (ch.type != static_cast<uint16_t>(ctrl::Msg::Challenge))
    throw wire::WireError("expected a challenge");
  if (std::string theirs = ctrl::protocol_mismatch(ch.payload); !theirs.empty()) {
    // A hello of the version alone, its first field: the other side names it too.
    std::string version(4, '\0');
    for (int i = 0; i < 4; ++i)
      version[static_cast<size_t>(i)] = static_cast<char>((ctrl::kProtocol >> (8 * i)) & 0xff);
    std::string frame = wire::encode_frame(static_cast<uint16_t>(ctrl::Msg::Hello), version);
    (void)write_all(fd.get(), frame.data(), frame.size());
    throw wire::WireError(std::string(redirected_ ? "the parent daemon" : "the front end") +
                          " at " + peer + " speaks " + theirs + " and this pytorch_exec " +
                          ctrl::protocol_here() +
                          ": use the same pytorch_exec version on every node");
  }
  std::string nonce_f = ctrl::decode<ctrl::Challenge>(ch.payload).nonce;
  ctrl::Hello hello;
  hello.node = opts_.node;
  hello.nonce = auth::random_bytes(auth::kNonceBytes);
  if (opts_.join.slots > 0) {
    hello.join_slots = opts_.join.slots;
    hello.node_rank = opts_.join.node_rank;
  }
  hello.proof = auth::daemon_proof(opts_.secret, nonce_f, hello.nonce, opts_.node);
  std::string frame =
      wire::encode_frame(static_cast<uint16_t>(ctrl::Msg::Hello), ctrl::encode(hello));
  if (!write_all(fd.get(), frame.data(), frame.size()))
    throw SystemError("write to the front end", errno);
  wire::Frame wel = read_frame(fd.get(), deadline);
  if (wel.type == static_cast<uint16_t>(ctrl::Msg::Refused)) {
    ctrl::Refused r = ctrl::decode<ctrl::Refused>(wel.payload);
    throw Refusal(printable(r.why, 512), r.retry);
  }
  if (wel.type != static_cast<uint16_t>(ctrl::Msg::Welcome))
    throw wire::WireError("expected a welcome");
  std::string proof = ctrl::decode<ctrl::Welcome>(wel.payload).proof;
  if (!auth::proof_matches(auth::frontend_proof(opts_.secret, nonce_f, hello.nonce, opts_.node),
                           proof))
    throw Error("the front end at " + peer + " failed to prove it knows the job's secret");
  conn_ = std::make_unique<ctrl::Connection>(loop_, std::move(fd), peer);
  if (output_paused_) hold_output(false);  // that was the old connection's queue
  int epoch = ++conn_epoch_;
  beats_->watch(kUpstream, upstream_timeout());
  conn_->on_frame([this](wire::Frame& f) {
    beats_->heard(kUpstream);
    if (f.type != static_cast<uint16_t>(ctrl::Msg::Heartbeat)) on_frame(f);
  });
  conn_->on_closed([this, epoch](const std::string& why) {
    loop_.post([this, epoch, why] {
      if (epoch == conn_epoch_) on_closed(why);
    });
  });
  if (relay_) relay_->set_upstream(conn_.get());
  conn_->send(ctrl::Joined{});
}

int Daemon::run() {
  ::signal(SIGPIPE, SIG_IGN);
  start_heartbeats();
  bool joins = opts_.join.slots > 0;
  if (joins) {
    join_sink_ = std::make_unique<OutputSink>(opts_.join.output, 0);
    join_sink_->open_files();
    join_sink_->while_blocked(opts_.heartbeat.interval, [this] { beats_->beat(); });
    join_handshake();
  } else {
    handshake(opts_.connect);
  }
  // srun and the launch agents forward signals; the workers get them, the front end decides.
  // A node that joined by itself decides for itself: it leaves the job.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
    signal_events_.push_back(loop_.watch_signal(sig, [this, sig, joins] {
      if (joins && sig != SIGUSR1 && sig != SIGUSR2) return on_leave(sig);
      logger("agent")->info("signal {}: forwarding to the workers", sig);
      if (agent_) agent_->signal_all(sig);
    }));
  // Ctrl-Z at a node that joined by itself: its ranks (out of the terminal's reach) stop, then
  // it does, as the host's pytorch_exec does; the host finds it silent after its heartbeat
  // timeout, as a frozen node.  SIGCONT goes on to them.
  if (joins)
    for (int sig : {SIGTSTP, SIGCONT})
      signal_events_.push_back(loop_.watch_signal(sig, [this, sig] {
        if (agent_) agent_->signal_all(sig);
        if (sig == SIGTSTP) ::raise(SIGSTOP);
      }));
  loop_.run();
  agent_ = nullptr;
  runner_.reset();  // kills and reaps whatever is left
  if (join_sink_) join_sink_->flush();  // a tagged partial last line is ended, as on the host
  beats_.reset();
  relay_.reset();
  opts_.secret.assign(opts_.secret.size(), '\0');
  return status_;
}

// Join mode: the host may start after us, so connection failures are tried again with a
// growing pause until the join timeout; a refusal is final unless the host says it may take us
// later (a cool-down).  Blocking: nothing else runs yet.
void Daemon::join_handshake() {
  using Clock = std::chrono::steady_clock;
  // --timeout, when it comes first, ends the wait as the job's time limit (exit 124).
  const bool limited = opts_.join.time_limit > 0 && opts_.join.time_limit < opts_.join.timeout;
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(
                                         limited ? opts_.join.time_limit : opts_.join.timeout));
  double pause = kJoinRetryFirst;
  const double per_attempt = opts_.connect_timeout;
  std::string last;
  // A line after kJoinNotice s, then every kJoinNoticeEvery s: what it waits for, and until when.
  auto notice = Clock::now() + std::chrono::seconds(kJoinNotice);
  while (true) {
    // An attempt (a connection to a silent address, a handshake) ends by the join deadline too,
    // and by the next notice (at least a second on).
    double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    double to_notice = std::max(1.0, std::chrono::duration<double>(notice - Clock::now()).count());
    opts_.connect_timeout = std::max(0.001, std::min({per_attempt, left, to_notice}));
    try {
      handshake(opts_.connect);
      opts_.connect_timeout = per_attempt;
      return;
    } catch (const Refusal& e) {
      if (!e.retry)
        throw Error("refused by the rendezvous host " + opts_.join.endpoint + ": " + e.what());
      last = std::string("refused: ") + e.what();
    } catch (const wire::WireError&) {
      throw;
    } catch (const Error& e) {
      last = e.what();
    }
    left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0 && limited)
      throw ProgramError("the job's time limit of " + seconds_text(opts_.join.time_limit) +
                             " s was reached (" + opts_.join.time_limit_from +
                             ") before this node could join the rendezvous host " +
                             opts_.join.endpoint + " (" + last + ")",
                         124);
    if (left <= 0)
      throw TimeoutError("could not join the rendezvous host " + opts_.join.endpoint +
                         " within the join timeout (" + last + ")");
    logger("ctrl")->info("joining {}: {}; again in {:.1f} s", opts_.join.endpoint, last, pause);
    if (Clock::now() >= notice && left >= 1) {
      say_joined("waiting to join the rendezvous host " + opts_.join.endpoint + " (" + last +
                 "); giving up in " + std::to_string(static_cast<long>(left + 0.5)) + " s (" +
                 (limited ? opts_.join.time_limit_from : std::string("--join-timeout")) + ")");
      notice = Clock::now() + std::chrono::seconds(kJoinNoticeEvery);
    }
    ::usleep(static_cast<useconds_t>(std::min(pause, left) * 1e6));
    pause = std::min(pause * 2, kJoinRetryMax);
  }
}

// Join mode: SIGINT, SIGTERM, SIGHUP or SIGQUIT to this pytorch_exec.  The node leaves the job at once
// (the host is told why and sees the connection close: an elastic loss); its workers get the
// signal and
// --kill-grace seconds to exit before the rest is killed.  A second signal kills them now.
void Daemon::on_leave(int sig) {
  size_t live = agent_ ? agent_->live() : 0;
  if (leaving_) {
    say_joined("second signal: killing " + std::to_string(live) + " worker(s) now");
    return loop_.stop();
  }
  leaving_ = true;
  say_joined("signal " + std::to_string(sig) + ": stopping " + std::to_string(live) +
             " worker(s) and leaving the job");
  status_ = 128 + sig;
  if (conn_) {  // the host is told why, then sees the close
    conn_->send(ctrl::Leave{"signal " + std::to_string(sig) + " to its pytorch_exec"});
    conn_->finish();
  }
  conn_.reset();
  if (live == 0) return loop_.stop();
  agent_->signal_all(sig);
  leave_timer_ = loop_.timer([this] { loop_.stop(); });
  leave_timer_.arm(opts_.join.kill_grace);
}

// Heartbeats go to the parent and to each child; a silent parent is a lost front end (this
// node gives up: its workers are killed), a silent child is reported up like a closed one.
void Daemon::start_heartbeats() {
  beats_ = std::make_unique<ctrl::Heartbeats>(
      loop_, opts_.heartbeat,
      [this](int id) {
        ctrl::Link* link = id == kUpstream ? conn_.get() : relay_ ? relay_->child(id) : nullptr;
        if (link) link->send(ctrl::Heartbeat{});
      },
      [this](int id) { on_silent(id); });
}

double Daemon::upstream_timeout() const {
  // A node that joined by itself stands for the user's pytorch_exec: it gives up on the host
  // within the heartbeat timeout, as the host does on it.
  if (opts_.join.slots > 0) return opts_.heartbeat.timeout;
  return std::max(kMinUpstreamTimeout, 3 * opts_.heartbeat.timeout);
}

void Daemon::on_silent(int id) {
  std::string why = ctrl::silence(id == kUpstream ? upstream_timeout() : opts_.heartbeat.timeout);
  if (id != kUpstream) {
    logger("ctrl")->info("child node {}: {}", id, why);
    if (relay_) relay_->child_closed(id, why);
    return;
  }
  if (conn_) conn_->close();
  on_closed(why + " from " + (redirected_ ? "the parent daemon" : "upstream"));
}

void Daemon::on_closed(const std::string& why) {
  if (!conn_) return;
  logger("ctrl")->info("front end connection: {}", why);
  if (opts_.join.slots > 0) {  // the job's status, or the host is gone
    if (job_status_ >= 0) {
      status_ = job_status_;
      if (status_ != 0)
        say_joined("the job ended with exit status " + std::to_string(status_) + " (the host " +
                   opts_.join.endpoint + " says why)");
    } else {
      size_t live = agent_ ? agent_->live() : 0;
      say_joined("lost the rendezvous host " + opts_.join.endpoint + " (" + why + ")" +
                 (live ? ": stopping " + std::to_string(live) + " worker(s)" : std::string()));
      status_ = 1;
    }
    conn_.reset();
    loop_.stop();
    return;
  }
  if (!let_go_.empty()) {
    logger("ctrl")->info("the front end let this node go: {}", let_go_);
  } else if (agent_ && agent_->live() > 0) {
    say(opts_.node, "lost the front end (" + why + "): killing " + std::to_string(agent_->live()) +
                        " worker(s)");
    status_ = 1;
  }
  conn_.reset();
  loop_.stop();
}

// From upstream.  Before the job, only the job (perhaps routed to us through our parent, which
// knows our index before we do) or a redirect; after it, the relay routes and we handle ours.
void Daemon::on_frame(wire::Frame& f) {
  if (redirected_) return;
  if (have_job_) return relay_->from_upstream(f);
  if (f.type == static_cast<uint16_t>(ctrl::Msg::Routed)) {
    ctrl::Routed r = ctrl::decode<ctrl::Routed>(f.payload);
    if (r.inner.type == static_cast<uint16_t>(ctrl::Msg::Job)) return before_job_.dispatch(r.inner);
    // A node that joins a running job hears what goes to everyone before its job arrives.
    if (r.node == ctrl::kAllNodes) return;
  }
  if (!before_job_.handles(f.type))
    throw wire::WireError(std::string("unexpected ") + ctrl::msg_name(f.type) + " before the job");
  before_job_.dispatch(f);
}

// Elastic: the next generation runs on other nodes; find this one among them.  A node left out
// (a spare) stays connected and idle until a map names it again.
void Daemon::on_remap(ctrl::Remap& m) {
  idle_ = true;
  idle_map_ = m.map;
  // By the name the job knows it by (HOST#2 for a second agent of its host, join mode).
  const std::string& me = job_.map.nodes.at(static_cast<size_t>(job_.node)).host;
  for (size_t i = 0; i < m.map.nodes.size(); ++i)
    if (m.map.nodes[i].host == me) {
      idle_ = false;
      try {
        runner_->remap(std::move(m.map), static_cast<int>(i));
      } catch (const Error& e) {
        conn_->send(ctrl::StartFailed{0, e.what()});
      }
      return;
    }
  logger("agent")->info("not in the next generation: idle ({})",
                        spawn_only_ ? "for spawned processes" : "a spare");
}

void Daemon::on_stdin(ctrl::Stdin& m) {
  agent_->stdin_write(m.rank, m.data);
  if (agent_->stdin_backlog() == 0) conn_->send(ctrl::StdinDrained{});
}

// The front end asks for one of our ranks' data.
void Daemon::on_dmodex_request(ctrl::DmodexReq& m) {
  agent_->dmodex_request(m.nspace, m.rank, [this, id = m.id](int st, std::string data) {
    if (conn_) conn_->send(ctrl::DmodexResp{id, st, std::move(data)});
  });
}

// The answer to one of our clients' fences or direct-modex requests.
template <class M>
void Daemon::on_reply(std::map<M, pmix::ModexDone>& waiting, const M& key, int status,
                      std::string data, const char* what) {
  auto it = waiting.find(key);
  if (it == waiting.end()) throw wire::WireError(std::string(what) + " for an unknown request");
  auto done = std::move(it->second);
  waiting.erase(it);
  done(status, std::move(data));
}

// We are below another daemon in the tree: connect to it instead (it is listening already).
void Daemon::on_redirect(ctrl::Redirect& m) {
  if (m.addrs.empty() || m.port <= 0 || m.port > 65535) throw wire::WireError("bad redirect");
  std::vector<std::pair<std::string, int>> targets;
  for (auto& a : m.addrs) targets.emplace_back(a, m.port);
  redirected_ = true;
  loop_.post([this, targets] {
    conn_.reset();
    beats_->forget(kUpstream);
    try {
      handshake(targets);
      redirected_ = false;
    } catch (const std::exception& e) {
      say(opts_.node, e.what());
      status_ = 1;
      loop_.stop();
    }
  });
}

// Our children in the tree connect to us; what they send goes up with their node id on it.
void Daemon::start_relay() {
  const auto& nodes = job_.map.nodes;
  relay_ = std::make_unique<ctrl::TreeRelay>(
      job_.node, static_cast<int>(nodes.size()), job_.tree_radix,
      nodes[static_cast<size_t>(job_.node)].host,
      ctrl::TreeRelay::Callbacks{[this](wire::Frame& f) {
        if (agent_ || f.type == static_cast<uint16_t>(ctrl::Msg::Start)) dispatch_.dispatch(f);
      }});
  relay_->set_upstream(conn_.get());
  if (!relay_->has_children()) {
    opts_.secret.assign(opts_.secret.size(), '\0');
    return;
  }
  auto index_of = [this](const std::string& name) {
    for (size_t i = 0; i < job_.map.nodes.size(); ++i)
      if (job_.map.nodes[i].host == name) return static_cast<int>(i);
    return -1;
  };
  acceptor_ = std::make_unique<ctrl::Acceptor>(
      loop_, opts_.secret,
      [this, index_of](const ctrl::Hello& h) -> ctrl::Verdict {
        const std::string& name = h.node;
        int i = index_of(name);
        if (i < 0) return "node '" + name + "' is not in the job";
        std::string why = relay_->check_child(i);
        return why.empty() ? why : "node '" + name + "' " + why;
      },
      [this, index_of](const std::string& name, std::unique_ptr<ctrl::Connection> conn) {
        on_child(index_of(name), std::move(conn));
      });
}

void Daemon::on_child(int node, std::unique_ptr<ctrl::Connection> conn) {
  ctrl::Connection* c = conn.get();
  c->on_frame([this, node](wire::Frame& f) {
    beats_->heard(node);
    if (f.type == static_cast<uint16_t>(ctrl::Msg::Ready)) beats_->settle(node);
    if (f.type == static_cast<uint16_t>(ctrl::Msg::Heartbeat)) return;
    relay_->from_child(node, f);
    check_upstream();
  });
  c->on_closed([this, node](const std::string& why) {
    loop_.post([this, node, why] {
      beats_->forget(node);
      relay_->child_closed(node, why);
    });
  });
  beats_->watch(node, ctrl::kStartingTimeout);   // until its Ready goes by
  if (output_paused_) beats_->hold(node, true);  // and the relay does not read it yet
  relay_->add_child(node, std::make_unique<ctrl::ConnLink>(loop_, std::move(conn)));
  logger("ctrl")->info("child node {} ({}) connected", node,
                       job_.map.nodes[static_cast<size_t>(node)].host);
}

void Daemon::on_job(ctrl::Job& m) {
  if (have_job_) throw wire::WireError("a second job description");
  job_ = std::move(m.job);
  have_job_ = true;
  if (opts_.join.slots > 0) {  // its ranks print here: whether this node's stdout is a terminal
    job_.stdout_tty = opts_.join.stdout_tty;
    job_.tty_rows = opts_.join.tty_rows;
    job_.tty_cols = opts_.join.tty_cols;
  }
  const char* spec = std::getenv("PYTORCH_EXEC_LOG");
  init_logging(job_.verbosity, spec ? spec : "", opts_.node);
  EnvMap env = job_.env;
  if (!job_.replace_env) {
    env = environment_from(environ);
    for (const auto& [k, v] : job_.env) env[k] = v;
  } else {
    // The launching shell's environment, as srun gives it, with what srun gave this daemon for
    // its node and step (the shell's are another node's); the per-rank ones are set for each
    // rank (worker_env).  Not what the daemons' own srun options made (SLURM_JOB_NAME,
    // SLURM_NTASKS_PER_NODE=1, SLURM_OVERLAP, SLURM_CPU_BIND, ...).
    EnvMap own = environment_from(environ);
    for (const char* k : kNodeStepVariables)
      if (own.count(k)) env[k] = own[k];
  }
  const auto& node = job_.map.nodes.at(static_cast<size_t>(job_.node));
  logger("agent")->info("job {}: node {} of {} ({} ranks)", job_.job_id, job_.node,
                        job_.map.nodes.size(), node.ranks.size());
  spawn_only_ = idle_ = node.ranks.empty();
  try {
    runner_ = std::make_unique<NodeRunner>(job_);
    runner_->open(loop_, *this, this,
                  "pytorch_execd." + job_.job_id + "." + std::to_string(job_.node), std::move(env));
    agent_ = runner_->agent();
    // MPI_Comm_spawn: the front end places and starts the processes (SpawnStart).
    runner_->spawn_via([this](pmix::SpawnRequest req, pmix::SpawnDone done) {
      send_spawn(std::move(req), std::move(done));
    });
  } catch (const Error& e) {
    start_relay();
    conn_->send(ctrl::StartFailed{0, e.what()});
    return;
  }
  start_relay();
  conn_->send(ctrl::Ready{next_store_port(), acceptor_ ? acceptor_->port() : 0,
                          local_ipv4_addresses()});
}

void Daemon::on_start(ctrl::Start& m) {
  if (!agent_ || (idle_ && !spawn_only_)) return;  // the set-up failed and was reported, or a spare
  fence_seq_.clear();
  fence_pieces_.clear();
  // What the last generation's processes asked for is void (the front end forgot it too).
  for (auto& [id, p] : std::exchange(spawns_, {})) p->done("a new generation started", "");
  for (auto& [id, done] : std::exchange(lookups_, {})) done({});
  // The generation's store is ours when its port is the one reported (no other process can hold
  // that port here meanwhile); the last generation's store and its keys go.
  store_.reset();
  if (next_store_ && m.gen.master_port == next_store_->port()) store_ = std::move(next_store_);
  try {
    if (idle_) return runner_->start_idle(m.gen, idle_map_);
    if (join_sink_)
      join_sink_->start_generation(m.gen.generation, m.gen.restart_count, runner_->job().map,
                                   runner_->job().node);
    runner_->start(m.gen);
  } catch (const Error& e) {
    conn_->send(ctrl::Port{next_store_port()});  // a restart must not use the store just taken
    conn_->send(ctrl::StartFailed{static_cast<int>(agent_->live()), e.what()});
    return;
  }
  conn_->send(ctrl::Port{next_store_port()});
}

int Daemon::next_store_port() {
  next_store_ = TorchStore::host(loop_, "0.0.0.0");
  return next_store_->port();
}

void Daemon::on_output(int generation, int rank, Stream s, std::string_view lines) {
  // Join mode: each node prints its own workers' output, as torchrun's agents do (a pod's log
  // is its workers').
  if (join_sink_) {
    if (rank >= join_sink_ranks_) join_sink_->grow(join_sink_ranks_ = rank + 1);
    join_sink_->write(generation, rank, s, lines);
    return;
  }
  send_output(ctrl::Output{generation, rank, static_cast<uint8_t>(s == Stream::Out ? 1 : 2), "", 0},
              lines);
}

void Daemon::on_spawned_output(int generation, int spawn, int rank, Stream s,
                               std::string_view lines) {
  if (join_sink_) return join_sink_->write(generation, rank, s, lines, spawn);
  send_output(
      ctrl::Output{generation, rank, static_cast<uint8_t>(s == Stream::Out ? 1 : 2), "", spawn},
      lines);
}

void Daemon::send_output(ctrl::Output m, std::string_view lines) {
  if (!conn_) return;
  // Large bursts are split so that no frame comes near the codec's limit.
  constexpr size_t kChunk = 1u << 20;
  while (!lines.empty()) {
    size_t n = lines.size() <= kChunk ? lines.size() : lines.rfind('\n', kChunk) + 1;
    if (n == 0 || n > kChunk) n = std::min(lines.size(), kChunk);
    m.data = std::string(lines.substr(0, n));
    conn_->send(m);
    lines.remove_prefix(n);
  }
  check_upstream();
}

// Backpressure, end to end: while our parent does not take what we send, our ranks' pipes are
// not read (the ranks block in write, as on a terminal that is not read), nor are our children's
// links: their queues fill in turn, and they stop reading their ranks and children.  Memory is
// bounded on every node (a high mark per link), whatever the depth of the tree.
//
// This cannot deadlock the job.  A held child's frames of every kind wait, its exits and fences
// too, but only while our queue is above the low mark, and our queue drains whatever our
// children do: our parent reads us unless it is held itself, and so on up to the front end,
// which reads unless its own stdout is blocked, and nothing on the way waits for a held
// child's frame before reading on.  So a pause ends as soon as the front end's stdout is read
// again; until then the job is stopped in write(), as it would be on any terminal.  Frames are
// only delayed, in order, never dropped.  A held child is not judged by its heartbeats (we do
// not read them), but we still send it ours: if it is gone, those writes fail (its host answers
// with a reset, or TCP gives up) and the link is closed and reported as before.
void Daemon::check_upstream() {
  if (!conn_ || output_paused_ || conn_->queued() <= kOutputHighWater) return;
  hold_output(true);
  conn_->when_drained(kOutputLowWater, [this] { hold_output(false); });
}

void Daemon::hold_output(bool held) {
  output_paused_ = held;
  logger("ctrl")->debug("{} reading the ranks' output and the child nodes",
                        held ? "upstream is full: stopped" : "upstream drained: resumed");
  if (agent_) agent_->pause_output(held);
  if (!relay_) return;
  relay_->hold_children(held);
  for (int id : relay_->children()) beats_->hold(id, held);
}

void Daemon::on_exit(const WorkerExit& e) {
  if (conn_) conn_->send(ctrl::Exit{e});
  if (leaving_)  // once the agent has counted this exit
    loop_.post([this] {
      if (agent_ && agent_->live() == 0) loop_.stop();
    });
}

void Daemon::on_stdin_drained() {
  if (conn_) conn_->send(ctrl::StdinDrained{});
}

void Daemon::on_abort(int generation, int rank, pid_t pid, int status, const std::string& msg) {
  if (conn_) conn_->send(ctrl::Abort{generation, rank, pid, status, msg});
}

void Daemon::fence(const std::string& nspace, bool collect, std::string data,
                   pmix::ModexDone done) {
  if (!conn_) return done(-1, "");
  uint32_t seq = fence_seq_[nspace]++;
  fences_[{nspace, seq}] = std::move(done);
  ctrl::for_each_fence_piece(data, [&](std::string piece, bool more) {
    conn_->send(ctrl::Fence{nspace, seq, collect, std::move(piece), more});
  });
}

// The fence's data comes in pieces; the PMIx server gets it whole.
void Daemon::on_fence_done(ctrl::FenceDone& m) {
  std::pair<std::string, uint32_t> key{m.nspace, m.seq};
  if (!fences_.count(key)) throw wire::WireError("fence-done for an unknown request");
  std::string& got = fence_pieces_[key];
  got += m.data;
  if (m.more) return;
  std::string all = std::move(got);
  fence_pieces_.erase(key);
  on_reply(fences_, key, m.status, std::move(all), "fence-done");
}

void Daemon::direct_modex(const std::string& nspace, int rank, pmix::ModexDone done) {
  if (!conn_) return done(-1, "");
  uint64_t id = next_dmodex_++;
  dmodex_[id] = std::move(done);
  conn_->send(ctrl::DmodexReq{id, nspace, rank});
}

}  // namespace pe

namespace pe {

// Our part of a spawned job: register its namespace, start our processes, say how it went.
void Daemon::on_spawn_start(ctrl::SpawnStart& m) {
  if (!agent_ || (idle_ && !spawn_only_))
    return conn_->send(ctrl::SpawnStarted{m.job.nspace, 0, "not running"});
  size_t before = agent_->live();
  try {
    runner_->start_spawned(m.job);
  } catch (const std::exception& e) {
    return conn_->send(
        ctrl::SpawnStarted{m.job.nspace, static_cast<int>(agent_->live() - before), e.what()});
  }
  conn_->send(ctrl::SpawnStarted{m.job.nspace, static_cast<int>(agent_->live() - before), ""});
}

// The front end places and starts the processes (SpawnStart to every node) and answers; a
// request it does not answer in time fails instead of leaving the rank in MPI_Comm_spawn.
void Daemon::send_spawn(pmix::SpawnRequest req, pmix::SpawnDone done) {
  if (!conn_) return done("the front end is gone", "");
  uint64_t id = next_request_++;
  auto& p = spawns_[id];
  p = std::make_unique<PendingSpawn>();
  p->done = std::move(done);
  p->timeout = loop_.timer([this, id] {
    // Not inside the timer's own callback: it goes with the request.
    loop_.post([this, id] {
      answer_spawn(id,
                   "the front end did not answer within " +
                       std::to_string(static_cast<int>(kSpawnTimeout)) + " s",
                   "");
    });
  });
  p->timeout.arm(kSpawnTimeout);
  conn_->send(ctrl::SpawnReq{id, std::move(req)});
}

void Daemon::answer_spawn(uint64_t id, const std::string& error, const std::string& nspace) {
  auto it = spawns_.find(id);
  if (it == spawns_.end()) {  // answered late, after its time ran out
    logger("ctrl")->info("spawn {}: answer after the timeout, ignored", id);
    return;
  }
  auto p = std::move(it->second);
  spawns_.erase(it);
  p->done(error, nspace);
}

void Daemon::publish(pmix::Published kv) {
  if (conn_) conn_->send(ctrl::Publish{{kv.begin(), kv.end()}});
}

void Daemon::lookup(std::vector<std::string> keys, pmix::LookupDone done) {
  if (!conn_) return done({});
  uint64_t id = next_request_++;
  lookups_[id] = std::move(done);
  conn_->send(ctrl::Lookup{id, std::move(keys)});
}

void Daemon::unpublish(std::vector<std::string> keys) {
  if (conn_) conn_->send(ctrl::Unpublish{std::move(keys)});
}

}  // namespace pe
