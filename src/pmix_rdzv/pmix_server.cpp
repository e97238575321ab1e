#include "pmix_rdzv/pmix_server.hpp"

#include "pmix_rdzv/pmix_server_impl.hpp"
#include "topology/hwloc_init.hpp"

#include <hwloc.h>
#include <pmix.h>
#include <pmix_server.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>

#include "common/log.hpp"
#include "common/stale_dirs.hpp"
#include "common/strings.hpp"

namespace pe::pmix {

PmixError::PmixError(const std::string& what, int status)
    : pe::Error(what + ": " + PMIx_Error_string(status)), status_(status) {}

void check(int status, const std::string& what) {
  if (status != PMIX_SUCCESS && status != PMIX_OPERATION_SUCCEEDED) throw PmixError(what, status);
}

PmixServer::Impl* g_impl = nullptr;
// Held shared by post_upcall, exclusively while g_impl changes (on the host's thread).
std::shared_mutex g_impl_mu;
std::atomic<bool> g_process_ends{false};  // end_with_process()

std::mutex g_clients_mu;
std::set<std::string> g_clients;  // the namespaces a client connected to (note_client)
bool g_server_left = false;       // a server was left running (end_with_process)

void note_client(const std::string& nspace) {
  std::lock_guard<std::mutex> lock(g_clients_mu);
  g_clients.insert(nspace);
}

bool post_upcall(std::function<void()> fn) {
  std::shared_lock<std::shared_mutex> lock(g_impl_mu);
  if (!g_impl) return false;
  g_impl->loop.post(std::move(fn));
  return true;
}

namespace {

void set_impl(PmixServer::Impl* impl) {
  std::unique_lock<std::shared_mutex> lock(g_impl_mu);
  g_impl = impl;
}

// A private directory in /dev/shm for the ranks' shared-memory files (Open MPI's vader
// segments), removed with the server or by the orphan guard; "" without a writable /dev/shm.
std::string make_shm_dir() {
  char templ[] = "/dev/shm/pytorch_exec.XXXXXX";
  if (!::mkdtemp(templ)) {
    logger("pmix")->debug("no private directory in /dev/shm: {}", std::strerror(errno));
    return "";
  }
  mark_owner(templ);
  return templ;
}

}  // namespace

PmixServer::PmixServer(EventLoop& loop, ServerListener& listener, ModexRouter& router,
                       const std::string& server_nspace, hwloc_topology_t topology)
    : impl_(std::make_unique<Impl>(loop, listener, router)) {
  if (g_impl || g_server_left) throw Error("only one PMIx server per process");
  const char* base = std::getenv("TMPDIR");
  const std::string parent = base && *base ? base : "/tmp";
  std::string templ = parent + "/pytorch_exec.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw SystemError("mkdtemp " + templ, errno);
  impl_->tmpdir = buf.data();
  mark_owner(impl_->tmpdir);
  impl_->shm_dir = make_shm_dir();
  try {
    impl_->sweep = std::thread([parent] {
      remove_stale(parent);
      remove_stale("/dev/shm");
    });
  } catch (const std::system_error&) {  // no thread to be had: the next server sweeps
  }
  static pmix_server_module_t module;
  std::memset(&module, 0, sizeof module);
  module.client_connected = Impl::client_connected;
  module.client_finalized = Impl::client_finalized;
  module.abort = Impl::abort;
  module.fence_nb = Impl::fence_nb;
  module.direct_modex = Impl::direct_modex;
  module.publish = Impl::publish;
  module.lookup = Impl::lookup;
  module.unpublish = Impl::unpublish;
  module.job_control = Impl::job_control;
  module.spawn = Impl::spawn;
  module.connect = Impl::connect;
  module.disconnect = Impl::disconnect;
  InfoList il;
  il.str(PMIX_SERVER_TMPDIR, impl_->tmpdir);
  il.str(PMIX_SYSTEM_TMPDIR, impl_->tmpdir);
  il.str(PMIX_SERVER_NSPACE, server_nspace);
  il.rank(PMIX_SERVER_RANK, 0);
  impl_->topo = topology;
  if (!impl_->topo) {
    impl_->own_topo = true;
    if (topo::init_hwloc_topology(&impl_->topo) != 0 ||
        hwloc_topology_set_io_types_filter(impl_->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0 ||
        hwloc_topology_load(impl_->topo) != 0) {
      if (impl_->own_topo) hwloc_topology_destroy(impl_->topo);
      impl_->topo = nullptr;
      impl_->own_topo = false;
    }
  }
  if (impl_->topo) {
    impl_->pmix_topo.source = const_cast<char*>("hwloc");
    impl_->pmix_topo.topology = impl_->topo;
    il.add(PMIX_TOPOLOGY2, &impl_->pmix_topo, PMIX_TOPO);
    char* xml = nullptr;
    int len = 0;
    if (hwloc_topology_export_xmlbuffer(impl_->topo, &xml, &len, 0) == 0 && xml) {
      impl_->topo_xml.assign(xml, static_cast<size_t>(len > 0 ? len - 1 : 0));
      hwloc_free_xmlbuffer(impl_->topo, xml);
    }
  }
  pmix_data_array_t arr;
  il.convert(&arr);
  set_impl(impl_.get());
  // Clients prove who they are by the socket's credentials (psec "native"), which is all a
  // node-local server needs.  Left to choose, PMIx also starts its munge module, which asks
  // munged for a credential at once: where munge is installed but munged is not running (its
  // socket left behind), that alone took 2.3 s of retries in every server and every client.
  // The ranks inherit the setting, so client and server agree.  A user's choice stands.
  ::setenv("PMIX_MCA_psec", "native", 0);
  pmix_status_t st = PMIx_server_init(&module, static_cast<pmix_info_t*>(arr.array), arr.size);
  PMIX_DATA_ARRAY_DESTRUCT(&arr);
  if (st != PMIX_SUCCESS) {
    set_impl(nullptr);
    if (impl_->own_topo) hwloc_topology_destroy(impl_->topo);
    std::filesystem::remove_all(impl_->tmpdir);
    if (!impl_->shm_dir.empty()) std::filesystem::remove_all(impl_->shm_dir);
    throw PmixError("PMIx_server_init", st);
  }
  logger("pmix")->debug("PMIx server up, tmpdir {}", impl_->tmpdir);
}

namespace {

// PMIx 4.2.2's server can deadlock in PMIx_server_finalize after a client died in the middle of
// its connection handshake (its connection handler's error path leaves a lock held; seen when a
// job is stopped while spawned processes connect).  The process is ending: finalize in a thread
// of its own, and go on without it after a while.
constexpr auto kFinalizeTimeout = std::chrono::seconds(5);

bool finalize_within_timeout() {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  std::thread([done] {
    PMIx_server_finalize();
    done->set_value();
  }).detach();
  return fut.wait_for(kFinalizeTimeout) == std::future_status::ready;
}

}  // namespace

void PmixServer::end_with_process() { g_process_ends = true; }
bool PmixServer::ends_with_process() { return g_process_ends; }

PmixServer::~PmixServer() {
  // Left running where the process ends with the server (end_with_process).
  const bool finalized = !g_process_ends && finalize_within_timeout();
  g_server_left = !finalized;
  if (!finalized && !g_process_ends)
    logger("pmix")->warn("PMIx_server_finalize did not return within {} s; going on without it",
                         kFinalizeTimeout.count());
  set_impl(nullptr);
  if (impl_->own_topo && finalized) hwloc_topology_destroy(impl_->topo);
  std::error_code ec;
  std::filesystem::remove_all(impl_->tmpdir, ec);
  if (!impl_->shm_dir.empty()) std::filesystem::remove_all(impl_->shm_dir, ec);
}

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> r;
  for (int x : ranks) r.push_back(std::to_string(x));
  return join(r, ",");
}

using CString = std::unique_ptr<char, decltype(&::free)>;
using Bitmap = std::unique_ptr<hwloc_bitmap_s, decltype(&hwloc_bitmap_free)>;

int num_apps(const NamespaceInfo& info) {
  int n = 1;
  for (int a : info.appnum) n = std::max(n, a + 1);
  return n;
}

int appnum_of(const NamespaceInfo& info, int rank) {
  return info.appnum.empty() ? 0 : info.appnum.at(static_cast<size_t>(rank));
}

// The applications: the first at job level (as one application's job has it), and each in a
// PMIX_APP_INFO_ARRAY: its number, its lowest rank, its size.
void add_app_info(InfoList& il, const NamespaceInfo& info) {
  int napps = num_apps(info);
  std::vector<int> size(static_cast<size_t>(napps), 0), leader(static_cast<size_t>(napps), -1);
  for (int r = 0; r < info.world_size; ++r) {
    auto a = static_cast<size_t>(appnum_of(info, r));
    if (size[a]++ == 0) leader[a] = r;
  }
  il.u32(PMIX_APPNUM, 0);
  il.rank(PMIX_APPLDR, static_cast<pmix_rank_t>(std::max(0, leader[0])));
  il.u32(PMIX_APP_SIZE, static_cast<uint32_t>(size[0]));
  for (size_t a = 0; a < size.size(); ++a) {
    InfoList app;
    app.u32(PMIX_APPNUM, static_cast<uint32_t>(a));
    app.rank(PMIX_APPLDR, static_cast<pmix_rank_t>(std::max(0, leader[a])));
    app.u32(PMIX_APP_SIZE, static_cast<uint32_t>(size[a]));
    pmix_data_array_t arr;
    app.convert(&arr);
    il.add(PMIX_APP_INFO_ARRAY, &arr, PMIX_DATA_ARRAY);
    PMIX_DATA_ARRAY_DESTRUCT(&arr);
  }
}

// This node's keys (none on a node without processes of the namespace).
void add_node_info(InfoList& il, const NamespaceInfo& info) {
  if (info.this_node < 0) return;
  const auto& local = info.node_ranks.at(static_cast<size_t>(info.this_node));
  // This node.
  il.str(PMIX_HOSTNAME, info.hosts.at(static_cast<size_t>(info.this_node)));
  il.u32(PMIX_NODEID, static_cast<uint32_t>(info.this_node));
  il.str(PMIX_LOCAL_PEERS, rank_list(local));
  il.u32(PMIX_LOCAL_SIZE, static_cast<uint32_t>(local.size()));
  il.u32(PMIX_NODE_SIZE, static_cast<uint32_t>(local.size()));
  il.rank(PMIX_LOCALLDR, local.empty() ? 0 : static_cast<pmix_rank_t>(local.front()));
  // As mpirun says it: more of the job's ranks on this node than it has processors.
  il.flag(PMIX_NODE_OVERSUBSCRIBED, info.oversubscribed);
}

// Job-, application- and node-level keys.
void add_job_info(InfoList& il, const NamespaceInfo& info, const std::string& tmpdir,
                  const std::string& nsdir, const std::string& topo_xml) {
  std::vector<std::string> per_node;
  for (const auto& ranks : info.node_ranks) per_node.push_back(rank_list(ranks));
  char* nodes = nullptr;
  char* procs = nullptr;
  check(PMIx_generate_regex(join(info.hosts, ",").c_str(), &nodes), "PMIx_generate_regex");
  CString node_regex(nodes, &::free);
  check(PMIx_generate_ppn(join(per_node, ";").c_str(), &procs), "PMIx_generate_ppn");
  CString proc_regex(procs, &::free);
  il.str(PMIX_JOBID, info.nspace);
  il.u32(PMIX_UNIV_SIZE,
         static_cast<uint32_t>(info.universe_size > 0 ? info.universe_size : info.world_size));
  il.u32(PMIX_JOB_SIZE, static_cast<uint32_t>(info.world_size));
  il.u32(PMIX_MAX_PROCS, static_cast<uint32_t>(info.world_size));
  il.u32(PMIX_NUM_NODES, static_cast<uint32_t>(info.hosts.size()));
  il.u32(PMIX_JOB_NUM_APPS, static_cast<uint32_t>(num_apps(info)));
  il.add(PMIX_NODE_MAP, node_regex.get(), PMIX_REGEX);
  il.add(PMIX_PROC_MAP, proc_regex.get(), PMIX_REGEX);
  il.str(PMIX_TMPDIR, tmpdir);
  il.str(PMIX_NSDIR, nsdir);
  // Open MPI 4.1's ess/pmi loads this instead of discovering the machine in every rank.
  if (!topo_xml.empty()) il.str(PMIX_LOCAL_TOPO, topo_xml);
  add_node_info(il, info);
  add_app_info(il, info);
  if (!info.parent_nspace.empty()) {  // a spawned job: who asked for it
    pmix_proc_t parent;
    PMIX_LOAD_PROCID(&parent, info.parent_nspace.c_str(),
                     static_cast<pmix_rank_t>(info.parent_rank));
    il.add(PMIX_PARENT_ID, &parent, PMIX_PROC);
    il.flag(PMIX_SPAWNED, true);
  }
}

std::string list_of(hwloc_const_bitmap_t set) {
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, set) < 0 || !s) return "";
  return CString(s, &::free).get();
}

