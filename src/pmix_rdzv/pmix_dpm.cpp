// The PMIx server's upcalls for dynamic processes: PMIx_Spawn (MPI_Comm_spawn and
// MPI_Comm_spawn_multiple), PMIx_Connect / PMIx_Disconnect across namespaces (the spawned
// intercommunicator) and PMIx_Publish / PMIx_Lookup (Open MPI's connect/accept exchanges its
// participants through them).  Each copies its arguments on PMIx's thread and continues on the
// event loop (see pmix_server.hpp).
#include <cstdlib>
#include <cstring>

#include "common/strings.hpp"
#include "pmix_rdzv/pmix_server_impl.hpp"

namespace pe::pmix {
namespace {

// A lookup that waits gives up after the caller's PMIX_TIMEOUT, else after this long.
constexpr int kDefaultLookupWait = 60;
// How often a waiting lookup looks again.
constexpr double kLookupRetry = 0.02;
// After this long, a connect still waiting for its port's acceptor is told to the user: the
// port may be another job's, which no process of this one will ever accept on (Open MPI asks
// to wait 600 s).
constexpr int kConnectNotice = 10;  // seconds

std::string str_value(const pmix_info_t& i) {
  return i.value.type == PMIX_STRING && i.value.data.string ? i.value.data.string : "";
}

// The spawn keys of one app (or of the whole request, for every app).
void read_spawn_info(const pmix_info_t info[], size_t ninfo, SpawnApp& app) {
  for (size_t i = 0; i < ninfo; ++i) {
    std::string v = str_value(info[i]);
    if (PMIX_CHECK_KEY(&info[i], PMIX_HOST) || PMIX_CHECK_KEY(&info[i], PMIX_ADD_HOST)) {
      for (auto& h : split(v, ','))
        if (!h.empty()) app.hosts.push_back(h);
    } else if (PMIX_CHECK_KEY(&info[i], PMIX_HOSTFILE) ||
               PMIX_CHECK_KEY(&info[i], PMIX_ADD_HOSTFILE)) {
      app.hostfile = v;
    } else if (PMIX_CHECK_KEY(&info[i], PMIX_WDIR) && !v.empty()) {
      app.cwd = v;
    }
  }
}

// Connect and disconnect: complete when every participant, on every node, has called it (a
// fence over their union without data).
pmix_status_t collective(const char* op, const pmix_proc_t procs[], size_t nprocs,
                         pmix_op_cbfunc_t cbfunc, void* cbdata) {
  std::string key = participants_key(proc_ids(procs, nprocs), op);
  if (!post_upcall([key, cbfunc, cbdata] {
        logger("pmix")->info("upcall {}", key);
        g_impl->router.fence(key, false, "", [cbfunc, cbdata](int st, std::string) {
          if (cbfunc) cbfunc(st, cbdata);
        });
      }))
    return PMIX_ERR_NOT_AVAILABLE;
  return PMIX_SUCCESS;
}

}  // namespace

// A published value as bytes (PMIx's own packing of a pmix_value_t), so that values of any type
// can be kept and carried between nodes.
std::string pack_value(const pmix_value_t& v) {
  pmix_data_buffer_t buf;
  PMIX_DATA_BUFFER_CONSTRUCT(&buf);
  std::string out;
  if (PMIx_Data_pack(nullptr, &buf, const_cast<pmix_value_t*>(&v), 1, PMIX_VALUE) == PMIX_SUCCESS) {
    pmix_byte_object_t bo;
    PMIx_Data_unload(&buf, &bo);
    out.assign(bo.bytes ? bo.bytes : "", bo.size);
    PMIX_BYTE_OBJECT_DESTRUCT(&bo);
  }
  PMIX_DATA_BUFFER_DESTRUCT(&buf);
  return out;
}

// Back into `out` (a value PMIx owns afterwards).  False for bytes that do not unpack.
bool unpack_value(const std::string& bytes, pmix_value_t* out) {
  pmix_data_buffer_t buf;
  PMIX_DATA_BUFFER_CONSTRUCT(&buf);
  pmix_byte_object_t bo;
  bo.bytes = static_cast<char*>(::malloc(bytes.size()));
  if (!bo.bytes) return false;
  std::memcpy(bo.bytes, bytes.data(), bytes.size());
  bo.size = bytes.size();
  PMIx_Data_load(&buf, &bo);  // the buffer takes the bytes
  int32_t n = 1;
  pmix_status_t st = PMIx_Data_unpack(nullptr, &buf, out, &n, PMIX_VALUE);
  PMIX_DATA_BUFFER_DESTRUCT(&buf);
  return st == PMIX_SUCCESS;
}

std::vector<ProcId> proc_ids(const pmix_proc_t procs[], size_t nprocs) {
  std::vector<ProcId> out;
  for (size_t i = 0; i < nprocs; ++i)
    out.push_back(ProcId{std::string(procs[i].nspace), procs[i].rank == PMIX_RANK_WILDCARD
                                                           ? -1
                                                           : static_cast<int>(procs[i].rank)});
  return out;
}

struct PmixServer::Impl::PendingLookup {
  std::vector<std::string> keys;
  bool wait = false;
  std::chrono::steady_clock::time_point deadline;
  pmix_lookup_cbfunc_t cbfunc;
  void* cbdata;
  Event retry;
  std::string caller;                            // "NSPACE:RANK"
  std::chrono::steady_clock::time_point notice;  // when a connect's wait is told (kConnectNotice)
};

PmixServer::Impl::Impl(EventLoop& l, ServerListener& s, ModexRouter& r)
    : loop(l), listener(s), router(r) {}

// Lookups still waiting are dropped unanswered: PMIx is finalized (or left to the process's end)
// by now, their clients gone.
PmixServer::Impl::~Impl() {
  if (sweep.joinable()) sweep.join();
}

pmix_status_t PmixServer::Impl::publish(const pmix_proc_t* p, const pmix_info_t info[],
                                        size_t ninfo, pmix_op_cbfunc_t, void*) {
  Published kv;
  // The data, not the directives PMIx adds (pmix.persist, pmix.euid, pmix.range, ...).
  for (size_t i = 0; i < ninfo; ++i)
    if (std::strncmp(info[i].key, "pmix.", 5) != 0) kv[info[i].key] = pack_value(info[i].value);
  auto n = ns(p);
  int r = rank(p);
  if (!post_upcall([kv, n, r]() mutable {
        std::vector<std::string> keys;
        for (const auto& [k, v] : kv) keys.push_back(k);
        logger("pmix")->info("upcall publish from {}:{}: {}", n, r, join(keys, ","));
        g_impl->router.publish(std::move(kv));
      }))
    return PMIX_ERR_NOT_AVAILABLE;
  return PMIX_OPERATION_SUCCEEDED;
}

pmix_status_t PmixServer::Impl::unpublish(const pmix_proc_t*, char** keys, const pmix_info_t[],
                                          size_t, pmix_op_cbfunc_t, void*) {
  std::vector<std::string> k;
  for (char** x = keys; x && *x; ++x) k.emplace_back(*x);
  if (!post_upcall([k]() mutable { g_impl->router.unpublish(std::move(k)); }))
    return PMIX_ERR_NOT_AVAILABLE;
  return PMIX_OPERATION_SUCCEEDED;
}

pmix_status_t PmixServer::Impl::lookup(const pmix_proc_t* proc, char** keys,
                                       const pmix_info_t info[], size_t ninfo,
                                       pmix_lookup_cbfunc_t cbfunc, void* cbdata) {
  auto p = std::make_unique<PendingLookup>();
  if (proc) p->caller = std::string(proc->nspace) + ":" + std::to_string(proc->rank);
  p->notice = std::chrono::steady_clock::now() + std::chrono::seconds(kConnectNotice);
  for (char** k = keys; k && *k; ++k) p->keys.emplace_back(*k);
  int timeout = kDefaultLookupWait;
  for (size_t i = 0; i < ninfo; ++i) {
    if (PMIX_CHECK_KEY(&info[i], PMIX_WAIT))
      p->wait = info[i].value.type == PMIX_BOOL ? PMIX_INFO_TRUE(&info[i])
                                                : info[i].value.type == PMIX_INT;
    if (PMIX_CHECK_KEY(&info[i], PMIX_TIMEOUT) && info[i].value.type == PMIX_INT &&
        info[i].value.data.integer > 0)
      timeout = info[i].value.data.integer;
  }
  p->deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout);
  p->cbfunc = cbfunc;
  p->cbdata = cbdata;
  if (!post_upcall([p = std::shared_ptr<PendingLookup>(std::move(p))]() mutable {
        logger("pmix")->info("upcall lookup {}{}", join(p->keys, ","), p->wait ? " (waiting)" : "");
        uint64_t id = g_impl->next_lookup++;
        auto& slot = g_impl->lookups[id];
        slot = std::make_unique<PendingLookup>(std::move(*p));
        slot->retry = g_impl->loop.timer([id] { g_impl->try_lookup(id); });
        g_impl->try_lookup(id);
      }))
    return PMIX_ERR_NOT_AVAILABLE;
  return PMIX_SUCCESS;
}

