#include "exec/daemon.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "exec/workers.hpp"

namespace pe {
namespace {

constexpr int kKeepaliveSeconds = 10;
constexpr size_t kMaxHandshakeFrame = 4096;

void say(const std::string& node, const std::string& line) {
  std::string s = "pytorch_execd (" + node + "): " + line + "\n";
  write_all(2, s.data(), s.size());
}

// Reads exactly one frame from a blocking-style exchange during the handshake, so that nothing
// that follows it is consumed.  Throws TimeoutError, IoError or WireError.
wire::Frame read_frame(int fd, std::chrono::steady_clock::time_point deadline) {
  auto read_exact = [&](char* p, size_t n) {
    while (n > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      struct pollfd pf {fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&pf, 1, static_cast<int>(left.count())) == 0)
        throw TimeoutError("the front end did not answer the handshake in time");
      ssize_t r = ::recv(fd, p, n, 0);
      if (r == 0) throw IoError("the front end closed the connection during the handshake (wrong secret?)");
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

Daemon::Daemon(DaemonOptions opts) : opts_(std::move(opts)) {}

Daemon::~Daemon() = default;

void Daemon::handshake(const std::vector<std::pair<std::string, int>>& targets) {
  UniqueFd fd;
  std::string errors;
  for (const auto& [host, port] : targets) {
    try {
      fd = connect_tcp(host, port, opts_.connect_timeout);
      break;
    } catch (const Error& e) {
      errors += std::string(errors.empty() ? "" : "; ") + e.what();
    }
  }
  if (!fd.valid()) throw IoError(std::string("cannot reach ") + (redirected_ ? "the parent daemon" : "the front end") + ": " + errors);
  tune_control_socket(fd.get(), kKeepaliveSeconds);
  std::string peer = peer_address(fd.get());
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(opts_.connect_timeout));
  wire::Frame ch = read_frame(fd.get(), deadline);
  if (ch.type != static_cast<uint16_t>(ctrl::Msg::Challenge)) throw wire::WireError("expected a challenge");
  std::string nonce_f = wire::Reader(ch.payload).str(auth::kNonceBytes);
  std::string nonce_d = auth::random_bytes(auth::kNonceBytes);
  wire::Writer hello;
  hello.str(opts_.node).str(nonce_d).str(auth::daemon_proof(opts_.secret, nonce_f, nonce_d, opts_.node));
  std::string frame = wire::encode_frame(static_cast<uint16_t>(ctrl::Msg::Hello), hello.data());
  if (!write_all(fd.get(), frame.data(), frame.size())) throw SystemError("write to the front end", errno);
  wire::Frame wel = read_frame(fd.get(), deadline);
  if (wel.type != static_cast<uint16_t>(ctrl::Msg::Welcome)) throw wire::WireError("expected a welcome");
  wire::Reader r(wel.payload);
  std::string proof = r.str(auth::kProofBytes);
  if (!auth::proof_matches(auth::frontend_proof(opts_.secret, nonce_f, nonce_d, opts_.node), proof))
    throw Error("the front end at " + peer + " failed to prove it knows the job's secret");
  conn_ = std::make_unique<ctrl::Connection>(loop_, std::move(fd), peer);
  int epoch = ++conn_epoch_;
  conn_->on_frame([this](wire::Frame& f) { on_frame(f); });
  conn_->on_closed([this, epoch](const std::string& why) {
    loop_.post([this, epoch, why] { if (epoch == conn_epoch_) on_closed(why); });
  });
  conn_->send(ctrl::Msg::Joined);
}

int Daemon::run() {
  ::signal(SIGPIPE, SIG_IGN);
  handshake(opts_.connect);
  // srun and the launch agents forward signals; the workers get them, the front end decides.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2})
    signal_events_.push_back(loop_.watch_signal(sig, [this, sig] {
      logger("agent")->info("signal {}: forwarding to the workers", sig);
      if (agent_) agent_->signal_all(sig);
    }));
  loop_.run();
  agent_.reset();  // kills and reaps whatever is left
  children_.clear();
  opts_.secret.assign(opts_.secret.size(), '\0');
  return status_;
}

void Daemon::on_closed(const std::string& why) {
  if (!conn_) return;
  logger("ctrl")->info("front end connection: {}", why);
  if (agent_ && agent_->live() > 0) {
    say(opts_.node, "lost the front end (" + why + "): killing " + std::to_string(agent_->live()) +
                        " worker(s)");
    status_ = 1;
  }
  conn_.reset();
  loop_.stop();
}

// From upstream: for us, for every node (handled here and passed down), or for a node below us.
void Daemon::on_frame(wire::Frame& f) {
  if (redirected_) return;
  if (f.type != static_cast<uint16_t>(ctrl::Msg::Routed)) return handle(f);
  ctrl::Routed r = ctrl::unwrap(f.payload);
  if (r.node == ctrl::kAllNodes) {
    for (auto& [id, c] : children_) c->send(ctrl::Msg::Routed, f.payload);
    return handle(r.inner);
  }
  if (static_cast<int>(r.node) == job_.node && have_job_) return handle(r.inner);
  if (!have_job_ && r.inner.type == static_cast<uint16_t>(ctrl::Msg::Job)) return handle(r.inner);
  for (auto& [id, c] : children_)
    if (ctrl::in_subtree(id, static_cast<int>(r.node), job_.tree_radix)) return c->send(ctrl::Msg::Routed, f.payload);
  // A node below us that is gone: its loss has been reported.
}

void Daemon::handle(wire::Frame& f) {
  using ctrl::Msg;
  auto type = static_cast<Msg>(f.type);
  if (type == Msg::Redirect && !have_job_) return on_redirect(f);
  if (!have_job_ && type != Msg::Job)
    throw wire::WireError(std::string("unexpected ") + ctrl::msg_name(f.type) + " before the job");
  wire::Reader r(f.payload);
  switch (type) {
    case Msg::Job:
      if (have_job_) throw wire::WireError("a second job description");
      on_job(f);
      return;
    case Msg::Start:
      on_start(f);
      return;
    case Msg::Signal: {
      int sig = r.i32();
      r.finish();
      if (sig <= 0 || sig >= NSIG) throw wire::WireError("bad signal number");
      if (agent_) agent_->signal_all(sig);
      return;
    }
    case Msg::Stdin: {
      int rank = r.i32();
      std::string data = r.str(wire::kMaxPayload);
      r.finish();
      agent_->stdin_write(rank, data);
      if (agent_->stdin_backlog() == 0) conn_->send(Msg::StdinDrained);
      return;
    }
    case Msg::StdinClose:
      agent_->stdin_close_all();
      return;
    case Msg::FenceDone: {
      std::string ns = r.str();
      uint32_t seq = r.u32();
      int st = r.i32();
      std::string data = r.str(wire::kMaxPayload);
      r.finish();
      auto it = fences_.find({ns, seq});
      if (it == fences_.end()) throw wire::WireError("fence-done for an unknown fence");
      auto done = std::move(it->second);
      fences_.erase(it);
      done(st, std::move(data));
      return;
    }
    case Msg::DmodexReq: {  // the front end asks for one of our ranks' data
      uint64_t id = r.u64();
      std::string ns = r.str();
      int rank = r.i32();
      r.finish();
      agent_->dmodex_request(ns, rank, [this, id](int st, std::string data) {
        if (!conn_) return;
        wire::Writer w;
        w.u64(id).i32(st).blob(data);
        conn_->send(ctrl::Msg::DmodexResp, w.data());
      });
      return;
    }
    case Msg::DmodexResp: {  // the answer to one of our clients' requests
      uint64_t id = r.u64();
      int st = r.i32();
      std::string data = r.str(wire::kMaxPayload);
      r.finish();
      auto it = dmodex_.find(id);
      if (it == dmodex_.end()) throw wire::WireError("dmodex-response for an unknown request");
      auto done = std::move(it->second);
      dmodex_.erase(it);
      done(st, std::move(data));
      return;
    }
    default:
      throw wire::WireError(std::string("unexpected ") + ctrl::msg_name(f.type) + " frame");
  }
}

// We are below another daemon in the tree: connect to it instead (it is listening already).
void Daemon::on_redirect(const wire::Frame& f) {
  wire::Reader r(f.payload);
  uint32_t n = r.u32();
  if (n == 0 || n > 256) throw wire::WireError("bad address count");
  std::vector<std::string> addrs;
  for (uint32_t i = 0; i < n; ++i) addrs.push_back(r.str(256));
  int port = r.i32();
  r.finish();
  if (port <= 0 || port > 65535) throw wire::WireError("bad port");
  std::vector<std::pair<std::string, int>> targets;
  for (auto& a : addrs) targets.emplace_back(a, port);
  redirected_ = true;
  loop_.post([this, targets] {
    conn_.reset();
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
  auto kids = ctrl::tree_children(job_.node, job_.tree_radix, static_cast<int>(job_.map.nodes.size()));
  if (kids.empty()) {
    opts_.secret.assign(opts_.secret.size(), '\0');
    return;
  }
  acceptor_ = std::make_unique<ctrl::Acceptor>(
      loop_, opts_.secret,
      [this](const std::string& name) -> std::string {
        for (size_t i = 0; i < job_.map.nodes.size(); ++i) {
          if (job_.map.nodes[i].host != name) continue;
          if (ctrl::tree_parent(static_cast<int>(i), job_.tree_radix) != job_.node)
            return "node '" + name + "' is not a child of this node";
          if (children_.count(static_cast<int>(i))) return "node '" + name + "' is already connected";
          return "";
        }
        return "node '" + name + "' is not in the job";
      },
      [this](const std::string& name, std::unique_ptr<ctrl::Connection> conn) {
        for (size_t i = 0; i < job_.map.nodes.size(); ++i)
          if (job_.map.nodes[i].host == name) return on_child(static_cast<int>(i), std::move(conn));
      });
}

void Daemon::on_child(int node, std::unique_ptr<ctrl::Connection> conn) {
  ctrl::Connection* c = conn.get();
  children_[node] = std::move(conn);
  c->on_frame([this, node](wire::Frame& f) {
    if (!conn_) return;
    if (f.type == static_cast<uint16_t>(ctrl::Msg::Routed)) {
      ctrl::Routed r = ctrl::unwrap(f.payload);
      if (r.node >= job_.map.nodes.size() || !ctrl::in_subtree(node, static_cast<int>(r.node), job_.tree_radix))
        throw wire::WireError("routed frame from a node not below this child");
      conn_->send(ctrl::Msg::Routed, f.payload);
    } else {
      conn_->send(ctrl::Msg::Routed, ctrl::wrap(static_cast<uint32_t>(node), f.type, f.payload));
    }
  });
  c->on_closed([this, node](const std::string& why) {
    loop_.post([this, node, why] {
      auto it = children_.find(node);
      if (it == children_.end()) return;
      children_.erase(it);
      if (!conn_) return;
      wire::Writer w;
      w.str("lost contact with its daemon (" + why + ", seen by node " + job_.map.nodes[static_cast<size_t>(job_.node)].host + ")");
      conn_->send(ctrl::Msg::Routed, ctrl::wrap(static_cast<uint32_t>(node), static_cast<uint16_t>(ctrl::Msg::Lost), w.data()));
    });
  });
  logger("ctrl")->info("child node {} ({}) connected", node, job_.map.nodes[static_cast<size_t>(node)].host);
}

void Daemon::on_job(const wire::Frame& f) {
  job_ = ctrl::decode_job(f.payload);
  have_job_ = true;
  const char* spec = std::getenv("PYTORCH_EXEC_LOG");
  init_logging(job_.cfg.verbosity, spec ? spec : "", opts_.node);
  if (job_.replace_env) {
    env_ = job_.env;
  } else {
    env_ = environment_from(environ);
    for (const auto& [k, v] : job_.env) env_[k] = v;
  }
  const auto& node = job_.map.nodes.at(static_cast<size_t>(job_.node));
  logger("agent")->info("job {}: node {} of {} ({} ranks)", job_.job_id, job_.node, job_.map.nodes.size(),
                        node.ranks.size());
  try {
    plan_ = plan_node(job_.cfg, static_cast<int>(node.ranks.size()));
    agent_ = std::make_unique<NodeAgent>(loop_, *this, this,
                                         "pytorch_execd." + job_.job_id + "." + std::to_string(job_.node),
                                         plan_.topology->raw());
  } catch (const Error& e) {
    wire::Writer w;
    w.i32(0).str(e.what());
    conn_->send(ctrl::Msg::StartFailed, w.data());
    return;
  }
  start_relay();
  wire::Writer w;
  w.i32(find_free_port("0.0.0.0")).i32(acceptor_ ? acceptor_->port() : 0);
  auto addrs = local_ipv4_addresses();
  w.u32(static_cast<uint32_t>(addrs.size()));
  for (const auto& a : addrs) w.str(a);
  conn_->send(ctrl::Msg::Ready, w.data());
}

void Daemon::on_start(const wire::Frame& f) {
  GenerationInfo gen = ctrl::decode_generation(f.payload);
  if (!agent_) return;  // the set-up failed and was reported
  const auto& node = job_.map.nodes.at(static_cast<size_t>(job_.node));
  gen.oversubscribed = oversubscribed_here(node.ranks.size());
  auto specs = node_worker_specs(job_.cfg, env_, job_.map, job_.node, plan_, gen,
                                 job_.stdin_forwarded ? StdinHow::Forward : StdinHow::DevNull);
  if (job_.cfg.report_bindings) {
    std::string r = binding_report(job_.map, job_.node, plan_, gen.generation);
    write_all(2, r.data(), r.size());
  }
  fence_seq_.clear();
  auto ns = namespace_for(job_.map, job_.node, gen);
  try {
    agent_->start(gen.generation, std::move(specs), &ns);
  } catch (const Error& e) {
    wire::Writer w;
    w.i32(static_cast<int>(agent_->live())).str(e.what());
    conn_->send(ctrl::Msg::StartFailed, w.data());
    return;
  }
  send_port();
}

void Daemon::send_port() {
  wire::Writer w;
  w.i32(find_free_port("0.0.0.0"));
  conn_->send(ctrl::Msg::Port, w.data());
}

void Daemon::on_output(int generation, int rank, Stream s, std::string_view lines) {
  if (!conn_) return;
  // Large bursts are split so that no frame comes near the codec's limit.
  constexpr size_t kChunk = 1u << 20;
  while (!lines.empty()) {
    size_t n = lines.size() <= kChunk ? lines.size() : lines.rfind('\n', kChunk) + 1;
    if (n == 0 || n > kChunk) n = std::min(lines.size(), kChunk);
    wire::Writer w;
    w.i32(generation).i32(rank).u8(s == Stream::Out ? 1 : 2).blob(lines.substr(0, n));
    conn_->send(ctrl::Msg::Output, w.data());
    lines.remove_prefix(n);
  }
}

void Daemon::on_exit(const WorkerExit& e) {
  if (conn_) conn_->send(ctrl::Msg::Exit, ctrl::encode_exit(e));
}

void Daemon::on_stdin_drained() {
  if (conn_) conn_->send(ctrl::Msg::StdinDrained);
}

void Daemon::on_abort(int generation, int rank, pid_t pid, int status, const std::string& msg) {
  if (!conn_) return;
  wire::Writer w;
  w.i32(generation).i32(rank).i32(pid).i32(status).str(msg);
  conn_->send(ctrl::Msg::Abort, w.data());
}

void Daemon::fence(const std::string& nspace, bool collect, std::string data, pmix::ModexDone done) {
  if (!conn_) return done(-1, "");
  uint32_t seq = fence_seq_[nspace]++;
  fences_[{nspace, seq}] = std::move(done);
  wire::Writer w;
  w.str(nspace).u32(seq).u8(collect).blob(data);
  conn_->send(ctrl::Msg::Fence, w.data());
}

void Daemon::direct_modex(const std::string& nspace, int rank, pmix::ModexDone done) {
  if (!conn_) return done(-1, "");
  uint64_t id = next_dmodex_++;
  dmodex_[id] = std::move(done);
  wire::Writer w;
  w.u64(id).str(nspace).i32(rank);
  conn_->send(ctrl::Msg::DmodexReq, w.data());
}

}  // namespace pe
