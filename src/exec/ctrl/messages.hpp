// The control plane's messages between pytorch_exec (the front end) and the pytorch_execd
// daemons.  One struct per message: its fields are the documentation, and one member template
// `io` lists them once for both directions, so that encoding and decoding cannot drift.  Every
// decode is bounded (string lengths, counts) and checked (ranges, trailing bytes) and throws
// wire::WireError on anything malformed.
//
//   send:     conn.send(ctrl::Signal{SIGTERM});
//   receive:  Dispatcher d; d.on<ctrl::Signal>([](ctrl::Signal& m) { ... }); d.dispatch(frame);
//
// Threading: pure functions and values; no shared state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/auth.hpp"
#include "common/wire.hpp"
#include "exec/node/node_job.hpp"
#include "exec/node/spawn_plan.hpp"
#include "exec/node/worker_env.hpp"
#include "exec/node/worker_exit.hpp"

namespace pe::ctrl {

// Fence data travels in pieces of at most this many bytes (Fence, FenceDone with `more`), so
// that a fence is not limited by one frame; a whole fence is limited to kMaxFenceBytes.
inline constexpr uint32_t kFencePiece = 8u << 20;
inline constexpr size_t kMaxFenceBytes = size_t{1} << 30;
// Calls send(piece, more) for each piece of `data`, at least once.
template <class Fn>
void for_each_fence_piece(const std::string& data, Fn send) {
  size_t off = 0;
  do {
    size_t n = std::min<size_t>(kFencePiece, data.size() - off);
    send(data.substr(off, n), off + n < data.size());
    off += n;
  } while (off < data.size());
}

enum class Msg : uint16_t {
  // Handshake (auth.hpp).
  Challenge = 1,
  Hello = 2,
  Welcome = 3,
  Redirect = 4,
  // Front end to daemon (DmodexReq and DmodexResp go both ways).
  Job = 10,
  Start = 11,
  Signal = 12,
  Stdin = 13,
  StdinClose = 14,
  FenceDone = 15,
  DmodexReq = 16,
  DmodexResp = 17,
  ProcFailed = 18,
  Remap = 19,
  SpawnStart = 20,
  SpawnResp = 21,
  LookupResp = 22,
  // Daemon to front end.
  Ready = 30,
  Output = 31,
  Exit = 32,
  Abort = 33,
  Fence = 34,
  StartFailed = 35,
  StdinDrained = 36,
  Port = 37,
  Lost = 38,
  Joined = 39,
  // Either way: a frame for (or from) another node of the tree (tree.hpp).
  Routed = 40,
  // Daemon to front end (MPI_Comm_spawn, PMIx_Publish/PMIx_Lookup).
  SpawnReq = 41,
  SpawnStarted = 42,
  Publish = 43,
  Lookup = 44,
  Unpublish = 45,
  // Either way, between neighbours of the tree only (never routed): I am alive (heartbeat.hpp).
  Heartbeat = 50,
  // Front end to daemon (MPI_Comm_spawn that failed on another node).
  SpawnStop = 60,
  // Join mode (pytorch_exec --rdzv-endpoint): a node that starts its own launcher and joins.
  Refused = 70,  // acceptor to a connecting node instead of a welcome; then it closes
  JobEnd = 71,   // front end to the nodes that joined: the job is over
  // Elastic, before a close: front end to a node it lets go (its host no longer listed), or a
  // node that joined by itself to the front end (it leaves: a signal).
  Leave = 72,
};

inline constexpr uint32_t kMaxAddresses = 256;
inline constexpr uint32_t kMaxKey = 65536;  // a fence's participants (pmix::participants_key)
inline constexpr uint32_t kMaxSpawnApps = 1024;
inline constexpr uint32_t kMaxName = 1024;  // host and node names

// Handshake.  The front end (or a relaying daemon) challenges, the daemon proves it knows the
// job's secret, the front end proves it too (auth.hpp).
// The control protocol: the first field of Challenge and Hello, read before anything else
// (protocol_mismatch), so that a node and a front end from builds whose messages differ say so
// in one line instead of failing to decode.  kProtocolMagic marks the field (the first field of
// an older build's, a string's length, is small); kProtocolVersion changes with every change to
// a message's fields (control_test pins the messages' encodings to it).  1: the builds before
// the field.
inline constexpr uint32_t kProtocolMagic = 0x50430000u;  // "CP" in the high half
inline constexpr uint32_t kProtocolVersion = 6;
inline constexpr uint32_t kProtocol = kProtocolMagic | kProtocolVersion;

// Of a Challenge or Hello payload: "" when it speaks this protocol, else what it speaks
// ("control protocol 3", "an older control protocol, without a version").
std::string protocol_mismatch(const std::string& payload);
// "control protocol 2 (pytorch_exec VERSION)": this build's, for messages.
std::string protocol_here();

struct Challenge {
  static constexpr Msg kType = Msg::Challenge;
  static constexpr const char* kName = "challenge";
  uint32_t protocol = kProtocol;
  std::string nonce;
  template <class IO>
  void io(IO& f) {
    f(protocol), f(nonce, auth::kNonceBytes);
  }
};
struct Hello {
  static constexpr Msg kType = Msg::Hello;
  static constexpr const char* kName = "hello";
  uint32_t protocol = kProtocol;
  std::string node, nonce, proof;
  // Join mode (a node that started by itself, pytorch_exec --rdzv-endpoint): the ranks it
  // brings (its --nproc-per-node) and its fixed node rank (static rendezvous), else -1.  A
  // daemon the front end started sends -1, -1.
  int32_t join_slots = -1;
  int32_t node_rank = -1;
  template <class IO>
  void io(IO& f) {
    f(protocol), f(node, kMaxName), f(nonce, auth::kNonceBytes), f(proof, auth::kProofBytes);
    f(join_slots), f(node_rank);
  }
};
struct Welcome {
  static constexpr Msg kType = Msg::Welcome;
  static constexpr const char* kName = "welcome";
  std::string proof;
  template <class IO>
  void io(IO& f) {
    f(proof, auth::kProofBytes);
  }
};
// The handshake was refused: why, and whether trying again later may succeed (a host kept out
// for its cool-down).  Sent before the connection closes, so that a node that joins by itself
// can say why; it carries nothing the peer did not send.
struct Refused {
  static constexpr Msg kType = Msg::Refused;
  static constexpr const char* kName = "refused";
  std::string why;
  bool retry = false;
  template <class IO>
  void io(IO& f) {
    f(why, kMaxName), f(retry);
  }
};
// What the accepting side says of a node that proved it knows the secret: `why` empty accepts
// it, else it is refused with that reason (told to the node in a Refused frame, and logged), and
// `retry` says whether it may be accepted later (a host in its cool-down).  An accepted node is
// known by `name` when that is not empty (another of the same host's), else by its own.
struct Verdict {
  std::string why;
  bool retry = false;
  std::string name;
  Verdict(std::string w = "", bool r = false) : why(std::move(w)), retry(r) {}
  Verdict(const char* w) : why(w) {}
};

// Connect to your parent in the tree instead, at one of these addresses.
struct Redirect {
  static constexpr Msg kType = Msg::Redirect;
  static constexpr const char* kName = "redirect";
  std::vector<std::string> addrs;
  int32_t port = 0;
  template <class IO>
  void io(IO& f) {
    f(addrs, kMaxAddresses, 256), f.port(port);
  }
};

// Front end to daemon.
struct Job {  // once, after the handshake: everything the node runs
  static constexpr Msg kType = Msg::Job;
  static constexpr const char* kName = "job";
  NodeJob job;
  template <class IO>
  void io(IO& f);
};
struct Start {  // start a generation
  static constexpr Msg kType = Msg::Start;
  static constexpr const char* kName = "start";
  GenerationInfo gen;
  template <class IO>
  void io(IO& f) {
    f(gen.job_id, 64), f(gen.run_id), f.count(gen.generation, 1 << 30);
    f.count(gen.restart_count, 1 << 30), f(gen.max_restarts), f(gen.master_addr, 256);
    f.count(gen.master_port, 65535), f(gen.role_name, 256), f(gen.dc_token, 64);
    f(gen.agent_store);
  }
};
struct Remap {  // elastic: the nodes of the next generation (a node finds itself by its name)
  static constexpr Msg kType = Msg::Remap;
  static constexpr const char* kName = "remap";
  JobMap map;
  template <class IO>
  void io(IO& f) {
    f(map);
  }
};
struct Signal {
  static constexpr Msg kType = Msg::Signal;
  static constexpr const char* kName = "signal";
  int32_t sig = 0;
  template <class IO>
  void io(IO& f) {
    f(sig);
  }
};
struct Stdin {
  static constexpr Msg kType = Msg::Stdin;
  static constexpr const char* kName = "stdin";
  int32_t rank = 0;
  std::string data;
  template <class IO>
  void io(IO& f) {
    f(rank), f(data, wire::kMaxPayload);
  }
};
struct StdinClose {
  static constexpr Msg kType = Msg::StdinClose;
  static constexpr const char* kName = "stdin-close";
  template <class IO>
  void io(IO&) {}
};
struct ProcFailed {  // a process failed: tell the node's processes (a PMIx event) before they stop
  static constexpr Msg kType = Msg::ProcFailed;
  static constexpr const char* kName = "proc-failed";
  int32_t generation = 0;
  int32_t rank = 0;
  int32_t exit_code = 0;
  bool aborted = false;  // MPI_Abort or a signal; else a non-zero exit
  int32_t spawn = 0;     // 0: a rank of the job; else of the generation's spawned job `spawn`
  template <class IO>
  void io(IO& f) {
    f.count(generation, 1 << 30), f.count(rank, 1 << 30), f(exit_code), f(aborted),
        f.count(spawn, 1 << 30);
  }
};
struct FenceDone {  // a fence is complete: everyone's data
  static constexpr Msg kType = Msg::FenceDone;
  static constexpr const char* kName = "fence-done";
  std::string nspace;
  uint32_t seq = 0;
  int32_t status = 0;
  std::string data;   // one piece of at most kFencePiece bytes
  bool more = false;  // more pieces follow (a fence larger than one frame)
  template <class IO>
  void io(IO& f) {
    f(nspace, kMaxKey), f(seq), f(status), f(data, kFencePiece), f(more);
  }
};
struct DmodexReq {  // one rank's committed data, asked for by a rank on another node
  static constexpr Msg kType = Msg::DmodexReq;
  static constexpr const char* kName = "dmodex-request";
  uint64_t id = 0;
  std::string nspace;
  int32_t rank = 0;
  template <class IO>
  void io(IO& f) {
    f(id), f(nspace, 256), f(rank);
  }
};
struct DmodexResp {
  static constexpr Msg kType = Msg::DmodexResp;
  static constexpr const char* kName = "dmodex-response";
  uint64_t id = 0;
  int32_t status = 0;
  std::string data;
  template <class IO>
  void io(IO& f) {
    f(id), f(status), f(data, wire::kMaxPayload);
  }
};

// Daemon to front end.
struct Ready {  // the node is set up
  static constexpr Msg kType = Msg::Ready;
  static constexpr const char* kName = "ready";
  int32_t port = 0;        // of a store the daemon hosts there, for MASTER_PORT
  int32_t child_port = 0;  // where its children in the tree connect (0: none)
  std::vector<std::string> addrs;
  template <class IO>
  void io(IO& f) {
    f(port), f(child_port), f(addrs, kMaxAddresses, 256);
  }
};
struct Output {  // whole lines of one rank
  static constexpr Msg kType = Msg::Output;
  static constexpr const char* kName = "output";
  int32_t generation = 0, rank = 0;
  uint8_t stream = 1;  // 1 stdout, 2 stderr
  std::string data;
  int32_t spawn = 0;  // > 0: a process of that spawned job (MPI_Comm_spawn)
  template <class IO>
  void io(IO& f) {
    f(generation), f(rank), f(stream), f(data, wire::kMaxPayload), f.count(spawn, 1 << 30);
  }
};
struct Exit {
  static constexpr Msg kType = Msg::Exit;
  static constexpr const char* kName = "exit";
  WorkerExit e;
  template <class IO>
  void io(IO& f) {
    f(e.rank), f(e.pid), f(e.generation), f(e.status), f(e.exec_errno), f(e.bind_failed);
    f(e.pmix_unfinalized), f.count(e.spawn, 1 << 30), f(e.error, kMaxWorkerError);
    f(e.aborted), f(e.abort_status), f(e.abort_message, kMaxWorkerError);
  }
};
struct Abort {  // a rank called PMIx_Abort (MPI_Abort)
  static constexpr Msg kType = Msg::Abort;
  static constexpr const char* kName = "abort";
  int32_t generation = 0, rank = 0, pid = 0, status = 0;
  std::string message;
  template <class IO>
  void io(IO& f) {
    f(generation), f(rank), f(pid), f(status), f(message);
  }
};
struct Fence {  // this node's contribution to a fence
  static constexpr Msg kType = Msg::Fence;
  static constexpr const char* kName = "fence";
  std::string nspace;
  uint32_t seq = 0;
  bool collect = false;
  std::string data;   // one piece of at most kFencePiece bytes
  bool more = false;  // more pieces follow
  template <class IO>
  void io(IO& f) {
    f(nspace, kMaxKey), f(seq), f(collect), f(data, kFencePiece), f(more);
  }
};
struct StartFailed {
  static constexpr Msg kType = Msg::StartFailed;
  static constexpr const char* kName = "start-failed";
  int32_t started = 0;  // workers that did start
  std::string message;
  template <class IO>
  void io(IO& f) {
    f(started), f(message);
  }
};
struct StdinDrained {
  static constexpr Msg kType = Msg::StdinDrained;
  static constexpr const char* kName = "stdin-drained";
  template <class IO>
  void io(IO&) {}
};
struct Port {  // the port of the store the daemon hosts for the next generation's MASTER_PORT
  static constexpr Msg kType = Msg::Port;
  static constexpr const char* kName = "port";
  int32_t port = 0;
  template <class IO>
  void io(IO& f) {
    f(port);
  }
};
struct Lost {  // a relay lost its child (routed with the child as the source)
  static constexpr Msg kType = Msg::Lost;
  static constexpr const char* kName = "lost";
  std::string why;
  template <class IO>
  void io(IO& f) {
    f(why);
  }
};
struct Joined {  // after the handshake, with the front end or, in a tree, with the parent
  static constexpr Msg kType = Msg::Joined;
  static constexpr const char* kName = "joined";
  template <class IO>
  void io(IO&) {}
};

// MPI_Comm_spawn across nodes: a node's request goes to the front end, which places the
// processes (plan_spawn) and tells every node of the generation (SpawnStart: each registers the
// namespace, those with processes start them), then answers the asking node once all did.
template <class IO>
void apps_io(IO& f, std::vector<pmix::SpawnApp>& apps) {
  uint32_t n = static_cast<uint32_t>(apps.size());
  f(n);
  if (n > kMaxSpawnApps) throw wire::WireError("too many applications in a spawn");
  apps.resize(n);
  for (auto& a : apps) {
    f(a.cmd), f(a.argv, 1u << 16), f(a.env, 1u << 16), f(a.cwd), f.count(a.maxprocs, 1 << 20);
    f(a.hosts, 1u << 16), f(a.hostfile);
  }
}
struct SpawnReq {
  static constexpr Msg kType = Msg::SpawnReq;
  static constexpr const char* kName = "spawn-request";
  uint64_t id = 0;
  pmix::SpawnRequest req;
  template <class IO>
  void io(IO& f) {
    f(id), f(req.parent_nspace, 256), f.count(req.parent_rank, 1 << 30), apps_io(f, req.apps);
  }
};
struct SpawnResp {  // "" error: started in `nspace`
  static constexpr Msg kType = Msg::SpawnResp;
  static constexpr const char* kName = "spawn-response";
  uint64_t id = 0;
  std::string error, nspace;
  template <class IO>
  void io(IO& f) {
    f(id), f(error), f(nspace, 256);
  }
};
struct SpawnStart {
  static constexpr Msg kType = Msg::SpawnStart;
  static constexpr const char* kName = "spawn-start";
  SpawnJob job;
  template <class IO>
  void io(IO& f) {
    f(job.nspace, 256), f.count(job.generation, 1 << 30), f.count(job.number, 1 << 30);
    f(job.parent_nspace, 256), f.count(job.parent_rank, 1 << 30), apps_io(f, job.apps);
    f(job.appnum, 1u << 24), f(job.map), f.count(job.universe_size, 1 << 30);
  }
};
struct SpawnStarted {  // a node's answer to SpawnStart
  static constexpr Msg kType = Msg::SpawnStarted;
  static constexpr const char* kName = "spawn-started";
  std::string nspace;
  int32_t started = 0;  // processes started here
  std::string error;    // "": all of this node's
  template <class IO>
  void io(IO& f) {
    f(nspace, 256), f.count(started, 1 << 24), f(error);
  }
};
// PMIx_Publish / PMIx_Lookup / PMIx_Unpublish, kept by the front end for every node (values
// packed by PMIx).
struct Publish {
  static constexpr Msg kType = Msg::Publish;
  static constexpr const char* kName = "publish";
  std::vector<std::pair<std::string, std::string>> kv;
  template <class IO>
  void io(IO& f) {
    f(kv);
  }
};
struct Lookup {
  static constexpr Msg kType = Msg::Lookup;
  static constexpr const char* kName = "lookup";
  uint64_t id = 0;
  std::vector<std::string> keys;
  template <class IO>
  void io(IO& f) {
    f(id), f(keys, 1u << 16);
  }
};
struct LookupResp {  // what was found (perhaps nothing)
  static constexpr Msg kType = Msg::LookupResp;
  static constexpr const char* kName = "lookup-response";
  uint64_t id = 0;
  std::vector<std::pair<std::string, std::string>> found;
  template <class IO>
  void io(IO& f) {
    f(id), f(found);
  }
};
struct Unpublish {
  static constexpr Msg kType = Msg::Unpublish;
  static constexpr const char* kName = "unpublish";
  std::vector<std::string> keys;
  template <class IO>
  void io(IO& f) {
    f(keys, 1u << 16);
  }
};
// A spawned job that could not be started everywhere: this node's processes of it are killed
// (their exits are no failure of the job).
struct SpawnStop {
  static constexpr Msg kType = Msg::SpawnStop;
  static constexpr const char* kName = "spawn-stop";
  int32_t generation = 0;
  int32_t spawn = 0;  // its number in the generation
  template <class IO>
  void io(IO& f) {
    f.count(generation, 1 << 30), f.count(spawn, 1 << 30);
  }
};
// Join mode: the job is over (front end to the nodes that joined by themselves), with
// pytorch_exec's exit status, which theirs becomes.
struct JobEnd {
  static constexpr Msg kType = Msg::JobEnd;
  static constexpr const char* kName = "job-end";
  int32_t status = 0;
  template <class IO>
  void io(IO& f) {
    f.count(status, 255);
  }
};
// Elastic: the front end lets this node go (its host is no longer listed), and closes its
// connection next: the daemon stops its workers and exits as it would on a lost front end, but
// says nothing of it (the front end said why).  The other way, from a node that joined by
// itself and leaves (its pytorch_exec got a signal): the front end reports the loss with `why`.
struct Leave {
  static constexpr Msg kType = Msg::Leave;
  static constexpr const char* kName = "leave";
  std::string why;
  template <class IO>
  void io(IO& f) {
    f(why, kMaxName);
  }
};
// Sent every heartbeat interval over each link of the tree, both ways (heartbeat.hpp).
struct Heartbeat {
  static constexpr Msg kType = Msg::Heartbeat;
  static constexpr const char* kName = "heartbeat";
  template <class IO>
  void io(IO&) {}
};

// Routed frames to every node.
inline constexpr uint32_t kAllNodes = 0xffffffffu;

// A frame for (or from) another node of the tree.
struct Routed {
  static constexpr Msg kType = Msg::Routed;
  static constexpr const char* kName = "routed";
  uint32_t node = 0;
  wire::Frame inner;
  template <class IO>
  void io(IO& f) {
    f(node), f(inner.type), f(inner.payload, wire::kMaxPayload);
  }
};

using AllMessages =
    std::tuple<Challenge, Hello, Welcome, Redirect, Job, Start, Remap, Signal, Stdin, StdinClose,
               ProcFailed, FenceDone, DmodexReq, DmodexResp, Ready, Output, Exit, Abort, Fence,
               StartFailed, StdinDrained, Port, Lost, Joined, Routed, SpawnReq, SpawnResp,
               SpawnStart, SpawnStarted, Publish, Lookup, LookupResp, Unpublish, Heartbeat,
               SpawnStop, Refused, JobEnd, Leave>;

// Writes fields (see the message structs' io()).
class Encoder {
 public:
  explicit Encoder(wire::Writer& w) : w_(w) {}
  void operator()(const std::string& s, uint32_t max = wire::kMaxString);
  void operator()(bool v) { w_.u8(v); }
  void operator()(uint8_t v) { w_.u8(v); }
  void operator()(uint16_t v) { w_.u16(v); }
  void operator()(uint32_t v) { w_.u32(v); }
  void operator()(int32_t v) { w_.i32(v); }
  void operator()(uint64_t v) { w_.u64(v); }
  void operator()(const std::vector<std::string>& v, uint32_t max_count, uint32_t = 0);
  void operator()(const std::vector<int>& v, uint32_t max_count);
  void operator()(const std::vector<std::pair<std::string, std::string>>& v);
  void operator()(const EnvMap& v);
  void operator()(const JobMap& m);
  template <class E>
  void choice(E v, E) {
    w_.u8(static_cast<uint8_t>(v));
  }
  void count(int v, int) { w_.i32(v); }
  void port(int v) { w_.i32(v); }

