#include "exec/control_codec.hpp"

namespace pe::ctrl {

const char* msg_name(uint16_t type) {
  switch (static_cast<Msg>(type)) {
    case Msg::Challenge: return "challenge";
    case Msg::Hello: return "hello";
    case Msg::Welcome: return "welcome";
    case Msg::Job: return "job";
    case Msg::Start: return "start";
    case Msg::Signal: return "signal";
    case Msg::Stdin: return "stdin";
    case Msg::StdinClose: return "stdin-close";
    case Msg::FenceDone: return "fence-done";
    case Msg::DmodexReq: return "dmodex-request";
    case Msg::DmodexResp: return "dmodex-response";
    case Msg::Ready: return "ready";
    case Msg::Output: return "output";
    case Msg::Exit: return "exit";
    case Msg::Abort: return "abort";
    case Msg::Fence: return "fence";
    case Msg::StartFailed: return "start-failed";
    case Msg::StdinDrained: return "stdin-drained";
    case Msg::Port: return "port";
    case Msg::Redirect: return "redirect";
    case Msg::Lost: return "lost";
    case Msg::Joined: return "joined";
    case Msg::Routed: return "routed";
  }
  return "unknown";
}

namespace {

void put_strings(wire::Writer& w, const std::vector<std::string>& v) {
  w.u32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) w.str(s);
}

std::vector<std::string> get_strings(wire::Reader& r) {
  uint32_t n = r.u32();
  if (n > r.remaining() / 4) throw wire::WireError("string list longer than its frame");
  std::vector<std::string> v;
  for (uint32_t i = 0; i < n; ++i) v.push_back(r.str());
  return v;
}

void put_ints(wire::Writer& w, const std::vector<int>& v) {
  w.u32(static_cast<uint32_t>(v.size()));
  for (int x : v) w.i32(x);
}

std::vector<int> get_ints(wire::Reader& r) {
  uint32_t n = r.u32();
  if (n > r.remaining() / 4) throw wire::WireError("integer list longer than its frame");
  std::vector<int> v;
  for (uint32_t i = 0; i < n; ++i) v.push_back(r.i32());
  return v;
}

int get_count(wire::Reader& r, int max, const char* what) {
  int v = r.i32();
  if (v < 0 || v > max) throw wire::WireError(std::string("bad ") + what + " " + std::to_string(v));
  return v;
}

// A u8 that is one of E's values, 0 to `last`.
template <typename E>
E get_enum(wire::Reader& r, E last, const char* what) {
  uint8_t v = r.u8();
  if (v > static_cast<uint8_t>(last)) throw wire::WireError(std::string("bad ") + what);
  return static_cast<E>(v);
}

}  // namespace

std::string encode_job(const JobDescription& j) {
  wire::Writer w;
  const LaunchConfig& c = j.cfg;
  w.str(j.job_id).i32(j.node).u8(j.replace_env).u8(j.stdin_forwarded).i32(j.tree_radix);
  w.i32(c.np).str(c.program).str(c.program_arg0);
  put_strings(w, c.args);
  w.u8(static_cast<uint8_t>(c.map_by)).u8(static_cast<uint8_t>(c.rank_by));
  w.u8(static_cast<uint8_t>(c.bind_to)).i32(c.gpus_per_rank).str(c.topology_file);
  w.u8(c.report_bindings).str(c.remote_wdir);  // the daemon's wdir
  w.u32(static_cast<uint32_t>(c.exports.size()));
  for (const auto& [k, v] : c.exports) w.str(k).str(v);
  w.u8(static_cast<uint8_t>(c.stdin_mode)).i32(c.stdin_rank);
  w.i32(c.max_restarts).str(c.run_id).i32(c.verbosity);
  w.u32(static_cast<uint32_t>(j.env.size()));
  for (const auto& [k, v] : j.env) w.str(k).str(v);
  w.i32(j.map.world_size).u32(static_cast<uint32_t>(j.map.nodes.size()));
  for (const auto& n : j.map.nodes) {
    w.str(n.host).i32(n.node_rank);
    put_ints(w, n.ranks);
  }
  return w.take();
}

