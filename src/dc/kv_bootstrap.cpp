// ProcessGroup::init(rank, size, exchange): the bootstrap through a key-value exchange that the
// caller provides (torch's c10d::Store in the torch backend), instead of PMIx or env://.  The
// same World as the other bootstraps: every rank publishes its node, tcp address and locality
// domain under one key, rank 0 a random session number that names the group's shared memory.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "dc/bootstrap.hpp"
#include "dc/group.hpp"
#include "dc/settings.hpp"
#include "dc/socket.hpp"

namespace pytorch_exec::dc {
namespace {

// This machine: its host name and boot id (containers may share a host name, not a boot).
std::string machine_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}

std::string node_of_this_rank(const Exchange& x) {
  if (!x.node.empty()) return x.node;
  std::string n = env_or("PYTORCH_DC_NODE", "");
  if (!n.empty()) return n;
  n = env_or("PYTORCH_EXEC_NODEID", "");
  if (!n.empty()) return "job " + env_or("PYTORCH_EXEC_JOBID", "") + " node " + n;
  return machine_identity();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The fields of one rank's record, joined with '\n' (none of them holds one).
std::vector<std::string> fields(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  for (size_t b; (b = s.find('\n', a)) != std::string::npos; a = b + 1)
    out.push_back(s.substr(a, b - a));
  return out;
}

// A Store over the caller's callbacks; errors of the callbacks become dc::Error.
class ExchangeStore : public Store {
 public:
  explicit ExchangeStore(Exchange x) : x_(std::move(x)) {}
  void set(const std::string& key, const std::string& value) override {
    try {
      x_.set(key, value);
    } catch (const std::exception& e) {
      throw Error("bootstrap: storing '" + key + "' failed: " + e.what());
    }
  }
  std::string get(const std::string& key, double timeout) override {
    try {
      return x_.get(key, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError("bootstrap: waiting for '" + key + "' failed: " + e.what());
    }
  }

 private:
  Exchange x_;
};

World bootstrap_exchange(int rank, int size, const Exchange& x, int tcp_port, double timeout) {
  if (!x.set || !x.get) throw Error("init: the exchange needs both set and get");
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("init: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                " is not a rank of the group");
  auto store = std::make_shared<ExchangeStore>(x);
  World w;
  w.rank = rank;
  w.size = size;
  // Keys of this init: the n-th init through the exchange (every rank counts once) uses dc/n/.
  std::string ns = "dc/";
  if (x.add) ns += std::to_string((x.add("dc/inits", 1) - 1) / size) + "/";
  if (rank == 0) store->set(ns + "session", hex(random64()));
  std::string session = store->get(ns + "session", timeout);
  w.session = std::strtoull(session.c_str(), nullptr, 16);
  w.key = "kv" + session;  // the same on every rank (shm names), random per group
  w.allgather = [=](const std::string& key, const std::string& mine) {
    return store_allgather(*store, ns + key, rank, size, mine, timeout);
  };
  std::string toward = x.toward.empty() ? env_or("MASTER_ADDR", "") : x.toward;
  std::string addr =
      tcp_port > 0 ? transport_address(toward) + ":" + std::to_string(tcp_port) : "";
  std::string domain = env_or("PYTORCH_EXEC_DOMAIN", "0");
  auto all = w.allgather("who", node_of_this_rank(x) + "\n" + addr + "\n" + domain + "\n");
  for (auto& a : all) {
    auto f = fields(a);
    if (f.size() != 3) throw Error("bootstrap: malformed record in the exchange");
    w.nodes.push_back(f[0]);
    w.addrs.push_back(f[1]);
    w.domains.push_back(std::atoi(f[2].c_str()));
  }
  return w;
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::init(int rank, int size, const Exchange& exchange,
                                                 const Options& opts) {
  Settings s = resolve_settings(opts);
  std::unique_ptr<Listener> l;
  if (s.uses(TransportKind::Tcp)) l = std::make_unique<Listener>();  // its address is published
  World w = bootstrap_exchange(rank, size, exchange, l ? l->port() : 0, s.timeout);
  return std::make_shared<ProcessGroup>(make_impl(std::move(w), s, l.get()));
}

}  // namespace pytorch_exec::dc
