// The PMIx server host of a node agent: one PMIx namespace per job generation, registered with
// the job-, node- and process-level information MPI libraries read; clients registered and
// their environment made by PMIx_server_setup_fork; upcalls (fence, direct modex, abort,
// connect/finalize, spawn, connect/disconnect, publish/lookup, job control) handed to the event
// loop and answered from there.  Cleanup requests of clients (PMIx_Job_control with
// PMIX_REGISTER_CLEANUP...) are carried out by PMIx when a client's connection ends and when a
// namespace is deregistered.
//
// Threading: construct, register and call setup_fork on the event-loop thread.  PMIx calls the
// upcalls on its own progress thread; they only copy their arguments and post() to the loop,
// where the listener and the ModexRouter are called.  The PMIx library is process-global, so
// there is at most one PmixServer per process.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/event_loop.hpp"
#include "pmix_rdzv/modex_router.hpp"

struct hwloc_topology;  // hwloc.h: hwloc_topology_t

namespace pe::pmix {

class PmixError : public pe::Error {
 public:
  PmixError(const std::string& what, int status);
  int status() const { return status_; }

 private:
  int status_;
};

// Throws PmixError("<what>: <PMIx_Error_string>") unless status is PMIX_SUCCESS (or
// PMIX_OPERATION_SUCCEEDED).
void check(int status, const std::string& what);

// What the PMIx namespace of one generation says about the job.
struct NamespaceInfo {
  std::string nspace;
  int world_size = 0;
  std::vector<std::string> hosts;            // per node
  std::vector<std::vector<int>> node_ranks;  // per node: its global ranks, in local-rank order
  int this_node = 0;                         // index into hosts
  bool oversubscribed = false;               // more local ranks than processors
  int universe_size = 0;                     // 0: world_size
  // A spawned job (PMIx_Spawn, MPI_Comm_spawn): the process that asked for it ("" : not
  // spawned), and each rank's application number (empty: one application).
  std::string parent_nspace;
  int parent_rank = 0;
  std::vector<int> appnum;
  // This node's ranks that are bound (--bind-to): their OS processors, for PMIX_CPUSET and
  // PMIX_LOCALITY_STRING (from which Open MPI learns which peers share a socket, a cache...).
  std::map<int, std::vector<int>> bound_cpus;
};

// One application of a PMIx_Spawn request (MPI_Comm_spawn_multiple has several).
struct SpawnApp {
  std::string cmd;
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // NAME=VALUE for the new processes
  std::string cwd;                // "" : the job's
  int maxprocs = 1;
  std::vector<std::string> hosts;  // the "host" and "add-host" info keys, in order
  std::string hostfile;            // "hostfile" (or "add-hostfile")
};

struct SpawnRequest {
  std::string parent_nspace;
  int parent_rank = 0;
  std::vector<SpawnApp> apps;
};

// `error` is "" when the processes were started in namespace `nspace`.
using SpawnDone = std::function<void(const std::string& error, const std::string& nspace)>;

class ServerListener {
 public:
  virtual ~ServerListener() = default;
  virtual void on_client_connected(const std::string& nspace, int rank) = 0;
  virtual void on_client_finalized(const std::string& nspace, int rank) = 0;
  // PMIx_Abort (MPI_Abort) from a client.
  virtual void on_abort(const std::string& nspace, int rank, int status,
                        const std::string& msg) = 0;
  // PMIx_Spawn (MPI_Comm_spawn) from a client; done() exactly once, on the loop thread.
  virtual void on_spawn(SpawnRequest, SpawnDone done) { done("not supported here", ""); }
};

class PmixServer {
 public:
  // PMIx_server_init with a private temporary directory.  `topology` (borrowed, may be null:
  // then the server loads one) is handed to PMIx and to Open MPI's ranks.  Throws PmixError.
  PmixServer(EventLoop& loop, ServerListener& listener, ModexRouter& router,
             const std::string& server_nspace, struct hwloc_topology* topology = nullptr);
  // PMIx_server_finalize (5 s at most; not where the process ends with the server,
  // end_with_process), then the directories are removed.
  ~PmixServer();
  PmixServer(const PmixServer&) = delete;
  PmixServer& operator=(const PmixServer&) = delete;

  // Registers the namespace and every local client of a generation (waits for PMIx, 10 s at
  // most).  Throws PmixError or TimeoutError.
  void register_namespace(const NamespaceInfo& info);
  // Its local clients first, when one connected: PMIx runs their cleanup requests then, also
  // for one whose death it has not noticed yet.  False when PMIx did not answer (10 s): it is
  // stuck.
  bool deregister_namespace(const std::string& nspace);
  // Whether a client of the namespace has connected (a namespace no client joined has no
  // cleanup requests).
  bool had_clients(const std::string& nspace) const;
  // PMIx_server_setup_fork for one local client: the variables to add to its environment.
  std::vector<std::string> setup_fork(const std::string& nspace, int rank);
  // Another node asks for what local client `rank` of `nspace` committed
  // (PMIx_server_dmodex_request); done() runs on the loop thread.
  void dmodex_request(const std::string& nspace, int rank, ModexDone done);
  // Tells the local clients of `nspace` that registered for it that its rank `rank` failed:
  // PMIX_ERR_PROC_ABORTED (MPI_Abort, a signal) or PMIX_EVENT_PROC_TERMINATED (a non-zero exit),
  // the failed process as the source and PMIX_EVENT_AFFECTED_PROC, PMIX_EXIT_CODE.  Returns at
  // once (PMIx delivers on its own thread).  Throws PmixError if PMIx refuses.
  void notify_proc_failure(const std::string& nspace, int rank, int exit_code, bool aborted);
  // The server's private temporary directory (removed when the server goes).
  const std::string& tmpdir() const;
  // Its private directory in /dev/shm for the ranks' shared memory (removed when the server
  // goes); "" when /dev/shm cannot be used.
  const std::string& shm_dir() const;

  // The process ends (with _exit) once its server is destroyed: from now on, the destructor
  // leaves PMIx running rather than finalize it (a millisecond and more of every launch), since
  // nothing it would clean up outlives the process but the files in tmpdir(), which the
  // destructor removes.  The caller must then end the process with _exit, with no static
  // destructors run beside PMIx's threads; it cannot start another server.
  static void end_with_process();
  static bool ends_with_process();

  // Used by the C upcalls (file-local in pmix_server.cpp).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pe::pmix
