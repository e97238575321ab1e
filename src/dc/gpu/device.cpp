// ProcessGroup's device-memory calls (the GPU path).
//   One node: one NCCL communicator of the whole group (plain NCCL), made at the first call on
//   the device current then (rank 0's ncclUniqueId broadcast over the group's host transports).
//   Several nodes: the shared hierarchical orchestration (dc/hierarchical.hpp) with NcclIntra on
//   a communicator of the node's ranks (ncclCommInitRank; each node's first rank makes the id,
//   the ids are allgathered over the host transports) and CudaCopy: each local rank owns a shard,
//   which goes across nodes over the group's host ring (tcp or mpi) through pinned buffers in
//   pipeline chunks.
//   Several nodes whose ranks are in more than one locality domain (PYTORCH_EXEC_DOMAIN), every
//   node laid out alike (dc::domain_levels): the levels of topo::plan_gpu_levels, as a
//   NestedIntra of two NcclIntra: level 1 on a communicator of this rank's domain, level 2 on
//   one of its rail (the p-th rank of every domain of the node), both ncclCommSplit from the
//   node's communicator (color: the domain's index, resp. the rail; key: the local rank): the
//   node's ranks are the parent's already, so no id goes over the host transports and no rank
//   outside the node is involved.  Level 3 as above: shard s is owned by local rank
//   (s % D) * R + s / D on every node, whose cross-node ring joins them.  Other layouts keep the
//   node's one communicator.  The rail level is not yet told apart by whether its GPUs reach
//   each other without a SYS path (the plan's shm alternative): it is always NCCL.
// Communicators and the copy engine are cached in the group; a communicator is aborted on any
// error or timeout, after which the calls throw; an error in a call across nodes aborts all of
// the group's communicators.  reduce_scatter, allgather and broadcast across nodes whose ranks
// are as many on every node and go node by node: the shared orchestration
// (hierarchical_reduce_scatter, hierarchical_allgather, hierarchical_broadcast) with NcclIntra on
// the node's communicator, CudaCopy, and a stream-ordered work buffer.  Otherwise: allreduces of
// a stream-ordered scratch buffer (Sum; zeros where a rank has nothing): correct, at about twice
// the traffic of dedicated algorithms.
// Has run on one GPU (tests/gpu: one rank, and two simulated nodes sharing it).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "dc/gpu/levels.hpp"
#include "dc/gpu/nccl_comm.hpp"
#include "dc/gpu/status.hpp"
#include "dc/group.hpp"
#include "dc/hierarchical.hpp"

