#include "dc/bootstrap.hpp"

#include <pmix.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>

#include "dc/socket.hpp"

namespace pytorch_exec::dc {
namespace {

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string node_name() { return env_or("PYTORCH_DC_NODE", host_name()); }

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Fields joined with '\n' (node names and addresses contain none).
std::string join(const std::vector<std::string>& f) {
  std::string s;
  for (auto& x : f) s += x + '\n';
  return s;
}
// The fields of `s`, each ended by `end`.
std::vector<std::string> split(const std::string& s, char end = '\n') {
  std::vector<std::string> out;
  size_t a = 0;
  for (size_t b; (b = s.find(end, a)) != std::string::npos; a = b + 1)
    out.push_back(s.substr(a, b - a));
  return out;
}

int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x < lo || x > hi)
    throw Error(std::string(name) + "=" + v + " is not a number in " + std::to_string(lo) + ".." +
                std::to_string(hi));
  return static_cast<int>(x);
}

// This rank's locality domain on its node, as pytorch_exec's placement numbers them; 0 without.
std::string my_domain() {
  return std::to_string(std::max(0, env_int("PYTORCH_EXEC_DOMAIN", 0, 1 << 20)));
}

}  // namespace

uint64_t random64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// Each process counts its groups, so that the keys of its second init() differ from the first.
int next_generation() {
  static std::mutex m;
  static int n = 0;
  std::lock_guard<std::mutex> l(m);
  return n++;
}

namespace {

// --- env:// -------------------------------------------------------------------------------

// Rank 0's store outlives the group it was made for: a later init() (a second group while the
// first lives, or after it ended) uses it again, where the other ranks look for it.  A new one on
// the same port would race the old one's end: a rank could prove itself to the old one and lose
// it a moment later, or be reset while the old one closed.
std::shared_ptr<TcpStoreServer> env_store_server(int port, const std::string& master, int* bound) {
  // Never destroyed: at exit (also a forked child's) no static destructor joins its thread.
  static std::mutex m;
  static auto* servers =
      new std::map<std::pair<int, std::string>, std::pair<std::shared_ptr<TcpStoreServer>, int>>;
  std::lock_guard<std::mutex> l(m);
  if (port == 0) return serve_tcp_store(port, master, bound);  // a group of one: its own
  auto& [server, at] = (*servers)[{port, master}];
  if (!server) server = serve_tcp_store(port, master, &at);
  *bound = at;
  return server;
}

World bootstrap_env(int tcp_port, double timeout) {
  int rank = env_int("RANK", 0, 1 << 20), size = env_int("WORLD_SIZE", 1, 1 << 20);
  if (rank < 0 || size < 0)
    throw Error(
        "cannot bootstrap: no PMIx server and RANK/WORLD_SIZE are not set; start the program "
        "with pytorch_exec, srun --mpi=pmix, mpirun or torchrun, or set RANK, WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT");
  if (rank >= size)
    throw Error("RANK=" + std::to_string(rank) +
                " is not below WORLD_SIZE=" + std::to_string(size));
  std::string master = env_or("MASTER_ADDR", size == 1 ? "127.0.0.1" : "");
  int mport = env_int("MASTER_PORT", 1, 65534);
  int port = env_int("PYTORCH_DC_PORT", 1, 65535);
  if (port < 0 && mport > 0) port = mport + 1;
  if (master.empty() || port < 0) {
    if (size > 1)
      throw Error("cannot bootstrap env://: set MASTER_ADDR and MASTER_PORT (or PYTORCH_DC_PORT)");
    port = 0;
  }
  World w;
  w.rank = rank;
  w.size = size;
  // Rank 0's store listens on MASTER_ADDR only (when that is an address of this host).
  std::shared_ptr<TcpStoreServer> server;
  int bound = port;
  if (rank == 0) server = env_store_server(port, master, &bound);
  std::string host = master;
  if (server) host = store_host(*server) == "0.0.0.0" ? "127.0.0.1" : store_host(*server);
  std::shared_ptr<Store> store = connect_tcp_store(host, bound, timeout, server);
  int gen = next_generation();
  std::string g = "g" + std::to_string(gen);
  if (rank == 0) store->set(g + "/session", hex(random64()));
  std::string session = store->get(g + "/session", timeout);
  w.session = std::strtoull(session.c_str(), nullptr, 16);
  w.key = "env" + session + "." + g;
  w.allgather = [=](const std::string& key, const std::string& mine) {
    return store_allgather(*store, g + "/" + key, rank, size, mine, timeout);
  };
  std::string addr = tcp_port > 0 ? facing_address() + ":" + std::to_string(tcp_port) : "";
  auto all = w.allgather("who", join({node_name(), addr, my_domain()}));
  for (size_t r = 0; r < all.size(); ++r) {
    auto f = split(all[r]);
    if (f.size() != 3)
      throw Error("bootstrap: rank " + std::to_string(r) + "'s record under '" + g +
                  "/who' is malformed");
    w.nodes.push_back(f[0]);
    w.addrs.push_back(f[1]);
    w.domains.push_back(std::atoi(f[2].c_str()));
  }
  return w;
}

// --- PMIx ----------------------------------------------------------------------------------

std::mutex pmix_mutex;
int pmix_inits = 0;

void finalize_pmix_at_exit() {
  std::lock_guard<std::mutex> l(pmix_mutex);
  for (; pmix_inits > 0; --pmix_inits) PMIx_Finalize(nullptr, 0);
}

void pmix_check(pmix_status_t rc, const std::string& what) {
  if (rc != PMIX_SUCCESS)
    throw Error("PMIx bootstrap: " + what + " failed: " + PMIx_Error_string(rc));
}

std::string pmix_get_string(const pmix_proc_t& who, const std::string& key, double timeout) {
  pmix_value_t* val = nullptr;
  pmix_info_t info;
  int secs = static_cast<int>(timeout) + 1;
  PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &secs, PMIX_INT);
  pmix_status_t rc = PMIx_Get(&who, key.c_str(), &info, 1, &val);
  PMIX_INFO_DESTRUCT(&info);
  pmix_check(rc, "PMIx_Get(" + key + ") of rank " + std::to_string(who.rank));
  std::string out = val->type == PMIX_STRING && val->data.string ? val->data.string : "";
  PMIX_VALUE_RELEASE(val);
  return out;
}

