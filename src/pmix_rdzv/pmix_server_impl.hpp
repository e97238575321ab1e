// Internals of the PMIx server host shared by its source files (pmix_server.cpp: set-up,
// namespaces, fences, events; pmix_dpm.cpp: dynamic processes -- spawn, connect/disconnect,
// publish/lookup).  Not installed, not included elsewhere.
#pragma once

#include <hwloc.h>
#include <pmix.h>
#include <pmix_server.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/log.hpp"
#include "pmix_rdzv/pmix_server.hpp"

namespace pe::pmix {

extern PmixServer::Impl* g_impl;  // PMIx is process-global; so are its upcalls
// What an upcall (on PMIx's thread) hands to the host's loop; false once the server is gone
// (PMIx may still call at the process's end, PmixServer::end_with_process): the upcall then
// answers PMIX_ERR_NOT_AVAILABLE.
bool post_upcall(std::function<void()> fn);
// A client of `nspace` connected (PmixServer::had_clients), from PMIx's thread.
void note_client(const std::string& nspace);

// PMIx's process list as the router's (a wildcard rank as -1).
std::vector<ProcId> proc_ids(const pmix_proc_t procs[], size_t nprocs);

inline constexpr auto kRegisterTimeout = std::chrono::seconds(10);

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

struct PmixServer::Impl {
  EventLoop& loop;
  ServerListener& listener;
  ModexRouter& router;
  std::string tmpdir;
  std::string shm_dir;  // in /dev/shm; "" when there is none
  // Each registered namespace's ranks on this node (for their deregistration); main thread.
  std::map<std::string, std::vector<int>> local_ranks;
  // Removes the directories of servers that died with their orphan guard (stale_dirs.hpp), off
  // the start-up path (milliseconds where many are left); joined when this goes, also when the
  // server's constructor throws.
  std::thread sweep;
  // The machine's topology without I/O objects, handed to PMIx so that it does not run a
  // discovery of its own (with PCI probing, tens of milliseconds on some machines).
  hwloc_topology_t topo = nullptr;
  bool own_topo = false;
  pmix_topology_t pmix_topo{};
  std::string topo_xml;  // the same, exported for Open MPI's ranks (PMIX_LOCAL_TOPO)

  Impl(EventLoop& l, ServerListener& s, ModexRouter& r);
  ~Impl();

  static std::string ns(const pmix_proc_t* p) { return std::string(p->nspace); }
  static int rank(const pmix_proc_t* p) { return static_cast<int>(p->rank); }

  // --- upcalls, on PMIx's thread ---
  static pmix_status_t client_connected(const pmix_proc_t* p, void*, pmix_op_cbfunc_t, void*) {
    auto n = ns(p);
    int r = rank(p);
    note_client(n);
    if (!post_upcall([n, r] {
          if (g_impl) g_impl->listener.on_client_connected(n, r);
        }))
      return PMIX_ERR_NOT_AVAILABLE;
    return PMIX_OPERATION_SUCCEEDED;
  }
  static pmix_status_t client_finalized(const pmix_proc_t* p, void*, pmix_op_cbfunc_t, void*) {
    auto n = ns(p);
    int r = rank(p);
    if (!post_upcall([n, r] {
          if (g_impl) g_impl->listener.on_client_finalized(n, r);
        }))
      return PMIX_ERR_NOT_AVAILABLE;
    return PMIX_OPERATION_SUCCEEDED;
  }
  static pmix_status_t abort(const pmix_proc_t* p, void*, int status, const char msg[],
                             pmix_proc_t[], size_t, pmix_op_cbfunc_t cbfunc, void* cbdata) {
    auto n = ns(p);
    int r = rank(p);
    std::string m = msg ? msg : "";
    if (!post_upcall([n, r, status, m, cbfunc, cbdata] {
          if (g_impl) g_impl->listener.on_abort(n, r, status, m);
          if (cbfunc) cbfunc(PMIX_SUCCESS, cbdata);
        }))
      return PMIX_ERR_NOT_AVAILABLE;
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
    std::string n = participants_key(proc_ids(procs, nprocs));
    std::string blob(data ? data : "", data ? ndata : 0);
    if (!post_upcall([n, collect, blob, cbfunc, cbdata]() mutable {
          logger("pmix")->info("upcall fence_nb {} ({} bytes, collect={})", n, blob.size(),
                               collect);
          g_impl->router.fence(n, collect, std::move(blob),
                               [cbfunc, cbdata](int st, std::string all) {
                                 answer_modex(cbfunc, cbdata, st, std::move(all));
                               });
        }))
      return PMIX_ERR_NOT_AVAILABLE;
    return PMIX_SUCCESS;
  }
  static pmix_status_t direct_modex(const pmix_proc_t* p, const pmix_info_t[], size_t,
                                    pmix_modex_cbfunc_t cbfunc, void* cbdata) {
    auto n = ns(p);
    int r = rank(p);
    if (!post_upcall([n, r, cbfunc, cbdata] {
          logger("pmix")->info("upcall direct_modex {}:{}", n, r);
          g_impl->router.direct_modex(n, r, [cbfunc, cbdata](int st, std::string d) {
            answer_modex(cbfunc, cbdata, st, std::move(d));
          });
        }))
      return PMIX_ERR_NOT_AVAILABLE;
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
    if (!post_upcall([n, r, keys] {
          logger("pmix")->info("upcall job_control from {}:{} ({}): not supported", n, r, keys);
        }))
      return PMIX_ERR_NOT_AVAILABLE;
    return PMIX_ERR_NOT_SUPPORTED;
  }
  // pmix_dpm.cpp: dynamic processes.
  static pmix_status_t publish(const pmix_proc_t* p, const pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t cbfunc, void* cbdata);
  static pmix_status_t lookup(const pmix_proc_t* p, char** keys, const pmix_info_t info[],
                              size_t ninfo, pmix_lookup_cbfunc_t cbfunc, void* cbdata);
  static pmix_status_t unpublish(const pmix_proc_t* p, char** keys, const pmix_info_t info[],
                                 size_t ninfo, pmix_op_cbfunc_t cbfunc, void* cbdata);
  static pmix_status_t spawn(const pmix_proc_t* p, const pmix_info_t job_info[], size_t ninfo,
                             const pmix_app_t apps[], size_t napps, pmix_spawn_cbfunc_t cbfunc,
                             void* cbdata);
  static pmix_status_t connect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                               size_t ninfo, pmix_op_cbfunc_t cbfunc, void* cbdata);
  static pmix_status_t disconnect(const pmix_proc_t procs[], size_t nprocs,
                                  const pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc,
                                  void* cbdata);
  // Lookups that wait (PMIX_WAIT) for a key to be published, retried until their deadline.
  struct PendingLookup;
  std::map<uint64_t, std::unique_ptr<PendingLookup>> lookups;
  uint64_t next_lookup = 1;
  void try_lookup(uint64_t id);
};

}  // namespace pe::pmix
