// The device-memory engines of the shared hierarchical orchestration (dc/engines.hpp):
//   NcclIntra  the level inside a node: per-owner ncclReduce into each owner's shard, the
//              cross-node step on it, per-owner ncclBroadcast back (uneven shards and owners
//              fewer than the level's ranks, as the host engines allow); Op::Avg reduces each
//              rank's contribution pre-multiplied by 1/avg_divisor (ncclRedOpCreatePreMulSum),
//              so that the sum across nodes is the average.
//   CudaCopy   cudaMemcpyAsync on two copy streams of its own (to the host, back to the device)
//              into pinned host buffers, one per pipeline slot, completion by events; begin()
//              makes the copy streams wait for the user's stream, end() the user's stream for the
//              copies back.  Waits poll the event, the communicator's asynchronous error and the
//              deadline: an error or timeout aborts the communicator and throws.
// Both are compiled here (no GPU) and have never run on one.  Threads: the group's.
#pragma once

#include <cuda_runtime_api.h>

#include "dc/engines.hpp"
#include "dc/gpu/nccl_comm.hpp"

namespace pytorch_exec::dc::gpu {

class NcclIntra final : public IntraEngine {
 public:
  // `level`: the ranks of this node (level rank = local rank); `stream`: the user's.
  NcclIntra(NcclComm& level, int level_rank, int level_size, cudaStream_t stream)
      : c_(level), me_(level_rank), n_(level_size), stream_(stream) {}
  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override;

 private:
  NcclComm& c_;
  int me_, n_;
  cudaStream_t stream_;
};

class CudaCopy final : public CopyEngine {
 public:
  // Streams and events on the current device; pinned buffers as the chunks need them.
  CudaCopy();
  ~CudaCopy() override;
  CudaCopy(const CudaCopy&) = delete;
  CudaCopy& operator=(const CudaCopy&) = delete;
  // The user's stream and the communicator whose errors the waits watch, for the next call.
  void use(cudaStream_t user, NcclComm* watch) {
    user_ = user;
    watch_ = watch;
  }

  void begin(const Deadline& d) override;
  void* host(int slot, void* src, size_t bytes) override;
  void to_host(int slot, void* host, const void* src, size_t bytes) override;
  void wait_to_host(int slot, const Deadline& d) override;
  void to_device(int slot, void* dst, const void* host, size_t bytes) override;
  void wait_to_device(int slot, const Deadline& d) override;
  void end(const Deadline& d) override;

 private:
  void wait(cudaEvent_t e, const char* what, const Deadline& d);

  cudaStream_t user_ = nullptr, up_ = nullptr, down_ = nullptr;
  NcclComm* watch_ = nullptr;
  cudaEvent_t ready_ = nullptr, back_ = nullptr;
  cudaEvent_t up_done_[kCopySlots] = {}, down_done_[kCopySlots] = {};
  void* pinned_[kCopySlots] = {};
  size_t pinned_bytes_[kCopySlots] = {};
};

}  // namespace pytorch_exec::dc::gpu