JobDescription decode_job(std::string_view payload) {
  wire::Reader r(payload);
  JobDescription j;
  LaunchConfig& c = j.cfg;
  j.job_id = r.str(64);
  j.node = r.i32();
  j.replace_env = r.u8() != 0;
  j.stdin_forwarded = r.u8() != 0;
  j.tree_radix = get_count(r, 1 << 20, "tree radix");
  if (j.tree_radix < 1) throw wire::WireError("bad tree radix");
  c.np = get_count(r, 1 << 24, "rank count");
  c.program = r.str();
  c.program_arg0 = r.str();
  c.args = get_strings(r);
  c.map_by = get_enum(r, topo::MapBy::Domain, "map-by");
  c.rank_by = get_enum(r, topo::RankBy::Domain, "rank-by");
  c.bind_to = get_enum(r, topo::BindTo::Gpu, "bind-to");
  c.gpus_per_rank = get_count(r, 4096, "GPUs per rank");
  c.topology_file = r.str();
  c.report_bindings = r.u8() != 0;
  c.wdir = r.str();
  uint32_t nexp = r.u32();
  if (nexp > r.remaining() / 8) throw wire::WireError("export list longer than its frame");
  for (uint32_t i = 0; i < nexp; ++i) {
    std::string k = r.str();
    c.exports.emplace_back(std::move(k), r.str());
  }
  c.stdin_mode = get_enum(r, StdinMode::All, "stdin mode");
  c.stdin_rank = r.i32();
  c.max_restarts = r.i32();
  c.run_id = r.str();
  c.verbosity = r.i32();
  uint32_t nenv = r.u32();
  if (nenv > r.remaining() / 8) throw wire::WireError("environment longer than its frame");
  for (uint32_t i = 0; i < nenv; ++i) {
    std::string k = r.str();
    j.env[k] = r.str();
  }
  j.map.world_size = get_count(r, 1 << 24, "world size");
  uint32_t nnodes = r.u32();
  if (nnodes == 0 || nnodes > r.remaining() / 12) throw wire::WireError("bad node count");
  j.map.ranks.assign(static_cast<size_t>(j.map.world_size), RankLocation{-1, 0});
  for (uint32_t i = 0; i < nnodes; ++i) {
    NodeMap n;
    n.host = r.str(1024);
    n.node_rank = r.i32();
    n.ranks = get_ints(r);
    for (size_t lr = 0; lr < n.ranks.size(); ++lr) {
      int rank = n.ranks[lr];
      if (rank < 0 || rank >= j.map.world_size || j.map.ranks[static_cast<size_t>(rank)].node >= 0)
        throw wire::WireError("bad rank " + std::to_string(rank) + " in the job map");
      j.map.ranks[static_cast<size_t>(rank)] = RankLocation{static_cast<int>(i), static_cast<int>(lr)};
    }
    j.map.nodes.push_back(std::move(n));
  }
  for (const auto& loc : j.map.ranks)
    if (loc.node < 0) throw wire::WireError("the job map leaves a rank out");
  if (j.node < 0 || j.node >= static_cast<int>(nnodes)) throw wire::WireError("bad node index");
  if (c.stdin_rank < 0 || c.stdin_rank >= j.map.world_size) c.stdin_rank = 0;
  r.finish();
  return j;
}

std::string encode_generation(const GenerationInfo& g) {
  wire::Writer w;
  w.str(g.job_id).str(g.run_id).i32(g.generation).i32(g.restart_count).i32(g.max_restarts);
  w.str(g.master_addr).i32(g.master_port).str(g.role_name);
  return w.take();
}

GenerationInfo decode_generation(std::string_view payload) {
  wire::Reader r(payload);
  GenerationInfo g;
  g.job_id = r.str(64);
  g.run_id = r.str();
  g.generation = get_count(r, 1 << 30, "generation");
  g.restart_count = get_count(r, 1 << 30, "restart count");
  g.max_restarts = r.i32();
  g.master_addr = r.str(256);
  g.master_port = get_count(r, 65535, "port");
  g.role_name = r.str(256);
  r.finish();
  return g;
}

std::string encode_exit(const WorkerExit& e) {
  wire::Writer w;
  w.i32(e.rank).i32(e.pid).i32(e.generation).i32(e.status).i32(e.exec_errno);
  w.u8(e.bind_failed).u8(e.pmix_unfinalized);
  return w.take();
}

WorkerExit decode_exit(std::string_view payload) {
  wire::Reader r(payload);
  WorkerExit e;
  e.rank = r.i32();
  e.pid = r.i32();
  e.generation = r.i32();
  e.status = r.i32();
  e.exec_errno = r.i32();
  e.bind_failed = r.u8() != 0;
  e.pmix_unfinalized = r.u8() != 0;
  r.finish();
  return e;
}

int tree_parent(int node, int radix) { return node < radix ? -1 : (node - radix) / radix; }

std::vector<int> tree_children(int node, int radix, int nnodes) {
  std::vector<int> out;
  for (long c = radix + static_cast<long>(node) * radix; c < nnodes && c < radix + (node + 1L) * radix; ++c)
    out.push_back(static_cast<int>(c));
  return out;
}

bool in_subtree(int root, int node, int radix) {
  for (; node >= 0; node = tree_parent(node, radix))
    if (node == root) return true;
  return false;
}

std::string wrap(uint32_t node, uint16_t type, std::string_view payload) {
  wire::Writer w;
  w.u32(node).u16(type).blob(payload);
  return w.take();
}

Routed unwrap(std::string_view payload) {
  wire::Reader r(payload);
  Routed out;
  out.node = r.u32();
  out.inner.type = r.u16();
  out.inner.payload = r.str(wire::kMaxPayload);
  r.finish();
  if (out.inner.type == static_cast<uint16_t>(Msg::Routed)) throw wire::WireError("nested routed frame");
  return out;
}

}  // namespace pe::ctrl