namespace pytorch_exec::dc {

namespace gpu {

struct DeviceState {
  // First, so that it goes last: its pinned memory is freed with cudaFreeHost, which waits for
  // the whole device, and the communicators' abort (their destructors) must cut off NCCL work
  // stuck on a dead peer first.
  std::unique_ptr<CudaCopy> copy;  // several nodes: the cross-node step's copies
  std::unique_ptr<NcclComm> comm;  // one node: the whole group; several: this node's ranks
  DomainLevels levels;             // several nodes: whether the domains are levels (nested)
  std::unique_ptr<NcclComm> domain, rail;  // nested: levels 1 and 2, split from `comm`
  // The communicators made, the node's first.
  NcclComms all() const {
    NcclComms v;
    for (auto* c : {comm.get(), domain.get(), rail.get()})
      if (c) v.push_back(c);
    return v;
  }
};

}  // namespace gpu

namespace {

// PYTORCH_DC_PIPELINE_BYTES unset: chunks of 4 MiB for device memory (enough to keep PCIe and the
// wire busy, small enough that three slots of pinned memory stay cheap).
constexpr size_t kDevicePipelineBytes = 4 << 20;

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

// One Error on this rank, before anything is enqueued or exchanged, when `stream` is being
// captured into a CUDA graph: a call across nodes waits on the host for its copies, which a
// graph being captured never runs, and the waits of every call query the stream (an error during
// capture).
void require_not_capturing(const char* call, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  gpu::check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone)
    throw Error(std::string(call) +
                ": the stream is being captured into a CUDA graph; DataChannel's device calls "
                "cannot be captured");
}

// The group's communicator (of the node's ranks when the group spans nodes), made collectively
// at the first call, with the domain and rail levels split from it where they nest.
gpu::NcclComm& device_comm(ProcessGroup& pg, ProcessGroup::Impl& g, const char* call,
                           cudaStream_t stream, double timeout) {
  require_gpu(call);
  require_not_capturing(call, stream);
  int dev = -1;
  gpu::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (g.gpu && g.gpu->comm) {
    for (gpu::NcclComm* c : g.gpu->all())
      if (c->aborted())
        throw Error(std::string(call) +
                    ": the group's NCCL communicator was aborted after an error");
    if (g.gpu->comm->device() != dev)
      throw Error(std::string(call) + ": the group's NCCL communicator is on GPU " +
                  std::to_string(g.gpu->comm->device()) + ", the current device is GPU " +
                  std::to_string(dev));
    return *g.gpu->comm;
  }
  auto state = std::make_shared<gpu::DeviceState>();
  Deadline d = g.deadline(timeout, std::string(call) + ": NCCL communicator set-up");
  ncclUniqueId id{};
  if (g.nodes == 1) {
    if (g.rank == 0) gpu::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    pg.broadcast(&id, sizeof id, DType::U8, 0, timeout);
    state->comm = std::make_unique<gpu::NcclComm>(g.rank, g.size, id, d);
  } else {
    // One id per node, from its first rank; the others' entries are ignored.
    if (g.local_rank == 0) gpu::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<ncclUniqueId> ids(static_cast<size_t>(g.size));
    pg.allgather(&id, ids.data(), sizeof id, DType::U8, timeout);
    size_t first = static_cast<size_t>(
        std::find(g.node_of.begin(), g.node_of.end(), g.node) - g.node_of.begin());
    state->comm = std::make_unique<gpu::NcclComm>(g.local_rank, g.local_size, ids[first], d);
    state->levels = domain_levels(g.node_of, g.domain_of, g.rank);
    const DomainLevels& l = state->levels;
    if (l.nested) {
      state->domain = std::make_unique<gpu::NcclComm>(*state->comm, l.domain, g.local_rank, l.rail,
                                                      l.per_domain, d);
      state->rail = std::make_unique<gpu::NcclComm>(*state->comm, l.rail, g.local_rank, l.domain,
                                                    l.domains, d);
    }
    state->copy = std::make_unique<gpu::CudaCopy>();
  }
  g.gpu = state;
  return *state->comm;
}

Deadline call_deadline(ProcessGroup::Impl& g, double timeout, const char* call, size_t count,
                       DType t, Op op) {
  return Deadline::call(g.seconds(timeout), call, count, static_cast<int>(t),
                        static_cast<int>(op));
}

// The in-place allreduce of `call`: enqueued on `stream` on one node; across nodes the
// hierarchical orchestration, which returns when the cross-node step is done and the rest is
// enqueued.  `user_allreduce`: the caller's allreduce, whose f32 may go across nodes as bf16
// (PYTORCH_DC_BF16_WIRE); not an allreduce that stands in for another collective, whose data
// moves exactly.
void device_allreduce(ProcessGroup& pg, ProcessGroup::Impl& g, const char* call, void* buf,
                      size_t count, DType t, Op op, void* stream, double timeout,
                      bool user_allreduce = false) {
  auto s = static_cast<cudaStream_t>(stream);
  gpu::NcclComm& c = device_comm(pg, g, call, s, timeout);
  Deadline d = call_deadline(g, timeout, call, count, t, op);
  if (g.nodes == 1) {
    c.allreduce(buf, count, t, op, s, d);
    return;
  }
  if (op == Op::Avg) gpu::require_avg(t, call);
  auto h = make_header(Kind::Allreduce, count, t, op, ++g.seq);
  gpu::DeviceState& st = *g.gpu;
  const DomainLevels& l = st.levels;
  gpu::NcclIntra node(c, g.local_rank, g.local_size, s);
  std::optional<gpu::NcclIntra> domain, rail;
  std::optional<NestedIntra> nested;
  IntraEngine* intra = &node;
  if (l.nested) {
    domain.emplace(*st.domain, l.rail, l.per_domain, s);
    rail.emplace(*st.rail, l.domain, l.domains, s);
    intra = &nested.emplace(*domain, l.per_domain, *rail, l.domains);
  }
  size_t chunk = g.s.pipeline_bytes > 0 ? g.s.pipeline_bytes : kDevicePipelineBytes;
  st.copy->use(s, st.all(), chunk);
  CrossOptions o{g.s.small_bytes, user_allreduce && g.s.bf16_wire};
  NodeLevels levels{g.cross_c,
                    *intra,
                    *g.gpu->copy,
                    g.min_local,
                    std::numeric_limits<size_t>::max(),  // NCCL has no slot: one piece
                    g.size,
                    chunk};
  try {
    g.run_guarded(d, [&] { hierarchical_allreduce(levels, buf, count, t, op, h, d, o); });
  } catch (const std::exception& e) {
    // The node's other ranks may wait in a level whose collective this rank will not join; the
    // copies still on the copy streams must end before the user's stream frees or reuses what
    // they read and write.
    gpu::abort(st.all(), e.what());
    st.copy->join_user();
    throw;
  }
}

// A stream-ordered scratch buffer of `bytes`: free() frees it on the stream, checked; after an
// error the destructor does, ignoring the status (a destructor must not throw).
struct Scratch {
  void* p = nullptr;
  cudaStream_t s;
  Scratch(size_t bytes, cudaStream_t stream) : s(stream) {
    gpu::check_cuda(cudaMallocAsync(&p, std::max<size_t>(bytes, 1), s), "cudaMallocAsync");
  }
  void free() {
    void* q = p;
    p = nullptr;
    gpu::check_cuda(cudaFreeAsync(q, s), "cudaFreeAsync");
  }
  ~Scratch() {
    if (p) (void)cudaFreeAsync(p, s);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

void copy_d2d(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes == 0 || dst == src) return;
  gpu::check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s),
                  "cudaMemcpyAsync (device to device)");
}

