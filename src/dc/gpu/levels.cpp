#include "dc/gpu/levels.hpp"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include "dc/gpu/status.hpp"
#include "dc/reduce.hpp"
#include "dc/ring.hpp"

namespace pytorch_exec::dc::gpu {

namespace {

// ncclRedOpCreatePreMulSum's scalar: 1/divisor in the buffer's type (f32 and f64 only; NCCL
// takes a half type's scalar as a half, and an integer average would need a division kernel
// this path does not have).
struct PreMul {
  float f32 = 0;
  double f64 = 0;
  const void* scalar(DType t, int divisor) {
    if (t == DType::F32) {
      f32 = 1.0f / static_cast<float>(divisor);
      return &f32;
    }
    f64 = 1.0 / divisor;
    return &f64;
  }
};

}  // namespace

void NcclIntra::with_op(DType t, Op op, int avg_divisor, const Deadline& d,
                        const std::function<void(ncclRedOp_t)>& f) {
  if (op != Op::Avg) return f(nccl_op(op));
  require_avg(t, "an NCCL level");  // the callers checked already, before anything was enqueued
  PreMul pm;
  const void* scalar = pm.scalar(t, avg_divisor);
  ncclRedOp_t rop{};
  c_.enqueue("ncclRedOpCreatePreMulSum", [&](ncclComm_t c) {
    return ncclRedOpCreatePreMulSum(&rop, const_cast<void*>(scalar), nccl_type(t),
                                    ncclScalarHostImmediate, c);
  }, d);
  f(rop);
  c_.enqueue("ncclRedOpDestroy", [&](ncclComm_t c) { return ncclRedOpDestroy(rop, c); }, d);
}

void require_avg(DType t, const char* call) {
  if (t != DType::F32 && t != DType::F64)
    throw Error(std::string(call) + " across nodes: Avg on " + dtype_name(t) +
                " is not supported (f32 and f64 are)");
}

void NcclIntra::allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                          int avg_divisor, const CallHeader&, const Deadline& d) {
  size_t es = dtype_size(t);
  Blocks b = even_blocks(count, owners);
  while (static_cast<int>(b.off.size()) < n_ + 1) b.off.push_back(count);
  auto* base = static_cast<char*>(buf);
  // One NCCL call per non-empty shard j (root: its owner, local rank j), in one group.
  auto per_shard = [&](const char* call, const std::function<ncclResult_t(char*, size_t, int,
                                                                          ncclComm_t)>& f) {
    grouped(call, static_cast<size_t>(owners), d, [&](size_t i, ncclComm_t c) {
      int j = static_cast<int>(i);
      return b.count(j) > 0 ? f(base + b.off[i] * es, b.count(j), j, c) : ncclSuccess;
    });
  };
  with_op(t, op, avg_divisor, d, [&](ncclRedOp_t rop) {
    per_shard("ncclReduce (one per shard, grouped)", [&](char* p, size_t k, int j, ncclComm_t c) {
      return one_rank_split(n_ == 1 && op == Op::Avg, k, t, [&](size_t off, size_t m) {
        char* q = p + off * es;
        return ncclReduce(q, q, m, nccl_type(t), rop, j, c, stream_);
      });
    });
  });
  // The owner's shard across nodes (the copy engine orders its copies after the reduce).
  if (me_ < owners && b.count(me_) > 0 && cross)
    cross(base + b.off[static_cast<size_t>(me_)] * es, b.count(me_));
  per_shard("ncclBroadcast (one per shard, grouped)", [&](char* p, size_t k, int j, ncclComm_t c) {
    return ncclBroadcast(p, p, k, nccl_type(t), j, c, stream_);
  });
}

bool NcclIntra::reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t,
                               Op op, int avg_divisor, const CallHeader&, const Deadline& d) {
  size_t bb = block * dtype_size(t);
  with_op(t, op, avg_divisor, d, [&](ncclRedOp_t rop) {
    grouped("ncclReduceScatter (one per node's group, grouped)", groups, d, [&](size_t g,
                                                                              ncclComm_t c) {
      const char* from = static_cast<const char*>(in) + g * static_cast<size_t>(n_) * bb;
      char* to = static_cast<char*>(out) + g * bb;
      return one_rank_split(n_ == 1 && op == Op::Avg, block, t, [&](size_t off, size_t m) {
        size_t skip = off * dtype_size(t);  // one rank: its block is the whole group
        return ncclReduceScatter(from + skip, to + skip, m, nccl_type(t), rop, c, stream_);
      });
    });
  });
  return true;  // an Avg was pre-multiplied
}

void NcclIntra::allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                          const CallHeader&, const Deadline& d) {
  size_t bb = block * dtype_size(t);
  grouped("ncclAllGather (one per node's group, grouped)", groups, d, [&](size_t g,
                                                                        ncclComm_t c) {
    char* group = static_cast<char*>(out) + g * static_cast<size_t>(n_) * bb;
    const char* own = in ? static_cast<const char*>(in) + g * bb
                         : group + static_cast<size_t>(me_) * bb;  // in place
    return ncclAllGather(own, group, block, nccl_type(t), c, stream_);
  });
}