 private:
  wire::Writer& w_;
};

// Reads fields back; throws wire::WireError on anything out of bounds.
class Decoder {
 public:
  explicit Decoder(wire::Reader& r) : r_(r) {}
  void operator()(std::string& s, uint32_t max = wire::kMaxString) { s = r_.str(max); }
  void operator()(bool& v) { v = r_.u8() != 0; }
  void operator()(uint8_t& v) { v = r_.u8(); }
  void operator()(uint16_t& v) { v = r_.u16(); }
  void operator()(uint32_t& v) { v = r_.u32(); }
  void operator()(int32_t& v) { v = r_.i32(); }
  void operator()(uint64_t& v) { v = r_.u64(); }
  void operator()(std::vector<std::string>& v, uint32_t max_count, uint32_t max_len = 0);
  void operator()(std::vector<int>& v, uint32_t max_count);
  void operator()(std::vector<std::pair<std::string, std::string>>& v);
  void operator()(EnvMap& v);
  void operator()(JobMap& m);
  template <class E>
  void choice(E& v, E last) {
    uint8_t x = r_.u8();
    if (x > static_cast<uint8_t>(last)) throw wire::WireError("value out of range");
    v = static_cast<E>(x);
  }
  void count(int& v, int max);  // 0 ... max
  void port(int& v);            // 1 ... 65535

