// The two small interfaces that the hierarchical allreduce (hierarchical.cpp) is written against,
// so that one orchestration (pieces, shards, the chunk pipeline of the cross-node step, and their
// order) serves host memory and device memory alike:
//   IntraEngine  the level inside a node (or locality domain): reduce-scatter into shards, the
//                cross-node step on each owner's shard, allgather.  Host memory: the node's shm
//                engine (ShmIntra) or rings over the node's Comm (RingIntra), both here; device
//                memory: NCCL (gpu/levels.cpp).  NestedIntra makes one of two: the ranks of a
//                locality domain, then the "rails" across the domains of the node.
//   CopyEngine   moves one chunk of a shard to host memory for the wire and back.  Host memory:
//                MemcpyCopy, whose "copies" are in place (a shard in host memory goes on the wire
//                as it is); device memory: cudaMemcpyAsync on copy streams with events
//                (gpu/levels.cpp).
// The engines are made per call by whoever chooses the algorithm (collectives.cpp, gpu/); they
// borrow the Comms and the shm engine that ProcessGroup::Impl owns.  Threads: the thread that
// runs the group's call.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "dc/comm.hpp"
#include "dc/shm/engine.hpp"

namespace pytorch_exec::dc {

class IntraEngine {
 public:
  // The cross-node step, called by each owner on its reduced shard (count > 0).
  using Cross = std::function<void(void* shard, size_t count)>;
  virtual ~IntraEngine() = default;
  // In place over the level's ranks: `owners` (1 ... level size) ranks own a shard each (the
  // even blocks of `count`, in level-rank order); each owner's shard is reduced over the level,
  // handed to `cross` (may be empty: none) and, for Op::Avg, divided by `avg_divisor`; then every
  // rank gets every shard.  One operation rather than reduce-scatter + allgather because the
  // shm engine keeps the reduced shards in its shared slots from the one to the other.
  virtual void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                         int avg_divisor, const CallHeader& h, const Deadline& d) = 0;
};

// The node's shared memory (shm::AllreduceEngine rounds).
class ShmIntra final : public IntraEngine {
 public:
  explicit ShmIntra(shm::AllreduceEngine& e) : e_(e) {}
  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override {
    e_.allreduce(buf, count, t, op, owners, cross, avg_divisor, h, d);
  }

 private:
  shm::AllreduceEngine& e_;
};

// Rings over the node's Comm (a node of one rank, or tcp/mpi inside the node); local ranks from
// `owners` on own empty blocks.
class RingIntra final : public IntraEngine {
 public:
  explicit RingIntra(const Comm& local) : local_(local) {}
  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override;

 private:
  const Comm& local_;
};

// The level inside a node as two nested levels (the locality domains of topo::plan_gpu_levels):
// `domain` over the R ranks of this rank's domain (level rank: its place p in the domain), `rail`
// over the p-th ranks of the node's D domains (level rank: its domain's index).  The domain level
// reduce-scatters into shards owned by its first ranks; each owner takes its shard through the
// rail level, whose owners hand their part to `cross`; both then allgather.  The part of rail p
// owned by domain i has the same local rank, i*R + p, on every node whose domains are laid out
// alike (hierarchical.hpp: domain_levels), so that the cross-node Comm of that local rank joins
// its owners.  `owners` shards are asked for: min(D, owners) rails' parts, on the first
// owners / min(D, owners) rails (at least 1, at most R).  Op::Avg is the rail level's alone (the
// domain level sums): the divisor is applied once, whether an engine divides after the
// cross-node step (host) or pre-multiplies in its reduce (NCCL).
class NestedIntra final : public IntraEngine {
 public:
  NestedIntra(IntraEngine& domain, int per_domain, IntraEngine& rail, int domains)
      : domain_(domain), rail_(rail), per_domain_(per_domain), domains_(domains) {}
  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override;

 private:
  IntraEngine &domain_, &rail_;
  int per_domain_, domains_;
};

// Pipeline slots: chunk i uses slot i % kCopySlots, so that chunk i+1 (being copied to the
// host), chunk i (on the wire) and chunk i-1 (being copied back) each have their own.
constexpr int kCopySlots = 3;

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Before the first copy of a shard: the copies must see what the intra level wrote (device:
  // the copy streams wait for the compute stream).
  virtual void begin(const Deadline& d) = 0;
  // Host memory of `slot` for the `bytes` at `src` (the same pointer again for the copy back);
  // a host-memory engine returns `src` itself.
  virtual void* host(int slot, void* src, size_t bytes) = 0;
  // Enqueues the copy of `bytes` from `src` into `host` (slot's) / from `host` to `dst`; the
  // waits return when the slot's last such copy completed.  Throw Error or TimeoutError.
  virtual void to_host(int slot, void* host, const void* src, size_t bytes) = 0;
  virtual void wait_to_host(int slot, const Deadline& d) = 0;
  virtual void to_device(int slot, void* dst, const void* host, size_t bytes) = 0;
  virtual void wait_to_device(int slot, const Deadline& d) = 0;
  // After the last copy back was waited for: what runs next sees the shard (device: the
  // compute stream waits for the copy streams).
  virtual void end(const Deadline& d) = 0;
};

// Host memory: by default no staging, the chunk goes on the wire where it is; `staged` (when
// PYTORCH_DC_PIPELINE_BYTES asks for chunks) copies each chunk through buffers of its own, as a
// device engine does through pinned memory, so that the host runs the staged sequence too.  A
// memcpy is complete when it returns: the waits have nothing to do.
class MemcpyCopy final : public CopyEngine {
 public:
  explicit MemcpyCopy(bool staged = false) : staged_(staged) {}
  void begin(const Deadline&) override {}
  void* host(int slot, void* src, size_t bytes) override;
  void to_host(int slot, void* host, const void* src, size_t bytes) override;
  void wait_to_host(int, const Deadline&) override {}
  void to_device(int slot, void* dst, const void* host, size_t bytes) override;
  void wait_to_device(int, const Deadline&) override {}
  void end(const Deadline&) override {}

 private:
  bool staged_;
  std::vector<char> slots_[kCopySlots];
};

// How the cross-node step of one shard is cut into pipeline chunks: `chunk_bytes` per chunk
// (0: the whole shard is one chunk), never splitting an element; the same on every node, so
// that the owners of a shard make matching calls.
struct ChunkPlan {
  size_t chunk_elems = 0;  // elements per chunk (the last may be shorter)
  size_t chunks = 0;
  size_t first(size_t i) const { return i * chunk_elems; }
  size_t count(size_t i, size_t total) const {
    size_t f = first(i);
    return f + chunk_elems <= total ? chunk_elems : total - f;
  }
};
ChunkPlan plan_chunks(size_t count, size_t elem_bytes, size_t chunk_bytes);

// The wire step of one chunk in host memory: the allreduce across nodes of `count` elements.
using Wire = std::function<void(void* host, size_t count)>;

// The pipelined cross-node step of one shard (`count` elements of `elem_bytes` at `shard`):
// chunk i+1 is copied to the host while chunk i is on the wire and chunk i-1 is copied back; a
// chunk goes on the wire only after its copy to the host completed, and a slot is reused only
// after its previous chunk's copy back completed.
void pipelined_cross(CopyEngine& copy, const Wire& wire, void* shard, size_t count,
                     size_t elem_bytes, size_t chunk_bytes, const Deadline& d);

}  // namespace pytorch_exec::dc