uint32_t pmix_job_size(const pmix_proc_t& me) {
  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  pmix_value_t* val = nullptr;
  pmix_check(PMIx_Get(&wild, PMIX_JOB_SIZE, nullptr, 0, &val), "PMIx_Get(job size)");
  uint32_t n = val->type == PMIX_UINT32 ? val->data.uint32 : 0;
  PMIX_VALUE_RELEASE(val);
  if (n == 0) throw Error("PMIx bootstrap: the job size is not known");
  return n;
}

void pmix_put_fence(const std::string& key, const std::string& value, const pmix_proc_t& me,
                    double timeout) {
  pmix_value_t v;
  PMIX_VALUE_LOAD(&v, value.c_str(), PMIX_STRING);
  pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key.c_str(), &v);
  PMIX_VALUE_DESTRUCT(&v);
  pmix_check(rc, "PMIx_Put");
  pmix_check(PMIx_Commit(), "PMIx_Commit");
  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  pmix_info_t info[2];
  bool collect = true;
  int secs = static_cast<int>(timeout) + 1;
  PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
  rc = PMIx_Fence(&wild, 1, info, 2);
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  pmix_check(rc, "PMIx_Fence");
}

// Every rank's `mine` under `key`, in rank order: PMIx_Put, a collecting PMIx_Fence, PMIx_Get.
std::vector<std::string> pmix_allgather(const std::string& key, const std::string& mine,
                                        const pmix_proc_t& me, int size, double timeout) {
  pmix_put_fence(key, mine, me, timeout);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, me.nspace, static_cast<pmix_rank_t>(r));
    out.push_back(pmix_get_string(p, key, timeout));
  }
  return out;
}

World bootstrap_pmix(int tcp_port, double timeout) {
  pmix_proc_t me;
  {
    std::lock_guard<std::mutex> l(pmix_mutex);
    pmix_check(PMIx_Init(&me, nullptr, 0), "PMIx_Init");
    if (pmix_inits++ == 0) std::atexit(finalize_pmix_at_exit);
  }
  World w;
  w.rank = static_cast<int>(me.rank);
  w.size = static_cast<int>(pmix_job_size(me));
  std::string ip = facing_address();
  int gen = next_generation();
  std::string prefix = "pytorch_dc." + std::to_string(gen) + ".";
  int size = w.size;
  w.allgather = [=](const std::string& key, const std::string& mine) {
    return pmix_allgather(prefix + key, mine, me, size, timeout);
  };
  std::string addr = tcp_port > 0 ? ip + ":" + std::to_string(tcp_port) : "";
  auto all = w.allgather("who", join({node_name(), addr, hex(random64()), my_domain()}));
  for (int r = 0; r < w.size; ++r) {
    auto f = split(all[static_cast<size_t>(r)]);
    if (f.size() != 4)
      throw Error("PMIx bootstrap: rank " + std::to_string(r) + " published a malformed record");
    w.nodes.push_back(f[0]);
    w.addrs.push_back(f[1]);
    w.domains.push_back(std::atoi(f[3].c_str()));
    if (r == 0) w.session = std::strtoull(f[2].c_str(), nullptr, 16);
  }
  w.key = "pmix" + hex(std::hash<std::string>{}(me.nspace)) + "." + std::to_string(gen);
  return w;
}