 private:
  wire::Reader& r_;
};

template <class IO>
void Job::io(IO& f) {
  f(job.job_id, 64), f(job.node), f.count(job.tree_radix, 1 << 20), f(job.verbosity);
  f(job.program), f(job.program_arg0), f(job.args, 1u << 20), f(job.wdir), f(job.exports);
  f(job.prefix), f(job.env), f(job.replace_env);
  f.choice(job.placement.map_by, topo::MapBy::Ppr);
  f.choice(job.placement.rank_by, topo::RankBy::Socket);
  f.choice(job.placement.bind_to, topo::BindTo::Socket);
  f.count(job.placement.gpus_per_rank, 4096), f(job.placement.topology_file);
  f.count(job.placement.ppr, 4096), f.choice(job.placement.ppr_object, topo::MapBy::Ppr);
  f.count(job.placement.pe, 4096), f(job.placement.bind_overload);
  f(job.placement.hwthread_cpus), f(job.placement.places, 1u << 20, PlacementRequest::kMaxPlace);
  f(job.placement.cpu_set), f(job.placement.cpu_list), f(job.placement.cpu_list_ordered);
  f(job.report_bindings), f.choice(job.stdin_mode, StdinMode::All), f(job.stdin_rank);
  f.choice(job.stdin_how, StdinHow::Direct), f(job.map), f(job.oversubscribe);
  f(job.stdout_tty), f.count(job.tty_rows, 65535), f.count(job.tty_cols, 65535);
}

// Checks beyond the fields' own bounds, after a decode (throws wire::WireError).
void validate(const Job& m);
void validate(const Routed& m);
void validate(const Signal& m);
void validate(const SpawnStart& m);
template <class M>
void validate(const M&) {}

template <class M>
std::string encode(const M& m) {
  wire::Writer w;
  Encoder e(w);
  const_cast<M&>(m).io(e);  // io() only reads through an Encoder
  return w.take();
}

template <class M>
M decode(std::string_view payload) {
  wire::Reader r(payload);
  Decoder d(r);
  M m;
  m.io(d);
  r.finish();
  validate(m);
  return m;
}

const char* msg_name(uint16_t type);

// Decodes a payload as the message its type names (and drops it): for the fuzzer and for
// checking a frame before it is relayed.  Throws wire::WireError for an unknown type too.
void decode_any(uint16_t type, std::string_view payload);

// Handlers by message type, one line per message.  A frame with no handler is an error
// ("unexpected X frame").  Ctx is what the caller passes along (for example the node a frame
// came from).
template <class... Ctx>
class Dispatcher {
 public:
  template <class M, class F>
  Dispatcher& on(F f) {
    handlers_[static_cast<uint16_t>(M::kType)] = [f](Ctx... ctx, std::string_view payload) {
      M m = decode<M>(payload);
      f(ctx..., m);
    };
    return *this;
  }
  bool handles(uint16_t type) const { return handlers_.count(type) != 0; }
  void dispatch(const wire::Frame& fr, Ctx... ctx) const {
    auto it = handlers_.find(fr.type);
    if (it == handlers_.end())
      throw wire::WireError(std::string("unexpected ") + msg_name(fr.type) + " frame");
    it->second(ctx..., fr.payload);
  }

 private:
  std::map<uint16_t, std::function<void(Ctx..., std::string_view)>> handlers_;
};

}  // namespace pe::ctrl
