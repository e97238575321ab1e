// The GPU path without a GPU: it links, the NCCL it loads at run time is the one it was compiled
// against and the one configure chose, failures name the call, and every DataChannel type and
// operation has its NCCL counterpart.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dc/gpu/probe.hpp"
#include "dc/gpu/status.hpp"
#include "testlib.hpp"

using namespace pytorch_exec::dc;

TEST(GpuBuild, LoadsTheNcclItWasBuiltAgainst) {
  gpu::Probe p = gpu::probe();
  EXPECT_EQ(p.nccl_version, p.nccl_header)
      << "loaded NCCL " << gpu::nccl_version_string(p.nccl_version) << " from " << p.nccl_library
      << ", compiled against " << gpu::nccl_version_string(p.nccl_header);
  char dir[PATH_MAX];
  ASSERT_NE(::realpath(PE_NCCL_LIBDIR, dir), nullptr) << PE_NCCL_LIBDIR;
  EXPECT_EQ(p.nccl_library.rfind(std::string(dir) + "/", 0), 0u)
      << "loaded " << p.nccl_library << ", configure chose " << dir;
  EXPECT_GE(p.runtime_version, 11000) << "CUDA runtime " << p.runtime_version;
  std::printf("NCCL %s (%s), CUDA runtime %s, driver %s, GPUs: %d%s%s\n",
              gpu::nccl_version_string(p.nccl_version).c_str(), p.nccl_library.c_str(),
              gpu::cuda_version_string(p.runtime_version).c_str(),
              p.driver_version ? gpu::cuda_version_string(p.driver_version).c_str() : "none",
              p.devices, p.no_gpu.empty() ? "" : ": ", p.no_gpu.c_str());
}

TEST(GpuBuild, NoGpuComesWithAReason) {
  gpu::Probe p = gpu::probe();
  if (p.devices > 0) GTEST_SKIP() << p.devices << " GPU(s) visible";
  EXPECT_NE(p.no_gpu, "");
}

TEST(GpuBuild, FailuresNameTheCall) {
  try {
    gpu::check_cuda(cudaErrorInvalidValue, "cudaMemcpyAsync");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cudaMemcpyAsync: cudaErrorInvalidValue (", 0), 0u)
        << e.what();
  }
  try {
    gpu::check_nccl(ncclInvalidArgument, "ncclAllReduce");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("ncclAllReduce: invalid argument", 0), 0u) << e.what();
  }
  EXPECT_NO_THROW(gpu::check_cuda(cudaSuccess, "cudaStreamSynchronize"));
  EXPECT_NO_THROW(gpu::check_nccl(ncclSuccess, "ncclGroupEnd"));
}

TEST(GpuBuild, AFailingRuntimeCallIsAnError) {
  // Without a GPU cudaMalloc fails; with one, an impossible size does.
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, ~size_t{0} >> 1);
  ASSERT_NE(e, cudaSuccess);
  (void)cudaGetLastError();
  EXPECT_THROW(gpu::check_cuda(e, "cudaMalloc"), Error);
}

// NCCL's one-rank PreMulSum kernel before 2.29.7 covers blocks * roundup(count / blocks, pack)
// elements; the counts gpu_check saw lose their tails on NCCL 2.28.9 (2^18 + 3 floats: 3 left
// unwritten; 2^21 + 10: 10 left unscaled).
TEST(GpuBuild, OneRankSplitCoversWhatNcclLeaves) {
  EXPECT_EQ(gpu::one_rank_covered((1 << 18) + 3, 4), size_t{1} << 18);
  EXPECT_EQ(gpu::one_rank_covered((1 << 21) + 10, 4), size_t{1} << 21);
  EXPECT_EQ(gpu::one_rank_covered(0, 4), 0u);
  for (size_t es : {1, 2, 4, 8})
    for (size_t n = 1; n < 300000; n = n * 3 + 1) {
      size_t head = gpu::one_rank_covered(n, es);
      ASSERT_LE(head, n);
      ASSERT_LT(n - head, 32u) << n;
      ASSERT_EQ(gpu::one_rank_covered(n - head, es), n - head) << n;  // the tail: one block
    }
  std::vector<std::pair<size_t, size_t>> calls;
  auto record = [&](size_t off, size_t k) {
    calls.emplace_back(off, k);
    return ncclSuccess;
  };
  // Where no tail is left (or no split is asked for): one call, outside a group.
  EXPECT_EQ(gpu::one_rank_split(true, 1 << 18, DType::F32, record), ncclSuccess);
  EXPECT_EQ(gpu::one_rank_split(false, (1 << 18) + 3, DType::F32, record), ncclSuccess);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1], std::make_pair(size_t{0}, size_t{(1 << 18) + 3}));
  calls.clear();
  EXPECT_EQ(gpu::one_rank_split(true, (1 << 18) + 3, DType::F32, record), ncclSuccess);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], std::make_pair(size_t{0}, size_t{1} << 18));
  EXPECT_EQ(calls[1], std::make_pair(size_t{1} << 18, size_t{3}));
}

