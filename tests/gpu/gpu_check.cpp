// Needs a GPU; exits 77 (automake's SKIP) with the reason when none is visible.  With GPUs:
//   1. NCCL alone: one communicator per visible GPU (ncclCommInitAll) allreduces device buffers;
//   2. the DataChannel: a group of one rank (thread) per GPU, allreduce_device_sync and then
//      allreduce_device + cudaStreamSynchronize (the cached communicator) on device buffers,
//      Sum and Avg, checked against the host;
//   3. every device collective against a host reference (ranks as threads): one node, one rank
//      per GPU (plain NCCL); two simulated nodes sharing GPU 0, one rank each (an NCCL level of
//      one rank per node and the host-staged pipelined ring across), with chunks of the default
//      size and of 4099 bytes (many chunks, cut to whole elements).  Each rank works on a
//      non-blocking stream of its own, and its inputs and outputs move on that stream only
//      (pinned memory, cudaMemcpyAsync), each input after a 20 ms host function on the stream:
//      a call that reads its input before the stream got there, or whose result the stream does
//      not wait for, reads or leaves stale data, which the checks see;
//   4. the same two nodes, rank 1 stops before a collective: rank 0 gets an Error within its 5 s
//      timeout (a thread cannot be killed; a killed process fails its tcp peer sooner);
//   5. device_event_done (what the torch backend's watcher polls): false at once while the
//      stream is held, true once the work is done.
// For a GPU machine (make check-gpu); has passed on one H100 (NCCL 2.28.9).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dc/gpu/probe.hpp"
#include "dc/gpu/status.hpp"
#include "testlib.hpp"

using namespace pytorch_exec::dc;
using dctest::errors_of;
using dctest::Groups;

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
      // Avg: NCCL multiplies each contribution by 1/n (not exactly a division of the sum)
      if (std::fabs(host[j] - want) > 1e-4f * std::fabs(want)) {
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

// Rank r's element j: small integers, exact in f32 sums.
float value(int r, size_t j) { return static_cast<float>(r + 1) + static_cast<float>(j % 7); }

struct Device {
  float* p = nullptr;
  explicit Device(size_t n) {  // zeros: no expected value is 0
    gpu::check_cuda(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)), "cudaMalloc");
    gpu::check_cuda(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(float)), "cudaMemset");
  }
  ~Device() { (void)cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  void put(const std::vector<float>& h) {
    gpu::check_cuda(cudaMemcpy(p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice),
                    "cudaMemcpy");
  }
};

