// bench/gpu_allreduce/gpu_bench: f32 sum allreduce of GPU buffers, the DataChannel
// (ProcessGroup::allreduce_device) against ncclAllReduce on a communicator of the same ranks, in
// the nccl-tests style: for each size one checked allreduce each, then --iters timed ones back
// to back on one stream (time = elapsed / iters, the maximum over ranks); busbw = algbw x
// 2(n-1)/n.  At the end the median ratio dc / NCCL of busbw at >= 1 MiB.  See Makefile.am.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dc/gpu/probe.hpp"
#include "dc/gpu/status.hpp"
#include "pytorch_exec/dc.hpp"

namespace dc = pytorch_exec::dc;
namespace gpu = pytorch_exec::dc::gpu;

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "gpu_bench: %s\nusage: gpu_bench [--sizes MIN:MAX] [--iters K]\n",
               why.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  size_t lo = 8, hi = size_t{256} << 20;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%zu:%zu", &lo, &hi) != 2 || lo < 4 || hi < lo)
        usage(std::string("--sizes ") + argv[i] + ": want MIN:MAX bytes, 4 <= MIN <= MAX");
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
      if (iters < 1) usage(std::string("--iters ") + argv[i] + ": want a positive count");
    } else {
      usage("unknown argument " + a);
    }
  }
  try {
    gpu::Probe p = gpu::probe();
    if (p.devices == 0) {
      std::printf("SKIP: no GPU visible (%s)\n", p.no_gpu.c_str());
      return 77;
    }
    const char* lr = std::getenv("LOCAL_RANK");
    int local = lr ? std::atoi(lr) : 0;
    gpu::check_cuda(cudaSetDevice(local % p.devices), "cudaSetDevice");
    auto pg = dc::ProcessGroup::init();
    int n = pg->size(), r = pg->rank();
    ncclUniqueId id{};
    if (r == 0) gpu::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    pg->broadcast(&id, sizeof id, dc::DType::U8, 0);
    // NCCL takes one rank per GPU: where ranks share one (simulated nodes on a one-GPU
    // machine) its init fails on every rank, and only dc is timed.
    // The ranks agree: where it failed on any, none times NCCL.
    ncclComm_t nccl = nullptr;
    ncclResult_t init = ncclCommInitRank(&nccl, n, id, r);
    int32_t failed = init != ncclSuccess;
    pg->allreduce(&failed, 1, dc::DType::I32, dc::Op::Max);
    if (init != ncclSuccess)
      std::fprintf(stderr, "gpu_bench: rank %d: ncclCommInitRank: %s (%s)\n", r,
                   ncclGetErrorString(init), ncclGetLastError(nullptr));
    else if (failed)
      (void)ncclCommAbort(nccl);
    if (failed) {
      if (r == 0) std::printf("# ncclCommInitRank failed (see stderr); timing dc alone\n");
      nccl = nullptr;
    }
    cudaStream_t s = nullptr;
    gpu::check_cuda(cudaStreamCreate(&s), "cudaStreamCreate");
    float* buf = nullptr;
    gpu::check_cuda(cudaMalloc(&buf, hi), "cudaMalloc");
    std::vector<float> host(hi / sizeof(float));
    if (r == 0)
      std::printf("# %d ranks, %d GPU(s) visible per process, NCCL %s\n"
                  "#    size(B)      count   dc time(us)  dc busbw   nccl time(us)  nccl busbw"
                  "  #wrong(dc,nccl)\n",
                  n, p.devices, gpu::nccl_version_string(p.nccl_version).c_str());
    std::vector<double> ratios;
    for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
      size_t count = bytes / sizeof(float);
      double t[2] = {0, 0};
      long long wrong[2] = {0, 0};
      for (int which = 0; which < (nccl ? 2 : 1); ++which) {
        auto once = [&] {
          if (which == 0)
            pg->allreduce_device(buf, count, dc::DType::F32, dc::Op::Sum, s);
          else
            gpu::check_nccl(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, nccl, s),
                            "ncclAllReduce");
        };
        for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(r + 1 + i % 3);
        gpu::check_cuda(cudaMemcpy(buf, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        once();
        gpu::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        gpu::check_cuda(cudaMemcpy(host.data(), buf, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
        for (size_t i = 0; i < count; ++i)
          wrong[which] += host[i] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 3));
        gpu::check_cuda(cudaMemset(buf, 0, bytes), "cudaMemset");  // zeros: no overflow
        pg->barrier();
        double t0 = now_s();
        for (int k = 0; k < iters; ++k) once();
        gpu::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        t[which] = (now_s() - t0) / iters;
      }
      pg->allreduce(t, 2, dc::DType::F64, dc::Op::Max);
      pg->allreduce(wrong, 2, dc::DType::I64, dc::Op::Sum);
      double f = 2.0 * (n - 1) / n / 1e9 * static_cast<double>(bytes);
      double bw[2] = {f / t[0], t[1] > 0 ? f / t[1] : 0.0};
      if (bytes >= (1 << 20) && nccl && t[1] > 0) ratios.push_back(bw[0] / bw[1]);
      if (r == 0)
        std::printf("%12zu %10zu %13.1f %10.3f %15.1f %11.3f  %lld,%lld\n", bytes, count,
                    t[0] * 1e6, bw[0], t[1] * 1e6, bw[1], wrong[0], wrong[1]);
    }
    if (r == 0) {
      if (ratios.empty()) {
        std::printf("ratio dc / ncclAllReduce busbw at >= 1 MiB: n/a (no such size)\n");
      } else {
        std::sort(ratios.begin(), ratios.end());
        std::printf("ratio dc / ncclAllReduce busbw at >= 1 MiB (median of %zu sizes): %.3f\n",
                    ratios.size(), ratios[ratios.size() / 2]);
      }
    }
    (void)cudaFree(buf);
    (void)cudaStreamDestroy(s);
    if (nccl) (void)ncclCommDestroy(nccl);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
