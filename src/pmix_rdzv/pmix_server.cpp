#include "pmix_rdzv/pmix_server.hpp"

#include <hwloc.h>
#include <pmix.h>
#include <pmix_server.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "common/log.hpp"
#include "common/strings.hpp"

namespace pe::pmix {

PmixError::PmixError(const std::string& what, int status)
    : pe::Error(what + ": " + PMIx_Error_string(status)), status_(status) {}

void check(int status, const std::string& what) {
  if (status != PMIX_SUCCESS && status != PMIX_OPERATION_SUCCEEDED) throw PmixError(what, status);
}

namespace {

PmixServer::Impl* g_impl = nullptr;  // PMIx is process-global; so are its upcalls
constexpr auto kRegisterTimeout = std::chrono::seconds(10);

// Waits for a pmix_op_cbfunc_t, with a timeout.  Allocate with new and release with done():
// after a timeout PMIx may still call back, so the waiter is then left alive (a small leak on a
// path that ends the job) instead of being freed under the callback.
struct OpWait {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  pmix_status_t status = PMIX_SUCCESS;
  static void cb(pmix_status_t st, void* p) {
    auto* w = static_cast<OpWait*>(p);
    std::lock_guard<std::mutex> lock(w->m);
    w->status = st;
    w->done = true;
    w->cv.notify_all();
  }
  // Waits, then frees itself; throws TimeoutError (not freed) or PmixError (freed).
  void wait_and_release(const std::string& what) {
    pmix_status_t st;
    {
      std::unique_lock<std::mutex> lock(m);
      if (!cv.wait_for(lock, kRegisterTimeout, [this] { return done; }))
        throw TimeoutError(what + ": PMIx did not answer within 10 s");
      st = status;
    }
    delete this;
    check(st, what);
  }
  // PMIx refused to start the operation: its callback will not come.
  void release() { delete this; }
};

// pmix_info_t list built with PMIx's own list API.
class InfoList {
 public:
  InfoList() : list_(PMIx_Info_list_start()) {}
  ~InfoList() { PMIx_Info_list_release(list_); }
  InfoList(const InfoList&) = delete;
  InfoList& operator=(const InfoList&) = delete;
  void add(const char* key, const void* value, pmix_data_type_t type) {
    check(PMIx_Info_list_add(list_, key, value, type), std::string("PMIx_Info_list_add ") + key);
  }
  void str(const char* key, const std::string& v) { add(key, v.c_str(), PMIX_STRING); }
  void u32(const char* key, uint32_t v) { add(key, &v, PMIX_UINT32); }
  void u16(const char* key, uint16_t v) { add(key, &v, PMIX_UINT16); }
  void rank(const char* key, pmix_rank_t v) { add(key, &v, PMIX_PROC_RANK); }
  void flag(const char* key, bool v) { add(key, &v, PMIX_BOOL); }
  // Converts to a data array (owned by the caller: PMIX_DATA_ARRAY_DESTRUCT).
  void convert(pmix_data_array_t* out) {
    check(PMIx_Info_list_convert(list_, out), "PMIx_Info_list_convert");
  }

 private:
  void* list_;
};

}  // namespace

struct PmixServer::Impl {
  EventLoop& loop;
  ServerListener& listener;
  ModexRouter& router;
  std::string tmpdir;
  std::string shm_dir;  // in /dev/shm; "" when there is none
  // The machine's topology without I/O objects, handed to PMIx so that it does not run a
  // discovery of its own (with PCI probing, tens of milliseconds on some machines).
  hwloc_topology_t topo = nullptr;
  bool own_topo = false;
  pmix_topology_t pmix_topo{};
  std::string topo_xml;    // the same, exported for Open MPI's ranks (PMIX_LOCAL_TOPO)
  std::mutex store_mutex;  // guards store (publish/lookup run on PMIx's thread)
  std::map<std::string, std::string> store;  // key -> string value (published data)

  Impl(EventLoop& l, ServerListener& s, ModexRouter& r) : loop(l), listener(s), router(r) {}

  static std::string ns(const pmix_proc_t* p) { return std::string(p->nspace); }
  static int rank(const pmix_proc_t* p) { return static_cast<int>(p->rank); }

