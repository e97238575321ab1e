// One NCCL communicator, created non-blocking so that every wait is bounded: creation and each
// synchronous wait poll ncclCommGetAsyncError against a Deadline, and an error or a timeout
// aborts the communicator (ncclCommAbort) and throws dc::Error / dc::TimeoutError naming the call.
// After an abort the communicator is unusable (every call throws).  A communicator may also be
// split from another (ncclCommSplit: the levels inside a node), and the waits of a call that uses
// several (NcclComms) watch them all and abort them all.  Threads: the one that uses it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <string>
#include <vector>

#include "dc/transport.hpp"
#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc::gpu {

class NcclComm {
 public:
  // ncclCommInitRankConfig on the current device; `id` comes from rank 0's ncclGetUniqueId.
  NcclComm(int rank, int size, const ncclUniqueId& id, const Deadline& d);
  // ncclCommSplit of `parent` (collective over it: every rank of `parent` makes the same splits
  // in the same order), non-blocking like the others; the ranks of `color`, ordered by `key`.
  // Throws (after aborting it) unless the new communicator has `size` ranks and this one is
  // `rank`.
  NcclComm(NcclComm& parent, int color, int key, int rank, int size, const Deadline& d);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Enqueues an in-place allreduce on `stream` (stream-ordered: returns once it is enqueued).
  // Throws if an earlier operation failed.
  void allreduce(void* buf, size_t count, DType t, Op op, cudaStream_t stream, const Deadline& d);
  // Enqueues `f` (NCCL calls, one call or a ncclGroupStart/End group, named `call`) on this
  // communicator; stream-ordered, returns once enqueued.  Throws if an earlier operation failed.
  void enqueue(const char* call, const std::function<ncclResult_t(ncclComm_t)>& f,
               const Deadline& d);
  // The other collectives of the API (count: this rank's block, as ProcessGroup's), enqueued.
  void reduce_scatter(const void* in, void* out, size_t count, DType t, Op op,
                      cudaStream_t stream, const Deadline& d);
  void allgather(const void* in, void* out, size_t count, DType t, cudaStream_t stream,
                 const Deadline& d);
  void broadcast(void* buf, size_t count, DType t, int root, cudaStream_t stream,
                 const Deadline& d);
  // Throws (after aborting) when NCCL reports an asynchronous error; for waits elsewhere (the
  // copy engine's) that must notice a failed peer.
  void check_async(const char* during);
  // Waits until `stream` has done its work, or until an error or the deadline: then aborts.
  void wait(cudaStream_t stream, const Deadline& d);
  // Throws, naming the error that aborted it, once it was aborted.
  void require_live() const;
  // ncclCommAbort, once; `why` is kept for later calls' errors.
  void abort(const std::string& why);
  bool aborted() const { return comm_ == nullptr; }
  int device() const { return device_; }

 private:
  // Polls until NCCL is no longer ncclInProgress for this communicator.
  void settle(const Deadline& d, const char* during);

  ncclComm_t comm_ = nullptr;
  int device_ = -1;
  int size_ = 0;
  std::string aborted_why_;
};

// The communicators one call uses (the levels of a node), for waits that must notice an error on
// any of them; an error or a timeout aborts them all, so that none is left half in use.
using NcclComms = std::vector<NcclComm*>;
// Throws when any is aborted (naming why) or reports an asynchronous error.
void check_async(const NcclComms& cs, const char* during);
void abort(const NcclComms& cs, const std::string& why);
// NcclComm::wait over all of them.
void wait(cudaStream_t stream, const NcclComms& cs, const Deadline& d);
// The same for the work before `event` (recorded) completes.
void wait(cudaEvent_t event, const NcclComms& cs, const Deadline& d);
// Whether the work before `event` is done, without waiting; an error throws as in wait().
bool done(cudaEvent_t event, const NcclComms& cs);

}  // namespace pytorch_exec::dc::gpu
