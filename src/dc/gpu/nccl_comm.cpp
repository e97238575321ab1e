#include "dc/gpu/nccl_comm.hpp"

#include <thread>

#include "dc/gpu/status.hpp"

namespace pytorch_exec::dc::gpu {
namespace {

// NCCL's own abort pattern polls ncclCommGetAsyncError; this is the pause between two polls.
void pause() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

}  // namespace

NcclComm::NcclComm(int rank, int size, const ncclUniqueId& id, const Deadline& d) : size_(size) {
  check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId copy = id;
  // A constructor that throws has no destructor: a communicator that NCCL made before an error
  // (a nonblocking init may hand it out and fail later) is aborted here.
  try {
    check_nccl(ncclCommInitRankConfig(&comm_, size, copy, rank, &config),
               "ncclCommInitRankConfig");
    settle(d, "ncclCommInitRankConfig");
  } catch (const std::exception& e) {
    abort(e.what());
    throw;
  }
}

NcclComm::NcclComm(NcclComm& parent, int color, int key, int rank, int size, const Deadline& d)
    : device_(parent.device_), size_(size) {
  parent.require_live();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommSplit(parent.comm_, color, key, &comm_, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string what = nccl_error_text("ncclCommSplit", r);
    if (comm_) abort(what);
    parent.abort(what);  // the other ranks of the parent wait in their split
    throw Error(what);
  }
  if (!comm_) throw Error("ncclCommSplit: no communicator for color " + std::to_string(color));
  // A constructor that throws has no destructor: whatever fails from here aborts the new one.
  try {
    settle(d, "ncclCommSplit");
    parent.settle(d, "ncclCommSplit (the parent communicator)");
    int n = 0, me = -1;
    check_nccl(ncclCommCount(comm_, &n), "ncclCommCount");
    check_nccl(ncclCommUserRank(comm_, &me), "ncclCommUserRank");
    if (n != size || me != rank)
      throw Error("ncclCommSplit: rank " + std::to_string(me) + " of " + std::to_string(n) +
                  ", expected rank " + std::to_string(rank) + " of " + std::to_string(size));
  } catch (const std::exception& e) {
    abort(e.what());
    throw;
  }
}

NcclComm::~NcclComm() {
  if (comm_) {
    // Finalize would wait for the peers; destruction must not hang.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclComm::abort(const std::string& why) {
  if (!comm_) return;
  aborted_why_ = why;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclComm::require_live() const {
  if (!comm_)
    throw Error("the NCCL communicator was aborted after an earlier error: " + aborted_why_);
}

void NcclComm::check_async(const char* during) {
  require_live();
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) state = r;
  if (state == ncclSuccess || state == ncclInProgress) return;
  std::string what = nccl_error_text(during, state);
  abort(what);
  throw Error(what);
}

void NcclComm::settle(const Deadline& d, const char* during) {
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) {  // aborted too: the other ranks may be in the same operation
      std::string what = nccl_error_text("ncclCommGetAsyncError", r);
      abort(what);
      throw Error(what);
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      std::string what = nccl_error_text(during, state);
      abort(what);
      throw Error(what);
    }
    if (d.passed()) {
      abort(std::string(during) + ": timed out");
      d.expire(std::string("the other ranks in ") + during);
    }
    pause();
  }
}

void NcclComm::enqueue(const char* call, const std::function<ncclResult_t(ncclComm_t)>& f,
                       const Deadline& d) {
  check_async("an earlier NCCL operation");
  ncclResult_t r = f(comm_);
  if (r == ncclInProgress) settle(d, call);  // non-blocking: enqueued when settled
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string what = nccl_error_text(call, r);
    abort(what);
    throw Error(what);
  }
}

void NcclComm::allreduce(void* buf, size_t count, DType t, Op op, cudaStream_t stream,
                         const Deadline& d) {
  enqueue("ncclAllReduce", [&](ncclComm_t c) {
    return one_rank_split(size_ == 1 && op == Op::Avg, count, t, [&](size_t off, size_t k) {
      char* p = static_cast<char*>(buf) + off * dtype_size(t);
      return ncclAllReduce(p, p, k, nccl_type(t), nccl_op(op), c, stream);
    });
  }, d);
}

void NcclComm::reduce_scatter(const void* in, void* out, size_t count, DType t, Op op,
                              cudaStream_t stream, const Deadline& d) {
  enqueue("ncclReduceScatter", [&](ncclComm_t c) {
    return one_rank_split(size_ == 1 && op == Op::Avg, count, t, [&](size_t off, size_t k) {
      size_t skip = off * dtype_size(t);  // one rank: its block is the whole input
      return ncclReduceScatter(static_cast<const char*>(in) + skip, static_cast<char*>(out) + skip,
                               k, nccl_type(t), nccl_op(op), c, stream);
    });
  }, d);
}

void NcclComm::allgather(const void* in, void* out, size_t count, DType t, cudaStream_t stream,
                         const Deadline& d) {
  enqueue("ncclAllGather", [&](ncclComm_t c) {
    return ncclAllGather(in, out, count, nccl_type(t), c, stream);
  }, d);
}

void NcclComm::broadcast(void* buf, size_t count, DType t, int root, cudaStream_t stream,
                         const Deadline& d) {
  enqueue("ncclBroadcast", [&](ncclComm_t c) {
    return ncclBroadcast(buf, buf, count, nccl_type(t), root, c, stream);
  }, d);
}

void NcclComm::wait(cudaStream_t stream, const Deadline& d) { gpu::wait(stream, {this}, d); }

void check_async(const NcclComms& cs, const char* during) {
  for (NcclComm* c : cs) {
    try {
      c->check_async(during);
    } catch (const Error& e) {
      abort(cs, e.what());
      throw;
    }
  }
}

void abort(const NcclComms& cs, const std::string& why) {
  for (NcclComm* c : cs) c->abort(why);
}

namespace {

// One look at query()'s work (cudaStreamQuery or cudaEventQuery, named `call`): whether it is
// done; a CUDA error, or an NCCL error on one of the communicators, aborts them all and throws.
template <typename Query>
bool poll(Query query, const char* call, const NcclComms& cs) {
  cudaError_t e = query();
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) {
    std::string what = cuda_error_text(call, e);
    abort(cs, what);
    throw Error(what);
  }
  check_async(cs, "an enqueued NCCL operation");
  return false;
}

// Polls until the work is done, watching the communicators and the deadline.
template <typename Query>
void wait_for(Query query, const char* call, const NcclComms& cs, const Deadline& d) {
  for (NcclComm* c : cs) c->require_live();
  while (!poll(query, call, cs)) {
    if (d.passed()) {
      abort(cs, "an enqueued NCCL operation: timed out");
      d.expire("the other ranks' part of the enqueued NCCL operations");
    }
    pause();
  }
}

}  // namespace

void wait(cudaStream_t stream, const NcclComms& cs, const Deadline& d) {
  wait_for([stream] { return cudaStreamQuery(stream); }, "cudaStreamQuery", cs, d);
}

void wait(cudaEvent_t event, const NcclComms& cs, const Deadline& d) {
  wait_for([event] { return cudaEventQuery(event); }, "cudaEventQuery", cs, d);
}

bool done(cudaEvent_t event, const NcclComms& cs) {
  for (NcclComm* c : cs) c->require_live();
  return poll([event] { return cudaEventQuery(event); }, "cudaEventQuery", cs);
}

}  // namespace pytorch_exec::dc::gpu
