#include "dc/gpu/probe.hpp"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>

#include "dc/gpu/status.hpp"

namespace pytorch_exec::dc::gpu {

std::string nccl_version_string(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

std::string cuda_version_string(int code) {
  return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10);
}

Probe probe() {
  Probe p;
  p.nccl_header = NCCL_VERSION_CODE;
  check_nccl(ncclGetVersion(&p.nccl_version), "ncclGetVersion");
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) && info.dli_fname) {
    char real[PATH_MAX];
    p.nccl_library = ::realpath(info.dli_fname, real) ? real : info.dli_fname;
  }
  check_cuda(cudaRuntimeGetVersion(&p.runtime_version), "cudaRuntimeGetVersion");
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  cudaError_t e = cudaGetDeviceCount(&p.devices);
  if (e != cudaSuccess) {
    p.devices = 0;
    p.no_gpu = (p.driver_version == 0 ? "no NVIDIA driver: " : "") +
               cuda_error_text("cudaGetDeviceCount", e);
    (void)cudaGetLastError();  // not sticky: clear it for later calls
  } else if (p.devices == 0) {
    p.no_gpu = "cudaGetDeviceCount: 0 devices";
  }
  return p;
}

}  // namespace pytorch_exec::dc::gpu