// Where a bound process sits, as Open MPI writes and compares it: for each kind of object
// (package SK, caches L3 L2 L1, core CR, hardware thread HT, NUMA node NM) the logical indexes
// of those its processors touch, "SK0:L30:L20:L10:CR0:HT0:NM0".
std::string locality_string(hwloc_topology_t topo, hwloc_const_bitmap_t cpus) {
  std::string out;
  const std::pair<hwloc_obj_type_t, const char*> kinds[] = {
      {HWLOC_OBJ_PACKAGE, "SK"}, {HWLOC_OBJ_L3CACHE, "L3"}, {HWLOC_OBJ_L2CACHE, "L2"},
      {HWLOC_OBJ_L1CACHE, "L1"}, {HWLOC_OBJ_CORE, "CR"},    {HWLOC_OBJ_PU, "HT"},
      {HWLOC_OBJ_NUMANODE, "NM"}};
  for (const auto& [type, tag] : kinds) {
    Bitmap touched(hwloc_bitmap_alloc(), &hwloc_bitmap_free);
    int n = hwloc_get_nbobjs_by_type(topo, type);
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, static_cast<unsigned>(i));
      if (o && o->cpuset && hwloc_bitmap_intersects(o->cpuset, cpus))
        hwloc_bitmap_set(touched.get(), o->logical_index);
    }
    if (hwloc_bitmap_iszero(touched.get())) continue;
    out += (out.empty() ? "" : ":") + std::string(tag) + list_of(touched.get());
  }
  return out;
}

