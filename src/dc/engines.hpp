// The small interfaces that the hierarchical collectives (hierarchical.cpp) are written against,
// so that one orchestration (pieces, shards, the chunk pipeline of the cross-node step, and their
// order) serves host memory and device memory alike:
//   IntraEngine  the level inside a node (or locality domain): reduce-scatter into shards, the
//                cross-node step on each owner's shard, allgather.  Host memory: the node's shm
//                engine (ShmIntra) or rings over the node's Comm (RingIntra), both here; device
//                memory: NCCL (gpu/levels.cpp).  NestedIntra makes one of two: the ranks of a
//                locality domain, then the "rails" across the domains of the node.
//   IntraBlocks  the same level for reduce-scatter, allgather and broadcast (host: shm engine
//                rounds or rings and trees; device: ncclReduceScatter, ncclAllGather,
//                ncclBroadcast).
//   CopyEngine   moves one chunk of a shard to host memory for the wire and back.  Host memory:
//                MemcpyCopy, whose "copies" are in place (a shard in host memory goes on the wire
//                as it is); device memory: cudaMemcpyAsync on copy streams with events
//                (gpu/levels.cpp).
// The engines are made per call by whoever chooses the algorithm (collectives.cpp, gpu/); they
// borrow the Comms and the shm engine that ProcessGroup::Impl owns.  Threads: the thread that
// runs the group's call, or the lane's thread that runs its slice (one lane's Comms and shm
// lane).
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

// The level inside a node for reduce-scatter, allgather and broadcast (hierarchical_reduce_scatter,
// hierarchical_allgather, hierarchical_broadcast); for the first two: a buffer of `groups` groups (one per node) of one block of `block`
// elements per rank of the level, in level-rank order; a rank's own blocks are its block of each
// group, `groups` * `block` elements side by side.
class IntraBlocks {
 public:
  virtual ~IntraBlocks() = default;
  // `out` gets this rank's own blocks, each reduced over the level (`out` may be `in` only on one
  // group, at this rank's place).  Op::Avg: returns true when the engine divided every
  // contribution by `avg_divisor` (the sum across nodes is then the average), false when it
  // summed (the caller divides the final result).
  virtual bool reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t,
                              Op op, int avg_divisor, const CallHeader& h, const Deadline& d) = 0;
  // `in`: this rank's own blocks (nullptr: they are in their places in `out` already);
  // afterwards every group of `out` holds every rank's block (`in` may be this rank's place in
  // `out` only on one group).
  virtual void allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                         const CallHeader& h, const Deadline& d) = 0;
  // In place: `bytes` at `buf` of level rank `root` to every rank of the level.
  virtual void broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                         const Deadline& d) = 0;
};

// The node's shared memory (shm::AllreduceEngine rounds).
class ShmIntra final : public IntraEngine, public IntraBlocks {
 public:
  explicit ShmIntra(shm::AllreduceEngine& e) : e_(e) {}
  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override {
    e_.allreduce(buf, count, t, op, owners, cross, avg_divisor, h, d);
  }
  bool reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t, Op op,
                      int avg_divisor, const CallHeader& h, const Deadline& d) override {
    e_.reduce_scatter(in, out, block, groups, t, op == Op::Avg ? Op::Sum : op, avg_divisor, h, d);
    return false;
  }
  void allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                 const CallHeader& h, const Deadline& d) override {
    e_.allgather(in, out, block, groups, t, h, d);
  }
  void broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                 const Deadline& d) override {
    e_.broadcast(buf, bytes, root, h, d);
  }

 private:
  shm::AllreduceEngine& e_;
};

// Rings over the node's Comm (a node of one rank, or tcp/mpi inside the node); local ranks from
// `owners` on own empty blocks.
class RingIntra final : public IntraEngine, public IntraBlocks {
 public:
  explicit RingIntra(const Comm& local) : local_(local) {}
  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override;
  // One ring per group; reduce_scatter on a copy of the group (the ring works in place).
  bool reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t, Op op,
                      int avg_divisor, const CallHeader& h, const Deadline& d) override;
  void allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                 const CallHeader& h, const Deadline& d) override;
  void broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                 const Deadline& d) override;

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
  // a host-memory engine that does not stage returns `src` itself where there is one (not
  // nullptr).
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

// The chunk pipeline of a cross-node step, in general: chunk i of `chunks` takes `bytes(i)` of
// host memory; `up` enqueues its copies into that memory (CopyEngine::to_host, on the slot it
// is given), `wire` runs it across nodes, `down` enqueues its copies back (to_device).  `place`:
// memory that a host-memory engine that does not stage may use as chunk i's host memory as it
// is (nullptr: none; then it stages).
struct ChunkSteps {
  size_t chunks = 0;
  std::function<size_t(size_t i)> bytes;
  std::function<void*(size_t i)> place;
  std::function<void(size_t i, int slot, char* host)> up, down;
  std::function<void(size_t i, char* host)> wire;
};
// Chunk i+1 is copied to the host while chunk i is on the wire and chunk i-1 is copied back; a
// chunk goes on the wire only after its copies to the host completed, and a slot is reused only
// after its previous chunk's copies back completed.
void pipelined_steps(CopyEngine& copy, const ChunkSteps& s, const Deadline& d);

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

// The pipelined cross-node step of one shard of an allreduce (`count` elements of `elem_bytes`
// at `shard`), in place: pipelined_steps with one copy up and one back per chunk.
void pipelined_cross(CopyEngine& copy, const Wire& wire, void* shard, size_t count,
                     size_t elem_bytes, size_t chunk_bytes, const Deadline& d);

}  // namespace pytorch_exec::dc