  // --- upcalls, on PMIx's thread ---
  static pmix_status_t client_connected(const pmix_proc_t* p, void*, pmix_op_cbfunc_t, void*) {
    auto n = ns(p);
    int r = rank(p);
    g_impl->loop.post([n, r] {
      if (g_impl) g_impl->listener.on_client_connected(n, r);
    });
    return PMIX_OPERATION_SUCCEEDED;
  }
  static pmix_status_t client_finalized(const pmix_proc_t* p, void*, pmix_op_cbfunc_t, void*) {
    auto n = ns(p);
    int r = rank(p);
    g_impl->loop.post([n, r] {
      if (g_impl) g_impl->listener.on_client_finalized(n, r);
    });
    return PMIX_OPERATION_SUCCEEDED;
  }
  static pmix_status_t abort(const pmix_proc_t* p, void*, int status, const char msg[],
                             pmix_proc_t[], size_t, pmix_op_cbfunc_t cbfunc, void* cbdata) {
    auto n = ns(p);
    int r = rank(p);
    std::string m = msg ? msg : "";
    g_impl->loop.post([n, r, status, m, cbfunc, cbdata] {
      if (g_impl) g_impl->listener.on_abort(n, r, status, m);
      if (cbfunc) cbfunc(PMIX_SUCCESS, cbdata);
    });
    return PMIX_SUCCESS;
  }
  static void release_data(void* p) { delete static_cast<std::string*>(p); }
  static void answer_modex(pmix_modex_cbfunc_t cbfunc, void* cbdata, int st, std::string data) {
    auto* keep = new std::string(std::move(data));
    cbfunc(st, keep->data(), keep->size(), cbdata, release_data, keep);
  }
  static pmix_status_t fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                                size_t ninfo, char* data, size_t ndata, pmix_modex_cbfunc_t cbfunc,
                                void* cbdata) {
    bool collect = false;
    for (size_t i = 0; i < ninfo; ++i)
      if (PMIX_CHECK_KEY(&info[i], PMIX_COLLECT_DATA)) collect = PMIX_INFO_TRUE(&info[i]);
    std::string n = nprocs ? ns(&procs[0]) : "";
    std::string blob(data ? data : "", data ? ndata : 0);
    g_impl->loop.post([n, collect, blob, cbfunc, cbdata]() mutable {
      logger("pmix")->info("upcall fence_nb {} ({} bytes, collect={})", n, blob.size(), collect);
      g_impl->router.fence(n, collect, std::move(blob), [cbfunc, cbdata](int st, std::string all) {
        answer_modex(cbfunc, cbdata, st, std::move(all));
      });
    });
    return PMIX_SUCCESS;
  }
  static pmix_status_t direct_modex(const pmix_proc_t* p, const pmix_info_t[], size_t,
                                    pmix_modex_cbfunc_t cbfunc, void* cbdata) {
    auto n = ns(p);
    int r = rank(p);
    g_impl->loop.post([n, r, cbfunc, cbdata] {
      logger("pmix")->info("upcall direct_modex {}:{}", n, r);
      g_impl->router.direct_modex(n, r, [cbfunc, cbdata](int st, std::string d) {
        answer_modex(cbfunc, cbdata, st, std::move(d));
      });
    });
    return PMIX_SUCCESS;
  }
  // publish/lookup/unpublish: string values, visible within this server (the job's node).
  static pmix_status_t publish(const pmix_proc_t*, const pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t, void*) {
    std::lock_guard<std::mutex> lock(g_impl->store_mutex);
    for (size_t i = 0; i < ninfo; ++i) {
      if (info[i].value.type != PMIX_STRING) continue;
      g_impl->store[info[i].key] = info[i].value.data.string ? info[i].value.data.string : "";
    }
    return PMIX_OPERATION_SUCCEEDED;
  }
  static pmix_status_t lookup(const pmix_proc_t*, char** keys, const pmix_info_t[], size_t,
                              pmix_lookup_cbfunc_t cbfunc, void* cbdata) {
    std::vector<std::pair<std::string, std::string>> found;
    {
      std::lock_guard<std::mutex> lock(g_impl->store_mutex);
      for (char** k = keys; k && *k; ++k) {
        auto it = g_impl->store.find(*k);
        if (it != g_impl->store.end()) found.push_back(*it);
      }
    }
    if (found.empty()) return PMIX_ERR_NOT_FOUND;
    pmix_pdata_t* pd;
    PMIX_PDATA_CREATE(pd, found.size());
    pmix_proc_t publisher;
    PMIX_LOAD_PROCID(&publisher, "", PMIX_RANK_UNDEF);
    for (size_t i = 0; i < found.size(); ++i)
      PMIX_PDATA_LOAD(&pd[i], &publisher, found[i].first.c_str(), found[i].second.c_str(),
                      PMIX_STRING);
    cbfunc(PMIX_SUCCESS, pd, found.size(), cbdata);
    PMIX_PDATA_FREE(pd, found.size());
    return PMIX_SUCCESS;
  }
  // Job control.  PMIx itself keeps the cleanup requests (PMIX_REGISTER_CLEANUP,
  // PMIX_REGISTER_CLEANUP_DIR with PMIX_CLEANUP_RECURSIVE, PMIX_CLEANUP_IGNORE,
  // PMIX_CLEANUP_LEAVE_TOPDIR: Open MPI's shared-memory segments and session directory) once a
  // host has this upcall, and carries them out when the client's connection ends (exit, abort,
  // a crash, a kill) and when the namespace is deregistered; without it PMIx refuses them.  It
  // calls here only with other directives (kill, signal, ...): not supported.
  static pmix_status_t job_control(const pmix_proc_t* p, const pmix_proc_t[], size_t,
                                   const pmix_info_t dirs[], size_t ndirs, pmix_info_cbfunc_t,
                                   void*) {
    std::string keys;
    for (size_t i = 0; i < ndirs; ++i) keys += std::string(keys.empty() ? "" : ",") + dirs[i].key;
    auto n = ns(p);
    int r = rank(p);
    g_impl->loop.post([n, r, keys] {
      logger("pmix")->info("upcall job_control from {}:{} ({}): not supported", n, r, keys);
    });
    return PMIX_ERR_NOT_SUPPORTED;
  }
  static pmix_status_t unpublish(const pmix_proc_t*, char** keys, const pmix_info_t[], size_t,
                                 pmix_op_cbfunc_t, void*) {
    std::lock_guard<std::mutex> lock(g_impl->store_mutex);
    for (char** k = keys; k && *k; ++k) g_impl->store.erase(*k);
    return PMIX_OPERATION_SUCCEEDED;
  }
};