// Every process of the job: where it runs.  A bound process of this node also gets its
// processors and its locality; an unbound one has no locality (PMIx's rule: Open MPI then
// treats local peers as sharing the node and nothing smaller).
void add_proc_info(InfoList& il, const NamespaceInfo& info, const std::string& nsdir,
                   hwloc_topology_t topo) {
  for (size_t node = 0; node < info.node_ranks.size(); ++node) {
    const auto& ranks = info.node_ranks[node];
    for (size_t lr = 0; lr < ranks.size(); ++lr) {
      InfoList p;
      p.rank(PMIX_RANK, static_cast<pmix_rank_t>(ranks[lr]));
      int app = appnum_of(info, ranks[lr]);
      int app_rank = 0;  // its rank within its application
      for (int r = 0; r < ranks[lr]; ++r) app_rank += appnum_of(info, r) == app;
      p.u32(PMIX_APPNUM, static_cast<uint32_t>(app));
      p.rank(PMIX_APP_RANK, static_cast<pmix_rank_t>(app_rank));
      p.rank(PMIX_GLOBAL_RANK, static_cast<pmix_rank_t>(ranks[lr]));
      p.u16(PMIX_LOCAL_RANK, static_cast<uint16_t>(lr));
      p.u16(PMIX_NODE_RANK, static_cast<uint16_t>(lr));
      p.u32(PMIX_NODEID, static_cast<uint32_t>(node));
      p.str(PMIX_HOSTNAME, info.hosts[node]);
      p.u32(PMIX_REINCARNATION, 0);
      if (static_cast<int>(node) == info.this_node) {
        p.str(PMIX_PROCDIR, nsdir + "/" + std::to_string(ranks[lr]));
        auto bound = info.bound_cpus.find(ranks[lr]);
        if (bound != info.bound_cpus.end() && !bound->second.empty() && topo) {
          Bitmap set(hwloc_bitmap_alloc(), &hwloc_bitmap_free);
          for (int c : bound->second) hwloc_bitmap_set(set.get(), static_cast<unsigned>(c));
          p.str(PMIX_CPUSET, list_of(set.get()));
          p.str(PMIX_LOCALITY_STRING, locality_string(topo, set.get()));
        }
      }
      pmix_data_array_t arr;
      p.convert(&arr);
      il.add(PMIX_PROC_DATA, &arr, PMIX_DATA_ARRAY);
      PMIX_DATA_ARRAY_DESTRUCT(&arr);
    }
  }
}

