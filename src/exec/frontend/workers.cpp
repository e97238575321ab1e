#include "exec/frontend/workers.hpp"

#include <unistd.h>

#include "common/error.hpp"
#include "common/net.hpp"

namespace pe {

void WorkerSet::add_node(int) { throw Error("the job cannot take more nodes"); }
void WorkerSet::remove_node(int, const std::string&) {}  // a job of one node has none to remove

LocalWorkers::LocalWorkers(EventLoop& loop, AgentListener& listener, const LaunchConfig& cfg,
                           const EnvMap& env, const JobMap& map, const std::string& job_id,
                           StdinHow stdin_how)
    : loop_(loop), cfg_(cfg), runner_(node_job_for(cfg, map, job_id, 0, {}, false, stdin_how)) {
  if (cfg_.display_topology) {
    std::string t = topo::format_topology(*plan().topology, plan().analysis);
    write_all(1, t.data(), t.size());
  }
  if (cfg_.dry_run) return;
  runner_.open(loop, listener, &modex_, "pytorch_exec." + job_id, env);
}

LocalWorkers::~LocalWorkers() = default;

// The previous generation's workers are gone: its store (and what it holds) goes with them.
int LocalWorkers::master_port() {
  store_.reset();
  try {
    store_ = TorchStore::host(loop_, master_addr(), cfg_.master_port);
  } catch (const SystemError& e) {
    if (!cfg_.master_port) throw;
    throw Error("--master-port " + std::to_string(cfg_.master_port) + ": " + e.what());
  }
  return store_->port();
}

size_t LocalWorkers::stdin_backlog() const { return runner_.agent()->stdin_backlog(); }

std::string LocalWorkers::host_of_rank(int rank) const {
  const JobMap& map = runner_.job().map;
  return map.nodes.at(static_cast<size_t>(map.ranks.at(static_cast<size_t>(rank)).node)).host;
}

std::string LocalWorkers::format_map() const {
  return format_job_map(runner_.job().map, {&plan()});
}

void LocalWorkers::start(const GenerationInfo& gen) { runner_.start(gen); }

}  // namespace pe