TEST(GpuBuild, TypesAndOpsMapOntoNccl) {
  struct {
    DType t;
    ncclDataType_t n;
  } types[] = {{DType::F32, ncclFloat32},   {DType::F64, ncclFloat64}, {DType::F16, ncclFloat16},
               {DType::BF16, ncclBfloat16}, {DType::I32, ncclInt32},   {DType::I64, ncclInt64},
               {DType::U8, ncclUint8}};
  for (auto c : types) EXPECT_EQ(gpu::nccl_type(c.t), c.n) << dtype_name(c.t);
  EXPECT_EQ(gpu::nccl_op(Op::Sum), ncclSum);
  EXPECT_EQ(gpu::nccl_op(Op::Prod), ncclProd);
  EXPECT_EQ(gpu::nccl_op(Op::Min), ncclMin);
  EXPECT_EQ(gpu::nccl_op(Op::Max), ncclMax);
  EXPECT_EQ(gpu::nccl_op(Op::Avg), ncclAvg);
  EXPECT_THROW(gpu::nccl_type(static_cast<DType>(99)), Error);
}

TEST(GpuBuild, VersionStrings) {
  EXPECT_EQ(gpu::nccl_version_string(23007), "2.30.7");
  EXPECT_EQ(gpu::cuda_version_string(13020), "13.2");
}

TEST(GpuBuild, DeviceCallsWithoutAGpuAreOneErrorOnEveryRankAndTheGroupStaysUsable) {
  if (gpu::probe().devices > 0) GTEST_SKIP() << "a GPU is visible: gpu_check tests the device path";
  ASSERT_TRUE(ProcessGroup::has_gpu_path());
  auto g = ProcessGroup::threads(2);
  auto errors = dctest::errors_of(g, [](ProcessGroup& pg, int) {
    float x = 1;
    pg.allreduce_device_sync(&x, 1, DType::F32, Op::Sum, nullptr);
  });
  for (const auto& e : errors)
    EXPECT_EQ(e.rfind("allreduce_device_sync: no GPU visible (", 0), 0u) << e;
  // Every other device call too, on two simulated nodes (the hierarchical device path's entry).
  auto nodes = ProcessGroup::threads(2, {}, {0, 1});
  dctest::on_all(nodes, [](ProcessGroup& pg, int) {
    float x = 1, y[2] = {1, 1};
    auto first = [](const std::function<void()>& f, const std::string& call) {
      try {
        f();
        ADD_FAILURE() << call << " did not throw";
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind(call + ": no GPU visible (", 0), 0u) << e.what();
      }
    };
    first([&] { pg.allreduce_device(&x, 1, DType::F32, Op::Sum, nullptr); }, "allreduce_device");
    first([&] { pg.reduce_scatter_device(y, &x, 1, DType::F32, Op::Sum, nullptr); },
          "reduce_scatter_device");
    first([&] { pg.allgather_device(&x, y, 1, DType::F32, nullptr); }, "allgather_device");
    first([&] { pg.broadcast_device(&x, 1, DType::F32, 0, nullptr); }, "broadcast_device");
    EXPECT_THROW(pg.device_synchronize(nullptr), Error);  // no device call succeeded
  });
  dctest::on_all(g, [](ProcessGroup& pg, int r) {
    float x = static_cast<float>(r + 1);
    pg.allreduce(&x, 1, DType::F32, Op::Sum);
    EXPECT_EQ(x, 3.0f);
  });
}