// Registers every local client, then waits for all of them (one PMIx round trip at a time
// would add up over many ranks).
void register_clients(const NamespaceInfo& info, const std::vector<int>& local) {
  std::vector<OpWait*> waits;
  pmix_status_t failed = PMIX_SUCCESS;
  int failed_rank = -1;
  for (int r : local) {
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, info.nspace.c_str(), static_cast<pmix_rank_t>(r));
    auto* w = new OpWait;
    pmix_status_t st =
        PMIx_server_register_client(&proc, ::getuid(), ::getgid(), nullptr, OpWait::cb, w);
    if (st == PMIX_OPERATION_SUCCEEDED) OpWait::cb(PMIX_SUCCESS, w);
    if (st != PMIX_SUCCESS && st != PMIX_OPERATION_SUCCEEDED) {
      w->release();
      failed = st;
      failed_rank = r;
      break;
    }
    waits.push_back(w);
  }
  for (size_t i = 0; i < waits.size(); ++i)
    waits[i]->wait_and_release("PMIx_server_register_client " + info.nspace + ":" +
                               std::to_string(local[i]));
  check(failed, "PMIx_server_register_client " + info.nspace + ":" + std::to_string(failed_rank));
}

// Deregisters every local client of a namespace some client connected to, then waits for all:
// PMIx runs the cleanup each connected one asked for (PMIX_REGISTER_CLEANUP) at once, also for a
// rank whose lost connection it has not seen yet (one killed at the end of the job: where the
// process ends without PMIx_server_finalize, nothing else would run it).  False when PMIx did not
// answer.
bool deregister_clients(const std::string& nspace, const std::vector<int>& local) {
  std::vector<OpWait*> waits;
  for (int r : local) {
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, nspace.c_str(), static_cast<pmix_rank_t>(r));
    auto* w = new OpWait;
    PMIx_server_deregister_client(&proc, OpWait::cb, w);
    waits.push_back(w);
  }
  for (size_t i = 0; i < waits.size(); ++i) {
    try {
      waits[i]->wait_and_release("PMIx_server_deregister_client " + nspace + ":" +
                                 std::to_string(local[i]));
    } catch (const TimeoutError& e) {
      logger("pmix")->warn("{}", e.what());
      return false;  // (the rest are left to PMIx, which is stuck)
    } catch (const Error& e) {
      logger("pmix")->warn("{}", e.what());
    }
  }
  return true;
}

}  // namespace

