// ProcessGroup's device-memory calls (the GPU path).  Today one NCCL communicator of the whole
// group, made at the first call on the device current then (rank 0's ncclUniqueId broadcast over
// the group's host transports), cached in the group and aborted on any error or timeout.  The
// levels of topo::plan_gpu_levels (NCCL per domain, host-staged rings across nodes) are not built
// yet: across nodes NCCL uses its own network transport.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

#include "dc/gpu/nccl_comm.hpp"
#include "dc/gpu/status.hpp"
#include "dc/group.hpp"

namespace pytorch_exec::dc {

namespace gpu {

struct DeviceState {
  std::unique_ptr<NcclComm> comm;  // of the whole group
};

}  // namespace gpu

namespace {

// One Error on this rank, before anything is exchanged, when no GPU can be used.
void require_gpu(const char* call) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return;
  (void)cudaGetLastError();
  throw Error(std::string(call) + ": no GPU visible (" +
              (e != cudaSuccess ? gpu::cuda_error_text("cudaGetDeviceCount", e) : "0 devices") +
              ")");
}

// The group's communicator, made (collectively) at the first call.
gpu::NcclComm& device_comm(ProcessGroup& pg, ProcessGroup::Impl& g, const char* call,
                           double timeout) {
  require_gpu(call);
  int dev = -1;
  gpu::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (g.gpu && g.gpu->comm) {
    if (g.gpu->comm->aborted())
      throw Error(std::string(call) + ": the group's NCCL communicator was aborted after an error");
    if (g.gpu->comm->device() != dev)
      throw Error(std::string(call) + ": the group's NCCL communicator is on GPU " +
                  std::to_string(g.gpu->comm->device()) + ", the current device is GPU " +
                  std::to_string(dev));
    return *g.gpu->comm;
  }
  ncclUniqueId id{};
  if (g.rank == 0) gpu::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  pg.broadcast(&id, sizeof id, DType::U8, 0, timeout);
  auto state = std::make_shared<gpu::DeviceState>();
  Deadline d = g.deadline(timeout, std::string(call) + ": NCCL communicator set-up");
  state->comm = std::make_unique<gpu::NcclComm>(g.rank, g.size, id, d);
  g.gpu = state;
  return *state->comm;
}

// Enqueues the allreduce of `call` on `stream`; the communicator it went to.
gpu::NcclComm& enqueue_allreduce(ProcessGroup& pg, ProcessGroup::Impl& g, const char* call,
                                 void* buf, size_t count, DType t, Op op, void* stream,
                                 double timeout) {
  gpu::NcclComm& c = device_comm(pg, g, call, timeout);
  c.allreduce(
      buf, count, t, op, static_cast<cudaStream_t>(stream),
      Deadline::call(g.seconds(timeout), call, count, static_cast<int>(t), static_cast<int>(op)));
  return c;
}

}  // namespace

bool ProcessGroup::has_gpu_path() { return true; }

void ProcessGroup::allreduce_device(void* buf, size_t count, DType t, Op op, void* stream,
                                    double timeout) {
  enqueue_allreduce(*this, *impl_, "allreduce_device", buf, count, t, op, stream, timeout);
}

void ProcessGroup::allreduce_device_sync(void* buf, size_t count, DType t, Op op, void* stream,
                                         double timeout) {
  const char* call = "allreduce_device_sync";
  gpu::NcclComm& c = enqueue_allreduce(*this, *impl_, call, buf, count, t, op, stream, timeout);
  c.wait(static_cast<cudaStream_t>(stream),
         Deadline::call(impl_->seconds(timeout), call, count, static_cast<int>(t),
                        static_cast<int>(op)));
}

}  // namespace pytorch_exec::dc
