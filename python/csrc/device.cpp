// CUDA tensors in the dc backend: which devices a collective may use, and DeviceStage (see
// backend.hpp), the stream side of a collective on GPU tensors.  Compiled with CUDA only under
// PYTORCH_DC_CUDA (python/Makefile.am: torch has CUDA and libpytorch_dc has the GPU path);
// without it a GPU tensor is an error naming the collective.
//
// Stream semantics (those of ProcessGroupNCCL): the collective runs on the backend's stream of
// the GPU (one per GPU, from torch's pool), after an event recorded on the caller's current
// stream at issue; the Work's end event is recorded on the backend's stream after the last copy
// or kernel; wait() makes the caller's current stream wait for it.  The host waits in wait() only
// until the work is issued (by the caller's thread itself for a synchronous call with nothing
// queued before it, else by a worker: the DataChannel is used by one thread at a time, in issue
// order; for a host-staged collective that is until its host part is done, as gloo's CUDA
// path).  The backend's watcher thread then waits for the end event, bounded by the operation's
// timeout, checking the NCCL communicators meanwhile (DcBackend::watch); the callers and the
// workers do not wait for the GPU.
#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>

#include "backend.hpp"

#ifdef PYTORCH_DC_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#endif

namespace pytorch_dc {

bool cuda_support() {
#ifdef PYTORCH_DC_CUDA
  static const bool on = [] {
    const char* e = std::getenv("PYTORCH_DC_CUDA");
    return dc::ProcessGroup::has_gpu_path() && !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
#else
  return false;
#endif
}

at::Device device_of(const std::vector<at::Tensor>& ts, const char* what) {
  at::Device d = ts.empty() ? at::Device(at::kCPU) : ts[0].device();
  for (auto& t : ts)
    if (t.device() != d)
      throw std::invalid_argument(std::string("pytorch_dc: ") + what + ": tensors on " + d.str() +
                                  " and " + t.device().str() + " (all must be on one device)");
  return checked_device(d, what);
}

at::Device checked_device(at::Device d, const char* what) {
  if (d.is_cpu()) return d;
  if (!d.is_cuda())
    throw std::invalid_argument(std::string("pytorch_dc: ") + what + ": tensor on " + d.str() +
                                "; the dc backend takes CPU and CUDA tensors");
  if (!cuda_support())
    throw std::invalid_argument(
        std::string("pytorch_dc: ") + what + ": tensor on " + d.str() +
        ", but this dc backend takes CPU tensors only (" +
#ifdef PYTORCH_DC_CUDA
        "PYTORCH_DC_CUDA=0"
#else
        "built without CUDA: it needs a torch with CUDA and libpytorch_dc's GPU path"
#endif
        "); use e.g. \"cpu:dc,cuda:nccl\"");
  return d;
}

std::vector<at::Tensor> staged_in(DeviceStage* d, const std::vector<at::Tensor>& ts) {
  if (!d) return ts;
  std::vector<at::Tensor> r;
  for (auto& t : ts) r.push_back(d->in(t));
  return r;
}

std::vector<at::Tensor> staged_out(DeviceStage* d, const std::vector<at::Tensor>& ts) {
  if (!d) return ts;
  std::vector<at::Tensor> r;
  for (auto& t : ts) r.push_back(d->out(t));
  return r;
}

namespace {

// PYTORCH_DC_STAGE_CPU=1, for tests on machines without a GPU: collectives on CPU tensors go
// through the staging that GPU tensors take (each task works on other host tensors, copied in
// before and out after it, as the pinned ones of CudaStage), so that which tensors a collective
// reads and writes through its stage is tested where no GPU is.
class HostStage : public DeviceStage {
 public:
  at::Tensor in(const at::Tensor& t) override { return stage(t, true, false); }
  at::Tensor out(const at::Tensor& t) override { return stage(t, false, true); }
  at::Tensor inout(const at::Tensor& t) override { return stage(t, true, true); }
  at::Tensor native(const at::Tensor& t) override { return t; }
  void* stream() const override { return nullptr; }
  void* end_event() const override { return nullptr; }
  void begin(double, const std::atomic<bool>&) override {
    for (auto& [host, t] : copies_in_) host.copy_(t);
  }
  void end() override {
    for (auto& [host, t] : copies_out_) t.copy_(host);
  }
  void on_stream(const std::function<void()>& f) override { f(); }
  void block_current_stream() override {}
  bool query() override { return true; }

 private:
  at::Tensor stage(const at::Tensor& t, bool copy_in, bool copy_out) {
    at::Tensor h = at::empty(t.sizes(), t.options());
    if (h.numel()) h.view({-1}).view(at::kByte).fill_(0x5a);  // what is not written shows
    if (copy_in) copies_in_.emplace_back(h, t);
    if (copy_out) copies_out_.emplace_back(h, t);
    return h;
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_in_, copies_out_;  // (stage, tensor)
};

std::shared_ptr<DeviceStage> host_stage() {
  static const bool on = [] {
    const char* e = std::getenv("PYTORCH_DC_STAGE_CPU");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on ? std::make_shared<HostStage>() : nullptr;
}

}  // namespace

#ifndef PYTORCH_DC_CUDA

class DeviceStreams {};

std::shared_ptr<DeviceStreams> device_streams() { return nullptr; }

std::shared_ptr<DeviceStage> device_stage(const std::shared_ptr<DeviceStreams>&, at::Device d,
                                          const char* what) {
  if (!d.is_cpu())  // device_of said so already; a safety net
    throw std::invalid_argument(std::string("pytorch_dc: ") + what + ": no CUDA support");
  return host_stage();
}

#else

// One stream per GPU, taken from torch's pool at first use and kept: every collective of the
// backend on that GPU goes on it, in issue order.
class DeviceStreams {
 public:
  c10::cuda::CUDAStream get(c10::DeviceIndex i) {
    std::lock_guard<std::mutex> l(m_);
    auto it = streams_.find(i);
    if (it == streams_.end())
      it = streams_.emplace(i, c10::cuda::getStreamFromPool(false, i)).first;
    return it->second;
  }

 private:
  std::mutex m_;
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams_;
};

std::shared_ptr<DeviceStreams> device_streams() { return std::make_shared<DeviceStreams>(); }

namespace {

// A CUDA event of the stages, taken from a pool of its GPU and given back when the stage goes:
// a collective records two, and creating and destroying them cost microseconds per call
// (ProcessGroupNCCL caches its events too).  Reuse is safe once the stage is gone: a stream that
// waits for an event waits for the record made before the wait was enqueued, not a later one.
// The pools are never freed (a stage may go while the process exits).
class PooledEvent {
 public:
  explicit PooledEvent(c10::DeviceIndex d) : device_(d) {
    std::lock_guard<std::mutex> l(pools_m());
    auto& pool = pools()[d];
    if (!pool.empty()) {
      e_ = std::move(pool.back());
      pool.pop_back();
    } else {
      e_ = std::make_unique<at::cuda::CUDAEvent>();
    }
  }
  ~PooledEvent() {
    std::lock_guard<std::mutex> l(pools_m());
    pools()[device_].push_back(std::move(e_));
  }
  PooledEvent(const PooledEvent&) = delete;
  PooledEvent& operator=(const PooledEvent&) = delete;
  at::cuda::CUDAEvent* operator->() const { return e_.get(); }

 private:
  using Pools = std::map<c10::DeviceIndex, std::vector<std::unique_ptr<at::cuda::CUDAEvent>>>;
  static std::mutex& pools_m() {
    static auto* m = new std::mutex;
    return *m;
  }
  static Pools& pools() {
    static auto* p = new Pools;
    return *p;
  }
  c10::DeviceIndex device_;
  std::unique_ptr<at::cuda::CUDAEvent> e_;
};

class CudaStage : public DeviceStage {
 public:
  CudaStage(c10::cuda::CUDAStream stream, at::Device d, const char* what)
      : device_(d), stream_(stream), what_(what), ready_(d.index()), end_(d.index()) {
    c10::cuda::CUDAGuard g(d);
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(d.index());
    // The collective runs on the backend's own stream (maybe later, on a worker): nothing a
    // graph being captured could hold.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(current.stream(), &status) != cudaSuccess ||
        status != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      throw std::invalid_argument(std::string("pytorch_dc: ") + what +
                                  ": the current stream is being captured into a CUDA graph; "
                                  "the dc backend's collectives cannot be captured");
    }
    ready_->record(current);
  }

  at::Tensor in(const at::Tensor& t) override { return stage(t, true, false); }
  at::Tensor out(const at::Tensor& t) override { return stage(t, false, true); }
  at::Tensor inout(const at::Tensor& t) override { return stage(t, true, true); }
  at::Tensor native(const at::Tensor& t) override {
    keep(t);
    return t;
  }
  void* stream() const override { return stream_.stream(); }
  void* end_event() const override { return recorded_ ? end_->event() : nullptr; }

  void begin(double timeout, const std::atomic<bool>& failed) override {
    c10::cuda::CUDAGuard g(device_);
    c10::cuda::CUDAStreamGuard s(stream_);
    ready_->block(stream_);
    if (copies_in_.empty()) return;
    for (auto& [host, dev] : copies_in_) host.copy_(dev, /*non_blocking=*/true);
    PooledEvent staged(device_.index());
    staged->record(stream_);
    // The host collective reads the copies: wait for them, bounded (they follow the caller's
    // pending work on its stream).
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::microseconds(static_cast<int64_t>(timeout * 1e6));
    while (!staged->query()) {
      if (failed.load())
        throw std::runtime_error(std::string(what_) + ": an earlier collective's GPU work failed");
      if (timeout >= 0 && std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(std::string(what_) + ": the copies of its GPU tensors to the " +
                                 "host did not finish within the timeout (" +
                                 std::to_string(timeout) + " s)");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void end() override {
    c10::cuda::CUDAGuard g(device_);
    c10::cuda::CUDAStreamGuard s(stream_);
    for (auto& [host, dev] : copies_out_) dev.copy_(host, /*non_blocking=*/true);
    end_->record(stream_);
    recorded_ = true;
    // Not kept with the Work: torch's pinned-memory allocator reuses a host buffer only after
    // the copies enqueued from it, and the GPU tensors were recordStream()ed.
    copies_in_.clear();
    copies_out_.clear();
  }

  void on_stream(const std::function<void()>& f) override {
    c10::cuda::CUDAGuard g(device_);
    c10::cuda::CUDAStreamGuard s(stream_);
    f();
  }

  void block_current_stream() override {
    // Not issued (the collective failed before its end): nothing of it on the stream to wait for.
    if (!recorded_) return;
    c10::cuda::CUDAGuard g(device_);
    end_->block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }

  // Not recorded: the collective failed before its end (nothing of it on the stream), or has
  // not run yet (then the Work is not completed either).
  bool query() override { return !recorded_ || end_->query(); }

 private:
  // A pinned host tensor of `t`'s size and dtype, to be filled from `t` and/or copied back to it.
  at::Tensor stage(const at::Tensor& t, bool copy_in, bool copy_out) {
    keep(t);
    at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    if (copy_in) copies_in_.emplace_back(h, t);
    if (copy_out) copies_out_.emplace_back(h, t);
    return h;
  }
  // The caching allocator frees `t`'s memory for reuse only once the backend's stream is done.
  void keep(const at::Tensor& t) {
    if (t.numel() && t.storage().data_ptr())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
  }

  at::Device device_;
  c10::cuda::CUDAStream stream_;
  const char* what_;
  PooledEvent ready_, end_;
  std::atomic<bool> recorded_{false};
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_in_, copies_out_;  // (host, GPU)
};

}  // namespace

std::shared_ptr<DeviceStage> device_stage(const std::shared_ptr<DeviceStreams>& streams,
                                          at::Device d, const char* what) {
  if (d.is_cpu()) return host_stage();
  return std::make_shared<CudaStage>(streams->get(d.index()), d, what);
}

#endif

}  // namespace pytorch_dc