// A rank's stream and the moves of its data on it: put() enqueues a 20 ms pause (a host function)
// and then the copy of `h` into device memory; get() enqueues the copy back and waits for the
// stream.  Pinned host memory, so that both are asynchronous.
class StreamIO {
 public:
  StreamIO() {
    gpu::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~StreamIO() {
    (void)cudaStreamSynchronize(s);
    for (void* p : pinned_) (void)cudaFreeHost(p);
    (void)cudaStreamDestroy(s);
  }
  StreamIO(const StreamIO&) = delete;
  StreamIO& operator=(const StreamIO&) = delete;
  void put(float* dev, const std::vector<float>& h) {
    float* p = pinned(h.size());
    std::copy(h.begin(), h.end(), p);
    gpu::check_cuda(cudaLaunchHostFunc(s, pause, nullptr), "cudaLaunchHostFunc");
    gpu::check_cuda(cudaMemcpyAsync(dev, p, h.size() * sizeof(float), cudaMemcpyHostToDevice, s),
                    "cudaMemcpyAsync");
  }
  std::vector<float> get(const float* dev, size_t n) {
    float* p = pinned(n);
    gpu::check_cuda(cudaMemcpyAsync(p, dev, n * sizeof(float), cudaMemcpyDeviceToHost, s),
                    "cudaMemcpyAsync");
    gpu::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    std::vector<float> h(p, p + n);
    for (void* q : pinned_) (void)cudaFreeHost(q);  // the stream is done with all of them
    pinned_.clear();
    return h;
  }
  cudaStream_t s = nullptr;

 private:
  static void CUDART_CB pause(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }
  float* pinned(size_t n) {
    void* p = nullptr;
    gpu::check_cuda(cudaMallocHost(&p, std::max<size_t>(n, 1) * sizeof(float)), "cudaMallocHost");
    pinned_.push_back(p);
    return static_cast<float*>(p);
  }
  std::vector<void*> pinned_;
};

void expect(const std::vector<float>& got, const std::function<float(size_t)>& want,
            const std::string& what) {
  for (size_t j = 0; j < got.size(); ++j)
    if (!(std::fabs(got[j] - want(j)) <= 1e-4f * std::fabs(want(j))))  // NaN fails too
      throw Error(what + " element " + std::to_string(j) + ": " + std::to_string(got[j]) +
                  ", want " + std::to_string(want(j)));
}

// Every collective on rank r of n, on `gpu`, with `count` elements per rank block; data moves on
// the rank's own stream (StreamIO).
void collectives(ProcessGroup& pg, int r, int n, int gpu_index, size_t count) {
  gpu::check_cuda(cudaSetDevice(gpu_index), "cudaSetDevice");
  StreamIO io;
  cudaStream_t s = io.s;
  size_t total = count * static_cast<size_t>(n);
  float sum_r = static_cast<float>(n * (n + 1) / 2);
  auto summed = [&](size_t j) { return sum_r + static_cast<float>(n) * static_cast<float>(j % 7); };
  std::vector<float> h(total);
  for (size_t j = 0; j < total; ++j) h[j] = value(r, j);
  std::vector<float> block(h.begin(), h.begin() + static_cast<long>(count));
  {
    Device d(total);
    io.put(d.p, h);
    pg.allreduce_device_sync(d.p, total, DType::F32, Op::Sum, s);
    expect(io.get(d.p, total), summed, "allreduce Sum");
    io.put(d.p, h);
    pg.allreduce_device(d.p, total, DType::F32, Op::Avg, s);
    pg.device_synchronize(s);
    expect(io.get(d.p, total), [&](size_t j) { return summed(j) / static_cast<float>(n); },
           "allreduce Avg");
    io.put(d.p, h);
    pg.allreduce_device(d.p, total, DType::F32, Op::Max, s);
    expect(io.get(d.p, total), [&](size_t j) { return value(n - 1, j); }, "allreduce Max");
  }
  {
    Device in(total), out(count);
    io.put(in.p, h);
    pg.reduce_scatter_device(in.p, out.p, count, DType::F32, Op::Sum, s);
    size_t base = static_cast<size_t>(r) * count;
    expect(io.get(out.p, count), [&](size_t j) { return summed(base + j); }, "reduce_scatter");
    io.put(out.p, std::vector<float>(count, -1.0f));
    io.put(in.p, h);
    pg.reduce_scatter_device(in.p, out.p, count, DType::F32, Op::Avg, s);
    expect(io.get(out.p, count),
           [&](size_t j) { return summed(base + j) / static_cast<float>(n); },
           "reduce_scatter Avg");
  }
  {
    Device in(count), out(total);
    io.put(in.p, block);
    pg.allgather_device(in.p, out.p, count, DType::F32, s);
    expect(io.get(out.p, total),
           [&](size_t j) { return value(static_cast<int>(j / count), j % count); }, "allgather");
    // In place: the input is this rank's block of the output.
    float* mine = out.p + static_cast<size_t>(r) * count;
    io.put(out.p, std::vector<float>(total, -1.0f));
    io.put(mine, block);
    pg.allgather_device(mine, out.p, count, DType::F32, s);
    expect(io.get(out.p, total),
           [&](size_t j) { return value(static_cast<int>(j / count), j % count); },
           "allgather in place");
  }
  {
    Device d(count);
    io.put(d.p, block);
    int root = n - 1;
    pg.broadcast_device(d.p, count, DType::F32, root, s);
    expect(io.get(d.p, count), [&](size_t j) { return value(root, j); }, "broadcast");
  }
}

int report(const char* what, const std::vector<std::string>& errors) {
  int bad = 0;
  for (const auto& e : errors)
    if (!e.empty()) {
      std::printf("  %s\n", e.c_str());
      ++bad;
    }
  std::printf("%s: %s\n", bad ? "FAIL" : "PASS", what);
  return bad ? 1 : 0;
}

int one_node(int gpus) {
  auto g = ProcessGroup::threads(gpus);
  return report("every device collective, one node, one rank per GPU (plain NCCL)",
                errors_of(g, [&](ProcessGroup& pg, int r) {
                  collectives(pg, r, gpus, r, (1 << 18) + 3);
                }));
}

int two_nodes_one_gpu(const char* pipeline_bytes) {
  if (pipeline_bytes) ::setenv("PYTORCH_DC_PIPELINE_BYTES", pipeline_bytes, 1);
  auto g = ProcessGroup::threads(2, {}, {0, 1});
  ::unsetenv("PYTORCH_DC_PIPELINE_BYTES");
  std::string what = std::string("every device collective, 2 simulated nodes on GPU 0, chunks of ") +
                     (pipeline_bytes ? pipeline_bytes : "the default size") + " bytes";
  return report(what.c_str(), errors_of(g, [&](ProcessGroup& pg, int r) {
                  collectives(pg, r, 2, 0, (1 << 20) + 5);
                }));
}

int stopped_rank() {
  Options o;
  o.timeout = 5;
  auto g = ProcessGroup::threads(2, o, {0, 1});
  auto t0 = std::chrono::steady_clock::now();
  double took = 0;
  auto errors = errors_of(g, [&](ProcessGroup& pg, int r) {
    gpu::check_cuda(cudaSetDevice(0), "cudaSetDevice");
    Device d(1 << 20);
    d.put(std::vector<float>(1 << 20, 1.0f));
    pg.allreduce_device_sync(d.p, 1 << 20, DType::F32, Op::Sum, nullptr);  // both: set-up
    if (r == 1) return;  // stops before the next collective
    pg.allreduce_device_sync(d.p, 1 << 20, DType::F32, Op::Sum, nullptr);
  });
  took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool ok = !errors[0].empty() && errors[1].empty() && took < 20;
  std::printf("%s: a rank that stops mid-job: rank 0 got \"%s\" after %.1f s (timeout 5 s)\n",
              ok ? "PASS" : "FAIL", errors[0].c_str(), took);
  return ok ? 0 : 1;
}

void pause_stream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// device_event_done, as a thread that watches GPU work sees it: false while the stream is held
// (a 300 ms host function before the allreduce), true once it is done; no wait in either.
int event_done() {
  auto g = ProcessGroup::threads(1);
  ProcessGroup& pg = *g[0];
  gpu::check_cuda(cudaSetDevice(0), "cudaSetDevice");
  std::string error;
  bool early = true;
  int polls = 0;
  double held = 0;
  try {
    StreamIO io;
    Device d(1 << 20);
    io.put(d.p, std::vector<float>(1 << 20, 1.0f));
    cudaEvent_t e;
    gpu::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    auto t0 = std::chrono::steady_clock::now();
    gpu::check_cuda(cudaLaunchHostFunc(io.s, pause_stream, nullptr), "cudaLaunchHostFunc");
    pg.allreduce_device(d.p, 1 << 20, DType::F32, Op::Sum, io.s);
    gpu::check_cuda(cudaEventRecord(e, io.s), "cudaEventRecord");
    early = pg.device_event_done(e);
    while (!pg.device_event_done(e) && ++polls < 1000000)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    held = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cudaEventDestroy(e);
  } catch (const std::exception& x) {
    error = x.what();
  }
  bool ok = error.empty() && !early && held >= 0.25 && held < 5;
  std::printf("%s: device_event_done: %s at once, done after %.3f s of a 300 ms hold (%d polls)%s%s\n",
              ok ? "PASS" : "FAIL", early ? "true" : "false", held, polls,
              error.empty() ? "" : ": ", error.c_str());
  return ok ? 0 : 1;
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
    int bad = one_node(p.devices);
    bad += two_nodes_one_gpu(nullptr);
    bad += two_nodes_one_gpu("4099");
    bad += stopped_rank();
    bad += event_done();
    return bad ? 1 : 0;
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