bool is_pmix_client() { return std::getenv("PMIX_NAMESPACE") && std::getenv("PMIX_RANK"); }

}  // namespace

std::string env_or(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v && *v ? v : def;
}

double env_number(const char* name, double def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (*end || !(x >= 0) || std::isinf(x))  // NaN and infinity too
    throw Error(std::string(name) + "=" + v + " is not a non-negative number");
  return x;
}

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::vector<std::string> store_allgather(Store& store, const std::string& key, int rank, int size,
                                         const std::string& mine, double timeout) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", timeout);
  store.set(key + "/" + std::to_string(rank), mine);
  // A timeout names who did not come: rank 0 knows which rank; the others, that not all did.
  std::string waited = "'" + key + "' of every rank";
  try {
    if (rank == 0) {
      std::string all;
      for (int r = 0; r < size; ++r) {
        waited = "rank " + std::to_string(r) + " ('" + key + "/" + std::to_string(r) + "')";
        std::string v = r == 0 ? mine : store.get(key + "/" + std::to_string(r), timeout);
        all += std::to_string(v.size()) + ":" + v;
      }
      store.set(key + "/all", all);
    }
    return parse_gathered(store.get(key + "/all", timeout), key + "/all", size);
  } catch (const TimeoutError&) {
    throw TimeoutError("bootstrap: " + waited + " did not arrive within " + secs +
                       " s (of WORLD_SIZE " + std::to_string(size) +
                       "; a rank not started, or started with another RANK or MASTER_ADDR?)");
  }
}

std::vector<std::string> parse_gathered(const std::string& all, const std::string& key, int size) {
  std::vector<std::string> out;
  const std::string bad = "store: the record under '" + key + "' is malformed";
  for (size_t pos = 0; pos < all.size();) {
    size_t colon = all.find(':', pos);
    if (colon == std::string::npos || colon == pos || colon - pos > 10 ||
        out.size() >= static_cast<size_t>(size))
      throw Error(bad);
    size_t len = 0;
    for (size_t i = pos; i < colon; ++i) {
      if (all[i] < '0' || all[i] > '9') throw Error(bad);
      len = len * 10 + static_cast<size_t>(all[i] - '0');
    }
    if (len > all.size() - colon - 1) throw Error(bad);
    out.push_back(all.substr(colon + 1, len));
    pos = colon + 1 + len;
  }
  if (out.size() != static_cast<size_t>(size))
    throw Error("store: allgather of '" + key + "' is incomplete");
  return out;
}

std::string transport_address(const std::string& toward) {
  auto first_with_address = [](const std::string& names) {
    for (const std::string& n : split(names + ',', ',')) {
      std::string a = interface_address(n);
      if (!a.empty()) return a;
    }
    return std::string();
  };
  std::string chosen = env_or("PYTORCH_DC_SOCKET_IFNAME", "");
  if (!chosen.empty()) {
    std::string a = first_with_address(chosen);
    if (a.empty())
      throw Error("PYTORCH_DC_SOCKET_IFNAME=" + chosen +
                  ": no such network interface or RDMA device with an IPv4 address on this host");
    return a;
  }
  if (!env_or("PYTORCH_EXEC_GPU", "").empty()) {
    std::string a = first_with_address(env_or("PYTORCH_EXEC_NIC", ""));
    if (!a.empty()) return a;
  }
  return local_address_toward(toward);
}

std::string facing_address() { return transport_address(env_or("MASTER_ADDR", host_name())); }

World bootstrap_process(int tcp_port, double timeout) {
  std::string how = env_or("PYTORCH_DC_BOOTSTRAP", "");
  if (!how.empty() && how != "pmix" && how != "env")
    throw Error("PYTORCH_DC_BOOTSTRAP=" + how + ": expected pmix or env");
  if (how == "pmix" || (how.empty() && is_pmix_client())) return bootstrap_pmix(tcp_port, timeout);
  return bootstrap_env(tcp_port, timeout);
}

World bootstrap_thread(int rank, int size, std::vector<std::string> nodes,
                       std::shared_ptr<Store> store, uint64_t session, const std::string& key,
                       int tcp_port, double timeout) {
  World w;
  w.rank = rank;
  w.size = size;
  w.threads = true;
  w.session = session;
  w.key = key;
  w.nodes = std::move(nodes);
  w.domains.assign(static_cast<size_t>(size), 0);
  w.allgather = [=](const std::string& k, const std::string& mine) {
    return store_allgather(*store, key + "/" + k, rank, size, mine, timeout);
  };
  std::string addr = tcp_port > 0 ? "127.0.0.1:" + std::to_string(tcp_port) : "";
  w.addrs = w.allgather("addr", addr);
  return w;
}

}  // namespace pytorch_exec::dc
