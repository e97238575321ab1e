// The control plane's messages between pytorch_exec (the front end) and the pytorch_execd daemons:
// message types, the job description every daemon receives, the Routed envelope and the shape of
// the control-plane tree.  Pure encoding and decoding over common/wire.hpp: every decode is
// bounded and throws wire::WireError on anything malformed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire.hpp"
#include "exec/job_map.hpp"
#include "exec/launch_config.hpp"
#include "exec/node_agent.hpp"
#include "exec/worker_env.hpp"

namespace pe::ctrl {

enum class Msg : uint16_t {
  // Handshake (auth.hpp).
  Challenge = 1,   // F->D nonce_f
  Hello = 2,       // D->F node name, nonce_d, proof
  Welcome = 3,     // F->D proof
  Redirect = 4,    // F->D addresses, i32 port: connect to your parent in the tree instead
  // Front end to daemon.
  Job = 10,        // JobDescription
  Start = 11,      // GenerationInfo
  Signal = 12,     // i32 signal
  Stdin = 13,      // i32 rank, bytes
  StdinClose = 14,
  FenceDone = 15,  // str nspace, u32 seq, i32 status, bytes
  DmodexReq = 16,  // u64 id, str nspace, i32 rank (both directions)
  DmodexResp = 17, // u64 id, i32 status, bytes (both directions)
  // Daemon to front end.
  Ready = 30,      // i32 free port
  Output = 31,     // i32 generation, i32 rank, u8 stream, bytes
  Exit = 32,       // WorkerExit
  Abort = 33,      // i32 generation, i32 rank, i32 pid, i32 status, str message
  Fence = 34,      // str nspace, u32 seq, u8 collect, bytes
  StartFailed = 35,  // i32 workers started, str message
  StdinDrained = 36,
  Port = 37,       // i32 free port for the next generation
  Lost = 38,       // str why: a relay lost its child (routed with the child as source)
  Joined = 39,     // after the handshake (with the front end or, in a tree, with the parent)
  // Either way: a frame for (or from) another node of the tree, see wrap().
  Routed = 40,     // u32 node, u16 type, bytes payload
};

// Routed frames to every node.
inline constexpr uint32_t kAllNodes = 0xffffffffu;

// The control-plane tree: nodes 0..radix-1 talk to the front end; node p relays for nodes
// radix + p*radix ... radix + p*radix + radix-1.
int tree_parent(int node, int radix);                       // -1: the front end
std::vector<int> tree_children(int node, int radix, int nnodes);
bool in_subtree(int root, int node, int radix);             // node is root or below it
// The Routed envelope.
std::string wrap(uint32_t node, uint16_t type, std::string_view payload);
struct Routed {
  uint32_t node;
  wire::Frame inner;
};
Routed unwrap(std::string_view payload);

const char* msg_name(uint16_t type);

// Everything a daemon needs to run its node's part of the job.
struct JobDescription {
  std::string job_id;
  int node = 0;                 // index into map.nodes
  LaunchConfig cfg;
  EnvMap env;                   // carried environment
  bool replace_env = false;     // true: env is the whole environment (SLURM), else added to the daemon's
  bool stdin_forwarded = false; // some ranks get a stdin pipe
  int tree_radix = 32;
  JobMap map;
};

std::string encode_job(const JobDescription& j);
JobDescription decode_job(std::string_view payload);  // throws wire::WireError

std::string encode_generation(const GenerationInfo& g);
GenerationInfo decode_generation(std::string_view payload);

std::string encode_exit(const WorkerExit& e);
WorkerExit decode_exit(std::string_view payload);

}  // namespace pe::ctrl