// Answers when every key is there, when the caller does not wait, or at the deadline.
void PmixServer::Impl::try_lookup(uint64_t id) {
  auto it = lookups.find(id);
  if (it == lookups.end()) return;
  router.lookup(it->second->keys, [this, id](Published found) {
    auto it = lookups.find(id);
    if (it == lookups.end()) return;
    PendingLookup& p = *it->second;
    bool all = found.size() == p.keys.size();
    auto now = std::chrono::steady_clock::now();
    if (!all && p.wait && now < p.deadline) {
      // Open MPI's MPI_Comm_connect looks up "PORT:accept" until the acceptor publishes it.
      const std::string suffix = ":accept";
      for (const auto& k : p.keys) {
        if (now < p.notice || k.size() <= suffix.size() ||
            k.compare(k.size() - suffix.size(), suffix.size(), suffix) != 0)
          continue;
        logger("pmix")->warn(
            "{} has waited {} s in MPI_Comm_connect for port {}: no process of this job has "
            "accepted on it yet (pytorch_exec connects the processes of one job and those it "
            "spawned; a port of another job is never reached); it gives up in {} s",
            p.caller.empty() ? "a process" : p.caller, kConnectNotice,
            k.substr(0, k.size() - suffix.size()),
            std::chrono::duration_cast<std::chrono::seconds>(p.deadline - now).count());
        p.notice = p.deadline;  // once
        break;
      }
      p.retry.arm(kLookupRetry);
      return;
    }
    logger("pmix")->info("lookup of {}: {} of {} found", join(p.keys, ","), found.size(),
                         p.keys.size());
    if (found.empty()) {
      p.cbfunc(PMIX_ERR_NOT_FOUND, nullptr, 0, p.cbdata);
    } else {
      pmix_pdata_t* pd;
      PMIX_PDATA_CREATE(pd, found.size());
      size_t i = 0;
      for (auto& [k, v] : found) {
        PMIX_LOAD_PROCID(&pd[i].proc, "", PMIX_RANK_UNDEF);
        PMIX_LOAD_KEY(pd[i].key, k.c_str());
        if (!unpack_value(v, &pd[i].value)) logger("pmix")->warn("lookup {}: a bad value", k);
        ++i;
      }
      p.cbfunc(PMIX_SUCCESS, pd, found.size(), p.cbdata);
      PMIX_PDATA_FREE(pd, found.size());
    }
    // Not inside the timer's own callback: the event goes on the next turn of the loop.
    auto gone = std::move(it->second);
    lookups.erase(it);
    loop.post([gone = std::shared_ptr<PendingLookup>(std::move(gone))] {});
  });
}