void PmixServer::register_namespace(const NamespaceInfo& info) {
  static const std::vector<int> none;
  const auto& local =
      info.this_node < 0 ? none : info.node_ranks.at(static_cast<size_t>(info.this_node));
  std::string nsdir = impl_->tmpdir + "/" + info.nspace;
  ::mkdir(nsdir.c_str(), 0700);
  InfoList il;
  add_job_info(il, info, impl_->tmpdir, nsdir, impl_->topo_xml);
  add_proc_info(il, info, nsdir, impl_->topo);
  pmix_data_array_t all;
  il.convert(&all);
  auto* w = new OpWait;
  pmix_status_t st =
      PMIx_server_register_nspace(info.nspace.c_str(), static_cast<int>(local.size()),
                                  static_cast<pmix_info_t*>(all.array), all.size, OpWait::cb, w);
  if (st == PMIX_OPERATION_SUCCEEDED) OpWait::cb(PMIX_SUCCESS, w);
  if (st != PMIX_SUCCESS && st != PMIX_OPERATION_SUCCEEDED) {
    w->release();
    PMIX_DATA_ARRAY_DESTRUCT(&all);
    check(st, "PMIx_server_register_nspace " + info.nspace);
  }
  // PMIx keeps using `all` until it calls back: free it only after a completed wait.
  w->wait_and_release("PMIx_server_register_nspace " + info.nspace);
  PMIX_DATA_ARRAY_DESTRUCT(&all);
  register_clients(info, local);
  impl_->local_ranks[info.nspace] = local;
  logger("pmix")->info("namespace {} registered: {} ranks, {} here", info.nspace, info.world_size,
                       local.size());
}

