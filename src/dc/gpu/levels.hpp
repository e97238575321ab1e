// The device-memory engines of the shared hierarchical orchestration (dc/engines.hpp):
//   NcclIntra  the level inside a node: per-owner ncclReduce into each owner's shard, the
//              cross-node step on it, per-owner ncclBroadcast back (uneven shards and owners
//              fewer than the level's ranks, as the host engines allow); Op::Avg reduces each
//              rank's contribution pre-multiplied by 1/avg_divisor (ncclRedOpCreatePreMulSum),
//              so that the sum across nodes is the average.  Nested in a NestedIntra
//              (engines.hpp) for the locality domains of a node, one NcclIntra per level: the
//              domain's ranks and the rail's, and only the rail's gets Op::Avg.  For
//              reduce-scatter, allgather and broadcast (IntraBlocks): ncclReduceScatter and
//              ncclAllGather over the level, one per node's group of blocks; ncclBroadcast.
//   CudaCopy   cudaMemcpyAsync on two copy streams of its own (to the host, back to the device)
//              into pinned host buffers, one per pipeline slot, completion by events; begin()
//              makes the copy streams wait for the user's stream, end() the user's stream for the
//              copies back.  Waits poll the event, the asynchronous errors of the call's
//              communicators (every level's) and the deadline: an error or timeout aborts them
//              all and throws.
// Both have run on one GPU (tests/gpu: NCCL levels of one rank, two simulated nodes); a level of
// several GPUs has not run yet.  Threads: the group's.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <utility>
#include <vector>

#include "dc/engines.hpp"
#include "dc/gpu/nccl_comm.hpp"

namespace pytorch_exec::dc::gpu {

// Throws unless NcclIntra can average `t` (f32, f64), naming `call`.  Callers check first, on
// every rank, before anything is enqueued or exchanged (an error inside the levels aborts the
// group), and because not every rank reaches the NcclIntra that averages (the rail level of a
// NestedIntra).
void require_avg(DType t, const char* call);

class NcclIntra final : public IntraEngine, public IntraBlocks {
 public:
  // `level`: the ranks of this node, of a domain or of a rail; `stream`: the user's.
  NcclIntra(NcclComm& level, int level_rank, int level_size, cudaStream_t stream)
      : c_(level), me_(level_rank), n_(level_size), stream_(stream) {}
  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override;
  // One ncclReduceScatter (Op::Avg pre-multiplied, as allreduce) or ncclAllGather per group, in
  // one NCCL group.
  bool reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t, Op op,
                      int avg_divisor, const CallHeader& h, const Deadline& d) override;
  void allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                 const CallHeader& h, const Deadline& d) override;
  void broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                 const Deadline& d) override;

 private:
  // Enqueues f(0 ... calls-1) between ncclGroupStart and ncclGroupEnd, as one call.
  void grouped(const char* call, size_t calls, const Deadline& d,
               const std::function<ncclResult_t(size_t, ncclComm_t)>& f);
  // Runs f with the NCCL op of `op`: Op::Avg as a sum pre-multiplied by 1/avg_divisor, created
  // on the communicator for f and destroyed after it.
  void with_op(DType t, Op op, int avg_divisor, const Deadline& d,
               const std::function<void(ncclRedOp_t)>& f);

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
  // The user's stream and the communicators whose errors the waits watch, for the next call, and
  // the size of its pipeline chunks (a slot's pinned buffer is at least that).
  void use(cudaStream_t user, NcclComms watch, size_t chunk_bytes) {
    user_ = user;
    watch_ = std::move(watch);
    reserve_ = chunk_bytes;
  }

  void begin(const Deadline& d) override;
  void* host(int slot, void* src, size_t bytes) override;
  void to_host(int slot, void* host, const void* src, size_t bytes) override;
  void wait_to_host(int slot, const Deadline& d) override;
  void to_device(int slot, void* dst, const void* host, size_t bytes) override;
  void wait_to_device(int slot, const Deadline& d) override;
  void end(const Deadline& d) override;
  // After an error in the middle of a call: the user's stream waits for whatever the copy streams
  // still have (so that memory freed on it outlives their copies); statuses are ignored.
  void join_user();

 private:
  void wait(cudaEvent_t e, const char* what, const Deadline& d);

  cudaStream_t user_ = nullptr, up_ = nullptr, down_ = nullptr;
  NcclComms watch_;
  cudaEvent_t ready_ = nullptr, back_ = nullptr;
  cudaEvent_t up_done_[kCopySlots] = {}, down_done_[kCopySlots] = {};
  void* pinned_[kCopySlots] = {};
  size_t pinned_bytes_[kCopySlots] = {};
  size_t reserve_ = 0;
  std::vector<void*> retired_;  // outgrown pinned buffers, freed by the destructor
};

}  // namespace pytorch_exec::dc::gpu
