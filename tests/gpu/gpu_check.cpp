// Needs a GPU: a one-rank NCCL communicator per visible GPU (ncclCommInitAll) allreduces device
// buffers on a stream, checked against the host.  Exits 77 (automake's SKIP) with the reason
// when no GPU is visible.  Written for a GPU machine; see README "Testing the GPU path".
#include <cstdio>
#include <vector>

#include "dc/gpu/probe.hpp"
#include "dc/gpu/status.hpp"

using namespace pytorch_exec::dc;

namespace {

int run(int n) {
  const size_t count = 1 << 20;
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  std::vector<cudaStream_t> streams(static_cast<size_t>(n));
  std::vector<float*> bufs(static_cast<size_t>(n));
  gpu::check_nccl(ncclCommInitAll(comms.data(), n, nullptr), "ncclCommInitAll");
  for (int i = 0; i < n; ++i) {
    size_t k = static_cast<size_t>(i);
    gpu::check_cuda(cudaSetDevice(i), "cudaSetDevice");
    gpu::check_cuda(cudaStreamCreate(&streams[k]), "cudaStreamCreate");
    gpu::check_cuda(cudaMalloc(&bufs[k], count * sizeof(float)), "cudaMalloc");
    std::vector<float> host(count);
    for (size_t j = 0; j < count; ++j)
      host[j] = static_cast<float>(i + 1) + static_cast<float>(j % 7);
    gpu::check_cuda(cudaMemcpy(bufs[k], host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
                    "cudaMemcpy");
  }
  gpu::check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (size_t k = 0; k < comms.size(); ++k)
    gpu::check_nccl(ncclAllReduce(bufs[k], bufs[k], count, gpu::nccl_type(DType::F32),
                                  gpu::nccl_op(Op::Sum), comms[k], streams[k]),
                    "ncclAllReduce");
  gpu::check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  int bad = 0;
  const float ranks = static_cast<float>(n * (n + 1) / 2);
  for (int i = 0; i < n; ++i) {
    size_t k = static_cast<size_t>(i);
    gpu::check_cuda(cudaSetDevice(i), "cudaSetDevice");
    gpu::check_cuda(cudaStreamSynchronize(streams[k]), "cudaStreamSynchronize");
    std::vector<float> host(count);
    gpu::check_cuda(cudaMemcpy(host.data(), bufs[k], count * sizeof(float), cudaMemcpyDeviceToHost),
                    "cudaMemcpy");
    for (size_t j = 0; j < count && bad < 5; ++j) {
      float want = ranks + static_cast<float>(n) * static_cast<float>(j % 7);
      if (host[j] != want) {
        std::fprintf(stderr, "GPU %d element %zu: %g, want %g\n", i, j, host[j], want);
        ++bad;
      }
    }
    cudaFree(bufs[k]);
    cudaStreamDestroy(streams[k]);
    ncclCommDestroy(comms[k]);
  }
  return bad;
}

}  // namespace

int main() {
  try {
    gpu::Probe p = gpu::probe();
    if (p.devices == 0) {
      std::printf("SKIP: no GPU visible (%s)\n", p.no_gpu.c_str());
      return 77;
    }
    std::printf("%d GPU(s), NCCL %s\n", p.devices,
                gpu::nccl_version_string(p.nccl_version).c_str());
    if (int bad = run(p.devices)) {
      std::printf("FAIL: allreduce over %d GPU(s): %d wrong elements\n", p.devices, bad);
      return 1;
    }
    std::printf("PASS: allreduce of 1 Mi floats over %d GPU(s) (one NCCL communicator)\n",
                p.devices);
    return 0;
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