void PmixServer::dmodex_request(const std::string& nspace, int rank, ModexDone done) {
  struct Request {
    EventLoop* loop;
    ModexDone done;
  };
  auto* req = new Request{&impl_->loop, std::move(done)};
  pmix_proc_t proc;
  PMIX_LOAD_PROCID(&proc, nspace.c_str(), static_cast<pmix_rank_t>(rank));
  auto cb = [](pmix_status_t st, char* data, size_t sz, void* cbdata) {
    auto* r = static_cast<Request*>(cbdata);
    std::string copy(data ? data : "", data ? sz : 0);
    r->loop->post([r, st, copy]() mutable {
      r->done(st, std::move(copy));
      delete r;
    });
  };
  pmix_status_t st = PMIx_server_dmodex_request(&proc, cb, req);
  if (st != PMIX_SUCCESS) {
    auto d = std::move(req->done);
    delete req;
    d(st, "");
  }
}

bool PmixServer::deregister_namespace(const std::string& nspace) {
  bool answered = true;
  auto local = impl_->local_ranks.find(nspace);
  if (local != impl_->local_ranks.end()) {
    if (had_clients(nspace)) answered = deregister_clients(nspace, local->second);
    impl_->local_ranks.erase(local);
  }
  if (answered) {
    auto* w = new OpWait;
    PMIx_server_deregister_nspace(nspace.c_str(), OpWait::cb, w);
    try {
      w->wait_and_release("PMIx_server_deregister_nspace " + nspace);
    } catch (const TimeoutError& e) {
      logger("pmix")->warn("{}", e.what());
      answered = false;
    } catch (const Error& e) {
      logger("pmix")->warn("{}", e.what());
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(impl_->tmpdir + "/" + nspace, ec);
  {
    std::lock_guard<std::mutex> lock(g_clients_mu);
    g_clients.erase(nspace);
  }
  return answered;
}

bool PmixServer::had_clients(const std::string& nspace) const {
  std::lock_guard<std::mutex> lock(g_clients_mu);
  return g_clients.count(nspace) > 0;
}

void PmixServer::notify_proc_failure(const std::string& nspace, int rank, int exit_code,
                                     bool aborted) {
  pmix_proc_t failed;
  PMIX_LOAD_PROCID(&failed, nspace.c_str(), static_cast<pmix_rank_t>(rank));
  // PMIx uses the array until it calls back.
  pmix_info_t* info;
  PMIX_INFO_CREATE(info, 3);
  PMIX_INFO_LOAD(&info[0], PMIX_EVENT_AFFECTED_PROC, &failed, PMIX_PROC);
  PMIX_INFO_LOAD(&info[1], PMIX_EXIT_CODE, &exit_code, PMIX_INT);
  pmix_data_range_t range = PMIX_RANGE_LOCAL;
  PMIX_INFO_LOAD(&info[2], PMIX_RANGE, &range, PMIX_DATA_RANGE);
  auto done = [](pmix_status_t, void* p) {
    pmix_info_t* i = static_cast<pmix_info_t*>(p);
    PMIX_INFO_FREE(i, 3);
  };
  pmix_status_t code = aborted ? PMIX_ERR_PROC_ABORTED : PMIX_EVENT_PROC_TERMINATED;
  pmix_status_t st = PMIx_Notify_event(code, &failed, PMIX_RANGE_LOCAL, info, 3, done, info);
  if (st != PMIX_SUCCESS) {
    PMIX_INFO_FREE(info, 3);
    if (st != PMIX_OPERATION_SUCCEEDED) check(st, "PMIx_Notify_event");
  }
  logger("pmix")->info("event {} for {}:{} (exit code {}) to the local clients",
                       PMIx_Error_string(code), nspace, rank, exit_code);
}

const std::string& PmixServer::tmpdir() const { return impl_->tmpdir; }

const std::string& PmixServer::shm_dir() const { return impl_->shm_dir; }

std::vector<std::string> PmixServer::setup_fork(const std::string& nspace, int rank) {
  pmix_proc_t proc;
  PMIX_LOAD_PROCID(&proc, nspace.c_str(), static_cast<pmix_rank_t>(rank));
  char** env = nullptr;
  check(PMIx_server_setup_fork(&proc, &env), "PMIx_server_setup_fork");
  std::vector<std::string> out;
  for (char** e = env; e && *e; ++e) {
    out.emplace_back(*e);
    ::free(*e);
  }
  ::free(env);
  return out;
}

}  // namespace pe::pmix