namespace {

// A private directory in /dev/shm for the ranks' shared-memory files (Open MPI's vader
// segments), removed with the server or by the orphan guard; "" without a writable /dev/shm.
std::string make_shm_dir() {
  char templ[] = "/dev/shm/pytorch_exec.XXXXXX";
  if (!::mkdtemp(templ)) {
    logger("pmix")->debug("no private directory in /dev/shm: {}", std::strerror(errno));
    return "";
  }
  return templ;
}

}  // namespace

PmixServer::PmixServer(EventLoop& loop, ServerListener& listener, ModexRouter& router,
                       const std::string& server_nspace, hwloc_topology_t topology)
    : impl_(std::make_unique<Impl>(loop, listener, router)) {
  if (g_impl) throw Error("only one PMIx server per process");
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/pytorch_exec.XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw SystemError("mkdtemp " + templ, errno);
  impl_->tmpdir = buf.data();
  impl_->shm_dir = make_shm_dir();
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
  InfoList il;
  il.str(PMIX_SERVER_TMPDIR, impl_->tmpdir);
  il.str(PMIX_SYSTEM_TMPDIR, impl_->tmpdir);
  il.str(PMIX_SERVER_NSPACE, server_nspace);
  il.rank(PMIX_SERVER_RANK, 0);
  impl_->topo = topology;
  if (!impl_->topo) {
    impl_->own_topo = true;
    if (hwloc_topology_init(&impl_->topo) != 0 ||
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
  g_impl = impl_.get();
  pmix_status_t st = PMIx_server_init(&module, static_cast<pmix_info_t*>(arr.array), arr.size);
  PMIX_DATA_ARRAY_DESTRUCT(&arr);
  if (st != PMIX_SUCCESS) {
    g_impl = nullptr;
    if (impl_->own_topo) hwloc_topology_destroy(impl_->topo);
    std::filesystem::remove_all(impl_->tmpdir);
    if (!impl_->shm_dir.empty()) std::filesystem::remove_all(impl_->shm_dir);
    throw PmixError("PMIx_server_init", st);
  }
  logger("pmix")->debug("PMIx server up, tmpdir {}", impl_->tmpdir);
}

PmixServer::~PmixServer() {
  PMIx_server_finalize();
  g_impl = nullptr;
  if (impl_->own_topo) hwloc_topology_destroy(impl_->topo);
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
  const auto& local = info.node_ranks.at(static_cast<size_t>(info.this_node));
  il.str(PMIX_JOBID, info.nspace);
  il.u32(PMIX_UNIV_SIZE, static_cast<uint32_t>(info.world_size));
  il.u32(PMIX_JOB_SIZE, static_cast<uint32_t>(info.world_size));
  il.u32(PMIX_MAX_PROCS, static_cast<uint32_t>(info.world_size));
  il.u32(PMIX_NUM_NODES, static_cast<uint32_t>(info.hosts.size()));
  il.u32(PMIX_JOB_NUM_APPS, 1);
  il.add(PMIX_NODE_MAP, node_regex.get(), PMIX_REGEX);
  il.add(PMIX_PROC_MAP, proc_regex.get(), PMIX_REGEX);
  il.str(PMIX_TMPDIR, tmpdir);
  il.str(PMIX_NSDIR, nsdir);
  // Open MPI 4.1's ess/pmi loads this instead of discovering the machine in every rank.
  if (!topo_xml.empty()) il.str(PMIX_LOCAL_TOPO, topo_xml);
  // This node.
  il.str(PMIX_HOSTNAME, info.hosts.at(static_cast<size_t>(info.this_node)));
  il.u32(PMIX_NODEID, static_cast<uint32_t>(info.this_node));
  il.str(PMIX_LOCAL_PEERS, rank_list(local));
  il.u32(PMIX_LOCAL_SIZE, static_cast<uint32_t>(local.size()));
  il.u32(PMIX_NODE_SIZE, static_cast<uint32_t>(local.size()));
  il.rank(PMIX_LOCALLDR, local.empty() ? 0 : static_cast<pmix_rank_t>(local.front()));
  // As mpirun says it: more of the job's ranks on this node than it has processors.
  il.flag(PMIX_NODE_OVERSUBSCRIBED, info.oversubscribed);
  // The application (one per job).
  il.u32(PMIX_APPNUM, 0);
  il.rank(PMIX_APPLDR, 0);
  il.u32(PMIX_APP_SIZE, static_cast<uint32_t>(info.world_size));
}

// Every process of the job: where it runs.  No PMIX_LOCALITY_STRING: the ranks are not bound,
// and PMIx's rule is that an unbound process has no locality (Open MPI then treats local peers
// as sharing the node).  Binding (topology mapping) will add it.
void add_proc_info(InfoList& il, const NamespaceInfo& info, const std::string& nsdir) {
  for (size_t node = 0; node < info.node_ranks.size(); ++node) {
    const auto& ranks = info.node_ranks[node];
    for (size_t lr = 0; lr < ranks.size(); ++lr) {
      InfoList p;
      p.rank(PMIX_RANK, static_cast<pmix_rank_t>(ranks[lr]));
      p.u32(PMIX_APPNUM, 0);
      p.rank(PMIX_APP_RANK, static_cast<pmix_rank_t>(ranks[lr]));
      p.rank(PMIX_GLOBAL_RANK, static_cast<pmix_rank_t>(ranks[lr]));
      p.u16(PMIX_LOCAL_RANK, static_cast<uint16_t>(lr));
      p.u16(PMIX_NODE_RANK, static_cast<uint16_t>(lr));
      p.u32(PMIX_NODEID, static_cast<uint32_t>(node));
      p.str(PMIX_HOSTNAME, info.hosts[node]);
      p.u32(PMIX_REINCARNATION, 0);
      if (static_cast<int>(node) == info.this_node)
        p.str(PMIX_PROCDIR, nsdir + "/" + std::to_string(ranks[lr]));
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

}  // namespace

void PmixServer::register_namespace(const NamespaceInfo& info) {
  const auto& local = info.node_ranks.at(static_cast<size_t>(info.this_node));
  std::string nsdir = impl_->tmpdir + "/" + info.nspace;
  ::mkdir(nsdir.c_str(), 0700);
  InfoList il;
  add_job_info(il, info, impl_->tmpdir, nsdir, impl_->topo_xml);
  add_proc_info(il, info, nsdir);
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

void PmixServer::deregister_namespace(const std::string& nspace) {
  auto* w = new OpWait;
  PMIx_server_deregister_nspace(nspace.c_str(), OpWait::cb, w);
  try {
    w->wait_and_release("PMIx_server_deregister_nspace " + nspace);
  } catch (const Error& e) {
    logger("pmix")->warn("{}", e.what());
  }
  std::error_code ec;
  std::filesystem::remove_all(impl_->tmpdir + "/" + nspace, ec);
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
