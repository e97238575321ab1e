// ProcessGroup's device-memory calls in a libpytorch_dc built without the GPU path (configure
// found no CUDA or no NCCL): each is one Error saying so.
#include "dc/group.hpp"

namespace pytorch_exec::dc {

namespace {

[[noreturn]] void no_gpu_path(const char* call) {
  throw Error(std::string(call) +
              ": this libpytorch_dc was built without the GPU path (configure found no CUDA or no "
              "NCCL)");
}

}  // namespace

bool ProcessGroup::has_gpu_path() { return false; }

void ProcessGroup::allreduce_device(void*, size_t, DType, Op, void*, double) {
  no_gpu_path("allreduce_device");
}

void ProcessGroup::allreduce_device_sync(void*, size_t, DType, Op, void*, double) {
  no_gpu_path("allreduce_device_sync");
}

void ProcessGroup::reduce_scatter_device(const void*, void*, size_t, DType, Op, void*, double) {
  no_gpu_path("reduce_scatter_device");
}

void ProcessGroup::allgather_device(const void*, void*, size_t, DType, void*, double) {
  no_gpu_path("allgather_device");
}

void ProcessGroup::broadcast_device(void*, size_t, DType, int, void*, double) {
  no_gpu_path("broadcast_device");
}

void ProcessGroup::device_synchronize(void*, double) { no_gpu_path("device_synchronize"); }

void ProcessGroup::device_wait_event(void*, double) { no_gpu_path("device_wait_event"); }

bool ProcessGroup::device_event_done(void*) { no_gpu_path("device_event_done"); }

}  // namespace pytorch_exec::dc