pmix_status_t PmixServer::Impl::spawn(const pmix_proc_t* p, const pmix_info_t job_info[],
                                      size_t ninfo, const pmix_app_t apps[], size_t napps,
                                      pmix_spawn_cbfunc_t cbfunc, void* cbdata) {
  SpawnRequest req;
  req.parent_nspace = ns(p);
  req.parent_rank = rank(p);
  for (size_t a = 0; a < napps; ++a) {
    SpawnApp app;
    app.cmd = apps[a].cmd ? apps[a].cmd : "";
    for (char** x = apps[a].argv; x && *x; ++x) app.argv.emplace_back(*x);
    if (app.argv.empty()) app.argv.push_back(app.cmd);
    for (char** x = apps[a].env; x && *x; ++x) app.env.emplace_back(*x);
    app.cwd = apps[a].cwd ? apps[a].cwd : "";
    app.maxprocs = apps[a].maxprocs;
    read_spawn_info(job_info, ninfo, app);
    read_spawn_info(apps[a].info, apps[a].ninfo, app);
    req.apps.push_back(std::move(app));
  }
  if (!post_upcall([req = std::move(req), cbfunc, cbdata]() mutable {
        logger("pmix")->info("upcall spawn from {}:{} ({} app(s))", req.parent_nspace,
                             req.parent_rank, req.apps.size());
        g_impl->listener.on_spawn(
            std::move(req), [cbfunc, cbdata](const std::string& error, const std::string& nspace) {
              pmix_nspace_t n;
              std::memset(n, 0, sizeof n);
              std::strncpy(n, nspace.c_str(), PMIX_MAX_NSLEN);
              if (!error.empty()) logger("pmix")->info("spawn failed: {}", error);
              cbfunc(error.empty() ? PMIX_SUCCESS : PMIX_ERR_OUT_OF_RESOURCE, n, cbdata);
            });
      }))
    return PMIX_ERR_NOT_AVAILABLE;
  return PMIX_SUCCESS;
}

pmix_status_t PmixServer::Impl::connect(const pmix_proc_t procs[], size_t nprocs,
                                        const pmix_info_t[], size_t, pmix_op_cbfunc_t cbfunc,
                                        void* cbdata) {
  return collective("connect", procs, nprocs, cbfunc, cbdata);
}

pmix_status_t PmixServer::Impl::disconnect(const pmix_proc_t procs[], size_t nprocs,
                                           const pmix_info_t[], size_t, pmix_op_cbfunc_t cbfunc,
                                           void* cbdata) {
  return collective("disconnect", procs, nprocs, cbfunc, cbdata);
}

}  // namespace pe::pmix
