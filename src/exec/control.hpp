// The control plane between pytorch_exec (the front end) and the pytorch_execd daemons: message
// types, the job description every daemon receives, and a framed, non-blocking connection on the
// event loop.  Frames are the codec of common/wire.hpp; connections are authenticated as
// common/auth.hpp describes before anything else is accepted on them.
//
// Threading: a Connection is used on its event loop's thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/event_loop.hpp"
#include "common/unique_fd.hpp"
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
};

const char* msg_name(uint16_t type);

// Everything a daemon needs to run its node's part of the job.
struct JobDescription {
  std::string job_id;
  int node = 0;                 // index into map.nodes
  LaunchConfig cfg;
  EnvMap env;                   // carried environment
  bool replace_env = false;     // true: env is the whole environment (SLURM), else added to the daemon's
  bool stdin_forwarded = false; // some ranks get a stdin pipe
  JobMap map;
};

std::string encode_job(const JobDescription& j);
JobDescription decode_job(std::string_view payload);  // throws wire::WireError

std::string encode_generation(const GenerationInfo& g);
GenerationInfo decode_generation(std::string_view payload);

std::string encode_exit(const WorkerExit& e);
WorkerExit decode_exit(std::string_view payload);

// A connected, non-blocking socket carrying frames.  Incoming frames go to on_frame; a
// malformed one (WireError) or one that on_frame rejects by throwing WireError closes the
// connection with the reason, reported once through on_closed.  Never destroy a connection
// inside one of its own callbacks: post() the destruction to the loop.
class Connection {
 public:
  using FrameFn = std::function<void(wire::Frame&)>;
  using ClosedFn = std::function<void(const std::string& why)>;

  Connection(EventLoop& loop, UniqueFd fd, std::string peer, uint32_t max_payload = wire::kMaxPayload);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void on_frame(FrameFn f) { on_frame_ = std::move(f); }
  void set_max_payload(uint32_t max) { decoder_.set_max_payload(max); }
  void on_closed(ClosedFn f) { on_closed_ = std::move(f); }
  void send(Msg type, std::string_view payload = {});
  // Closes now (queued output is dropped); on_closed is not called.
  void close();
  // Sends what is queued (waiting at most `timeout` seconds), then closes.
  void flush_and_close(double timeout);
  bool open() const { return fd_.valid(); }
  const std::string& peer() const { return peer_; }
  int fd() const { return fd_.get(); }
  size_t queued() const { return out_bytes_; }

 private:
  void on_readable();
  void on_writable();
  void fail(const std::string& why);
  bool flush();

  EventLoop& loop_;
  UniqueFd fd_;
  std::string peer_;
  wire::FrameDecoder decoder_;
  Event read_ev_, write_ev_;
  std::deque<std::string> out_;
  size_t out_off_ = 0;
  size_t out_bytes_ = 0;
  FrameFn on_frame_;
  ClosedFn on_closed_;
  bool in_callback_ = false;
};

}  // namespace pe::ctrl
