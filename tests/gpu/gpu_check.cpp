// Needs a GPU; exits 77 (automake's SKIP) with the reason when none is visible.  With GPUs:
//   1. NCCL alone: one communicator per visible GPU (ncclCommInitAll) allreduces device buffers;
//   2. the DataChannel: a group of one rank (thread) per GPU, allreduce_device_sync and then
//      allreduce_device + cudaStreamSynchronize (the cached communicator) on device buffers,
//      Sum and Avg, checked against the host.
// Written for a GPU machine (make check-gpu); it has not run on one yet.
#include <cstdio>
#include <string>
#include <thread>
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

// Rank r (thread r, GPU r) of `g`: element j of its buffer is r + 1 + j % 7.
int group_rank(ProcessGroup& pg, int r, int n, std::string& error) {
  const size_t count = (1 << 20) + 3;
  gpu::check_cuda(cudaSetDevice(r), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  gpu::check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  float* dev = nullptr;
  gpu::check_cuda(cudaMalloc(&dev, count * sizeof(float)), "cudaMalloc");
  std::vector<float> host(count);
  int bad = 0;
  for (Op op : {Op::Sum, Op::Avg}) {
    for (size_t j = 0; j < count; ++j)
      host[j] = static_cast<float>(r + 1) + static_cast<float>(j % 7);
    gpu::check_cuda(cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
                    "cudaMemcpy");
    if (op == Op::Sum) {
      pg.allreduce_device_sync(dev, count, DType::F32, op, stream);
    } else {
      pg.allreduce_device(dev, count, DType::F32, op, stream);
      gpu::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    gpu::check_cuda(cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost),
                    "cudaMemcpy");
    const float sum = static_cast<float>(n * (n + 1) / 2);
    for (size_t j = 0; j < count && bad < 5; ++j) {
      float want = sum + static_cast<float>(n) * static_cast<float>(j % 7);
      if (op == Op::Avg) want /= static_cast<float>(n);
      if (host[j] != want) {
        error += "rank " + std::to_string(r) + " " + op_name(op) + " element " + std::to_string(j) +
                 ": " + std::to_string(host[j]) + ", want " + std::to_string(want) + "\n";
        ++bad;
      }
    }
  }
  cudaFree(dev);
  cudaStreamDestroy(stream);
  return bad;
}

int run_group(int n) {
  auto groups = ProcessGroup::threads(n);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        group_rank(*groups[static_cast<size_t>(r)], r, n, errors[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("rank ") + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : th) t.join();
  int bad = 0;
  for (const auto& e : errors)
    if (!e.empty()) {
      std::fprintf(stderr, "%s\n", e.c_str());
      ++bad;
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
    if (int bad = run_group(p.devices)) {
      std::printf("FAIL: DataChannel allreduce_device over %d GPU(s): %d rank(s) wrong\n",
                  p.devices, bad);
      return 1;
    }
    std::printf("PASS: DataChannel allreduce_device(_sync), Sum and Avg, %d rank(s), one per GPU\n",
                p.devices);
    return 0;
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