// A reduce_scatter, allgather or broadcast across nodes whose ranks are node_major, by the shared
// orchestration on `s`: `run` gets the levels (NcclIntra on the node's communicator, CudaCopy)
// and a stream-ordered work buffer of `work_bytes` (0: none, nullptr).  An error aborts the
// group's communicators: the node's other ranks may wait in a level this rank will not join.
void device_blocks(ProcessGroup::Impl& g, cudaStream_t s, size_t work_bytes, const Deadline& d,
                   const std::function<void(const BlockLevels&, void* work)>& run) {
  gpu::DeviceState& st = *g.gpu;
  gpu::NcclIntra node(*st.comm, g.local_rank, g.local_size, s);
  size_t chunk = g.s.pipeline_bytes > 0 ? g.s.pipeline_bytes : kDevicePipelineBytes;
  st.copy->use(s, st.all(), chunk);
  BlockLevels levels{g.cross_c, node, g.local_rank, g.local_size, *st.copy, g.size, chunk};
  // Only reduce_scatter needs one; freed on `s` after the copy streams' work (below).
  std::optional<Scratch> work;
  if (work_bytes > 0) work.emplace(work_bytes, s);
  try {
    g.run_guarded(d, [&] { run(levels, work ? work->p : nullptr); });
  } catch (const std::exception& e) {
    gpu::abort(st.all(), e.what());
    st.copy->join_user();
    throw;
  }
  if (work) work->free();
}

}  // namespace

bool ProcessGroup::has_gpu_path() { return true; }

void ProcessGroup::allreduce_device(void* buf, size_t count, DType t, Op op, void* stream,
                                    double timeout) {
  device_allreduce(*this, *impl_, "allreduce_device", buf, count, t, op, stream, timeout, true);
}

void ProcessGroup::allreduce_device_sync(void* buf, size_t count, DType t, Op op, void* stream,
                                         double timeout) {
  const char* call = "allreduce_device_sync";
  device_allreduce(*this, *impl_, call, buf, count, t, op, stream, timeout, true);
  gpu::wait(static_cast<cudaStream_t>(stream), impl_->gpu->all(),
            call_deadline(*impl_, timeout, call, count, t, op));
}

void ProcessGroup::reduce_scatter_device(const void* in, void* out, size_t count, DType t, Op op,
                                         void* stream, double timeout) {
  const char* call = "reduce_scatter_device";
  Impl& g = *impl_;
  auto s = static_cast<cudaStream_t>(stream);
  gpu::NcclComm& c = device_comm(*this, g, call, s, timeout);
  if (g.nodes == 1) {
    c.reduce_scatter(in, out, count, t, op, s, call_deadline(g, timeout, call, count, t, op));
    return;
  }
  size_t es = dtype_size(t), total = count * static_cast<size_t>(g.size);
  if (g.node_major) {
    if (op == Op::Avg) gpu::require_avg(t, call);
    Deadline d = call_deadline(g, timeout, call, count, t, op);
    auto h = make_header(Kind::ReduceScatter, count, t, op, ++g.seq);
    device_blocks(g, s, count * es * static_cast<size_t>(g.nodes), d, [&](const BlockLevels& levels, void* work) {
      hierarchical_reduce_scatter(levels, in, work, out, count, t, op, h, d);
    });
    return;
  }
  Scratch tmp(total * es, s);
  copy_d2d(tmp.p, in, total * es, s);
  device_allreduce(*this, g, call, tmp.p, total, t, op, stream, timeout);
  copy_d2d(out, static_cast<char*>(tmp.p) + static_cast<size_t>(g.rank) * count * es, count * es,
           s);
  tmp.free();
}