void NcclIntra::broadcast(void* buf, size_t bytes, int root, const CallHeader&,
                          const Deadline& d) {
  c_.enqueue("ncclBroadcast", [&](ncclComm_t c) {
    return ncclBroadcast(buf, buf, bytes, ncclUint8, root, c, stream_);
  }, d);
}

void NcclIntra::grouped(const char* call, size_t calls, const Deadline& d,
                        const std::function<ncclResult_t(size_t, ncclComm_t)>& f) {
  c_.enqueue(call, [&](ncclComm_t c) {
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; i < calls && r == ncclSuccess; ++i) r = f(i, c);
    ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  }, d);
}

CudaCopy::CudaCopy() {
  check_cuda(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check_cuda(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");
  check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&back_, cudaEventDisableTiming), "cudaEventCreate");
  for (int s = 0; s < kCopySlots; ++s) {
    check_cuda(cudaEventCreateWithFlags(&up_done_[s], cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&down_done_[s], cudaEventDisableTiming),
               "cudaEventCreate");
  }
}

CudaCopy::~CudaCopy() {
  // Teardown: statuses are ignored (a destructor must not throw; after an abort the context may
  // be unusable), but nothing is left that a later call could use.
  for (void* p : retired_) (void)cudaFreeHost(p);
  for (int s = 0; s < kCopySlots; ++s) {
    if (pinned_[s]) (void)cudaFreeHost(pinned_[s]);
    if (up_done_[s]) (void)cudaEventDestroy(up_done_[s]);
    if (down_done_[s]) (void)cudaEventDestroy(down_done_[s]);
  }
  if (ready_) (void)cudaEventDestroy(ready_);
  if (back_) (void)cudaEventDestroy(back_);
  if (up_) (void)cudaStreamDestroy(up_);
  if (down_) (void)cudaStreamDestroy(down_);
}

void CudaCopy::begin(const Deadline&) {
  check_cuda(cudaEventRecord(ready_, user_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(up_, ready_, 0), "cudaStreamWaitEvent");
  check_cuda(cudaStreamWaitEvent(down_, ready_, 0), "cudaStreamWaitEvent");
}

void* CudaCopy::host(int slot, void*, size_t bytes) {
  if (pinned_bytes_[slot] < bytes) {
    // Not cudaFreeHost here: it waits for the whole device, with no deadline, in the middle of a
    // call whose NCCL work is enqueued (a dead peer would hang it).  The old buffer is kept until
    // the destructor; a slot starts at the chunk size, so a call grows it only in the rare case
    // that a chunk is larger (a block collective over more nodes than the chunk has elements),
    // at least twofold.
    size_t want = std::max({bytes, reserve_, 2 * pinned_bytes_[slot]});
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, want, cudaHostAllocDefault), "cudaHostAlloc");
    if (pinned_[slot]) retired_.push_back(pinned_[slot]);
    pinned_[slot] = p;
    pinned_bytes_[slot] = want;
  }
  return pinned_[slot];
}

void CudaCopy::to_host(int slot, void* host, const void* src, size_t bytes) {
  check_cuda(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, up_),
             "cudaMemcpyAsync (device to host)");
  check_cuda(cudaEventRecord(up_done_[slot], up_), "cudaEventRecord");
}

void CudaCopy::to_device(int slot, void* dst, const void* host, size_t bytes) {
  check_cuda(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, down_),
             "cudaMemcpyAsync (host to device)");
  check_cuda(cudaEventRecord(down_done_[slot], down_), "cudaEventRecord");
}

// An event that no copy of this call recorded (a slot that a broadcast's root never copies back
// to, or its peers never copy up from) is complete: every earlier call waited for all of its own.
void CudaCopy::wait(cudaEvent_t e, const char* what, const Deadline& d) {
  for (;;) {
    cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return;
    if (r != cudaErrorNotReady) {
      std::string text = cuda_error_text("cudaEventQuery", r) + " (" + what + ")";
      abort(watch_, text);
      throw Error(text);
    }
    // The copy to the host waits for the node's ncclReduce(s): a dead peer shows here.
    check_async(watch_, what);
    if (d.passed()) {
      abort(watch_, std::string(what) + ": timed out");
      d.expire(std::string("the other ranks (") + what + ")");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void CudaCopy::wait_to_host(int slot, const Deadline& d) {
  wait(up_done_[slot], "the copy of a chunk to the host", d);
}

void CudaCopy::wait_to_device(int slot, const Deadline& d) {
  wait(down_done_[slot], "the copy of a chunk back to the device", d);
}

void CudaCopy::join_user() {
  for (cudaStream_t c : {up_, down_})
    if (cudaEventRecord(back_, c) == cudaSuccess) (void)cudaStreamWaitEvent(user_, back_, 0);
}

void CudaCopy::end(const Deadline&) {
  check_cuda(cudaEventRecord(back_, down_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(user_, back_, 0), "cudaStreamWaitEvent");
}

}  // namespace pytorch_exec::dc::gpu
