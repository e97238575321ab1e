// The workers of a multi-node job: one pytorch_execd per node, started with srun inside a SLURM
// allocation, else with a launch agent (ssh by default, or --launch-agent "CMD {host}").  The
// daemons connect back over TCP, authenticate with the job's secret and get the job description;
// from then on this class is the front end's end of the control plane: it starts generations,
// forwards signals and stdin, relays PMIx fences and direct-modex requests between nodes, and
// reports the daemons' output, exits and aborts to the job controller.  A daemon that cannot be
// started, or whose connection closes or times out, is reported as a lost node.  A stranger's
// connection that fails the handshake, or any malformed, oversized or out-of-order frame before
// it, is dropped and logged; the job goes on.
//
// Threading: everything runs on the event-loop thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.hpp"
#include "common/line_buffer.hpp"
#include "exec/child_process.hpp"
#include "exec/control.hpp"
#include "exec/workers.hpp"

namespace pe {

class RemoteWorkers : public WorkerSet {
 public:
  RemoteWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg, const EnvMap& env,
                const JobMap& map, const std::string& job_id, const std::string& host,
                bool stdin_forwarded);
  // Closes every connection (the daemons then kill what is left and exit) and waits a moment
  // for the launchers (srun, ssh, ...) to exit, killing them after that.
  ~RemoteWorkers() override;

  void prepare(std::function<void()> ready) override;
  std::string master_addr() override;
  int master_port() override;
  void start(const GenerationInfo& gen) override;
  void signal_all(int sig) override;
  size_t live() const override;
  void stdin_write(int rank, std::string_view data) override;
  void stdin_close_all() override;
  size_t stdin_backlog() const override;
  std::string host_of_rank(int rank) const override;
  std::string format_map() const override;

  // The daemon command line and launcher command for node `node` (exposed for --dry-run
  // and tests).
  std::vector<std::string> launch_command(int node) const;

 private:
  struct Node;
  struct Launcher;
  void launch_daemons();
  void start_launcher(std::vector<std::string> argv, std::vector<int> nodes, bool secret_on_stdin);
  void on_authenticated(Node& n, std::unique_ptr<ctrl::Connection> conn);
  void redirect_waiting();
  void send_job(Node& n);
  void send_to(Node& n, ctrl::Msg type, std::string_view payload);
  void broadcast(ctrl::Msg type, std::string_view payload);
  void on_child_frame(Node& child, wire::Frame& f);
  void on_node_frame(Node& n, wire::Frame& f);
  void node_lost(Node& n, const std::string& why);
  void on_sigchld();
  void on_fence(Node& n, wire::Reader& r);
  void on_dmodex_request(Node& n, wire::Reader& r);
  void on_dmodex_response(Node& n, wire::Reader& r);
  void check_ready();
  std::vector<std::string> daemon_argv(int node, bool slurm) const;
  bool is_own_address(const std::string& a) const;
  std::string address_toward_others() const;
  EnvMap carried_environment() const;

  EventLoop& loop_;
  AgentListener& listener_;
  const LaunchConfig& cfg_;
  const EnvMap& env_;
  const JobMap& map_;
  std::string job_id_;
  std::string host_;
  std::string secret_;
  bool slurm_ = false;
  bool stdin_forwarded_ = false;
  std::string execd_;  // path of pytorch_execd
  std::unique_ptr<ctrl::Acceptor> acceptor_;
  int port_ = 0;
  std::vector<std::string> addresses_;  // where daemons can reach us
  Event sigchld_ev_, ready_timer_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::string, int> node_by_host_;
  std::vector<std::unique_ptr<Launcher>> launchers_;
  std::function<void()> ready_;
  bool prepared_ = false;
  int generation_ = -1;
  // PMIx traffic between nodes.
  struct FenceState {
    std::vector<bool> arrived;
    int count = 0;
    std::vector<std::string> data;  // per node
  };
  std::map<std::pair<std::string, uint32_t>, FenceState> fences_;
  struct DmodexRoute {
    int from_node;
    uint64_t from_id;
  };
  uint64_t next_dmodex_ = 1;
  std::map<uint64_t, DmodexRoute> dmodex_;
};

}  // namespace pe