void ProcessGroup::allgather_device(const void* in, void* out, size_t count, DType t,
                                    void* stream, double timeout) {
  const char* call = "allgather_device";
  Impl& g = *impl_;
  auto s = static_cast<cudaStream_t>(stream);
  gpu::NcclComm& c = device_comm(*this, g, call, s, timeout);
  if (g.nodes == 1) {
    c.allgather(in, out, count, t, s, call_deadline(g, timeout, call, count, t, Op::Sum));
    return;
  }
  size_t es = dtype_size(t), total = count * static_cast<size_t>(g.size);
  if (g.node_major) {
    Deadline d = call_deadline(g, timeout, call, count, t, Op::Sum);
    auto h = make_header(Kind::Allgather, count, t, Op::Sum, ++g.seq);
    device_blocks(g, s, 0, d, [&](const BlockLevels& levels, void*) {
      hierarchical_allgather(levels, in, out, count, t, h, d);
    });
    return;
  }
  // Zeros everywhere but this rank's block, then a sum: every block is its owner's.
  char* mine = static_cast<char*>(out) + static_cast<size_t>(g.rank) * count * es;
  Scratch keep(count * es, s);  // `in` may alias this rank's block of `out`
  copy_d2d(keep.p, in, count * es, s);
  gpu::check_cuda(cudaMemsetAsync(out, 0, total * es, s), "cudaMemsetAsync");
  copy_d2d(mine, keep.p, count * es, s);
  keep.free();
  device_allreduce(*this, g, call, out, total, t, Op::Sum, stream, timeout);
}

void ProcessGroup::broadcast_device(void* buf, size_t count, DType t, int root, void* stream,
                                    double timeout) {
  const char* call = "broadcast_device";
  Impl& g = *impl_;
  if (root < 0 || root >= g.size)
    throw Error(std::string(call) + ": root " + std::to_string(root) + " is not a rank of the " +
                std::to_string(g.size) + "-rank group");
  auto s = static_cast<cudaStream_t>(stream);
  gpu::NcclComm& c = device_comm(*this, g, call, s, timeout);
  if (g.nodes == 1) {
    c.broadcast(buf, count, t, root, s, call_deadline(g, timeout, call, count, t, Op::Sum));
    return;
  }
  if (g.node_major) {
    Deadline d = call_deadline(g, timeout, call, count, t, Op::Sum);
    auto h = make_header(Kind::Broadcast, count, t, Op::Sum, ++g.seq, root);
    device_blocks(g, s, 0, d, [&](const BlockLevels& levels, void*) {
      hierarchical_broadcast(levels, buf, count * dtype_size(t), root / g.local_size,
                             root % g.local_size, h, d);
    });
    return;
  }
  if (g.rank != root)
    gpu::check_cuda(cudaMemsetAsync(buf, 0, count * dtype_size(t), s), "cudaMemsetAsync");
  device_allreduce(*this, g, call, buf, count, t, Op::Sum, stream, timeout);
}

namespace {

// The communicators of the group's device calls (what a wait watches); throws naming `call`
// before the first such call, or without an event to wait for.
gpu::NcclComms device_comms(ProcessGroup::Impl& g, const char* call, bool event = true) {
  if (!g.gpu || !g.gpu->comm)
    throw Error(std::string(call) + ": no device-memory call has been made on this group");
  if (!event) throw Error(std::string(call) + ": no event");
  return g.gpu->all();
}

}  // namespace

void ProcessGroup::device_synchronize(void* stream, double timeout) {
  const char* call = "device_synchronize";
  Impl& g = *impl_;
  gpu::NcclComms cs = device_comms(g, call);
  auto s = static_cast<cudaStream_t>(stream);
  require_not_capturing(call, s);
  gpu::wait(s, cs, Deadline::after(g.seconds(timeout), call));
}

void ProcessGroup::device_wait_event(void* event, double timeout) {
  const char* call = "device_wait_event";
  Impl& g = *impl_;
  gpu::wait(static_cast<cudaEvent_t>(event), device_comms(g, call, event != nullptr),
            Deadline::after(g.seconds(timeout), call));
}

bool ProcessGroup::device_event_done(void* event) {
  return gpu::done(static_cast<cudaEvent_t>(event),
                   device_comms(*impl_, "device_event_done", event != nullptr));
}

}  // namespace pytorch_exec::dc
