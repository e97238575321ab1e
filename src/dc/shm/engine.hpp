// The shm allreduce engine: allreduce, reduce-scatter, allgather and broadcast among the ranks
// of one node through POSIX shared memory, with no copy through the kernel.  Not a Transport (it
// moves no bytes between two ranks): a group whose intra-node level is "shm" runs these
// collectives here and its other operations over the inter-node transport.  One segment per
// (group, node) holds, for each local rank, two slots (used in alternate rounds) and a few
// sequence counters on their own cache lines.
//
// A round: every local rank copies its piece of the buffer into its slot and bumps `in`; each
// shard owner (local ranks 0 .. owners-1) reduces its shard of all slots into its own slot,
// optionally hands the shard to `cross` (the inter-node step of a hierarchical allreduce) and
// bumps `out`; everyone copies the owners' shards back and bumps `read`.  Pieces are at most
// the slot size (PYTORCH_DC_SHM_BYTES), so any count works.  After a cross-node step, an owner
// writes its whole reduced shard straight into the other local ranks' buffers instead of its
// slot (process_vm_writev, once it has checked that each pid is that rank): one copy instead of
// two: 8% off a 64 MiB allreduce of two simulated nodes of two ranks on two cores (median of 9
// runs each).  Where the system does not allow it (another PID namespace, a seccomp policy),
// through the slot.
//
// Lanes: a node whose ranks have processors to spare (PYTORCH_DC_SHM_THREADS, else local rank
// 0's processors shared among the processes of the machine, at most 4) keeps that many
// segments; an allreduce of at least 1 MiB per lane, without a cross-node step, is cut in as many
// slices, each run by one thread of every local rank through its own segment (the calling thread
// and helpers).  A single core copies memory at a fraction of what the machine can, so large
// allreduces are bound by one core per rank otherwise.  Across nodes the group cuts the slices
// itself and runs a hierarchical allreduce per lane (lane() and run_lanes(): collectives.cpp),
// each lane across nodes over connections of its own.  Every other operation uses lane 0.
//
// Waiting spins briefly, then yields, then sleeps in short steps; a local rank that died or
// aborted turns the wait into an Error, and the deadline into a TimeoutError.  A rank has died
// when the lock that it holds on its byte of the segment (an open-file-description lock, which
// the kernel drops at its end) is gone, in any PID namespace that shares /dev/shm, or, in this
// process's PID namespace, when its pid is gone.
//
// Threads: one thread per local rank uses its AllreduceEngine (its helpers are its own).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dc/comm.hpp"
#include "dc/transport.hpp"

namespace pytorch_exec::dc::shm {

// A node has at most this many lanes.
inline constexpr int kMaxLanes = 16;

class AllreduceEngine {
 public:
  // All `local_size` ranks of the node call this together; `local_barrier` synchronizes them
  // (twice: the segments exist; everyone has them mapped, so local rank 0 unlinks them).  `key`
  // names the segments uniquely among the jobs of this machine and the groups of this job.
  // `lanes` (>= 1): local rank 0's is the node's.  The slot is `slot_bytes` (at least a page),
  // or smaller where /dev/shm has no room for it (local rank 0 reserves lane 0's pages at once,
  // halving the slot until they fit, and says so on stderr; see slot()).  Throws Error, also
  // where /dev/shm has no room for the smallest.
  // `ranks`: the group rank of each local rank, for errors that name one (empty: as local).
  static std::unique_ptr<AllreduceEngine> create(const std::function<void()>& local_barrier,
                                                 const std::string& key, int local_rank,
                                                 int local_size, size_t slot_bytes, int lanes,
                                                 std::vector<int> ranks = {});
  virtual ~AllreduceEngine() = default;

  // The inter-node step: called by each owner on its reduced shard (in shared memory).
  using Cross = std::function<void(void* shard, size_t count)>;

  // In place.  `owners` local ranks own a shard each (1 ... local_size).  Avg is reduced as a
  // sum and divided by `avg_divisor` (the number of contributions, across nodes too).
  // Owners compare every rank's call header `h` (mismatched calls raise Error).
  virtual void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                         int avg_divisor, const CallHeader& h, const Deadline& d) = 0;
  // Reduce-scatter and allgather over `groups` groups of one block of `block` elements per
  // local rank (in local-rank order); this rank's own blocks are its block of each group, side
  // by side (dc::IntraBlocks).  reduce_scatter: `out` gets this rank's own blocks, reduced over
  // the node (Avg: as allreduce; `out` may be `in` only on one group, at this rank's place); a
  // round: every rank copies its pieces of the others' blocks into its slot and reduces its own
  // straight into `out` (no owners, no copy back).  allgather: `in` holds this rank's own
  // blocks (nullptr: they are in their places in `out`); afterwards every group of `out` holds every rank's block; a round: every rank copies
  // a piece of its blocks into its slot, everyone copies the others' pieces out.
  virtual void reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t,
                              Op op, int avg_divisor, const CallHeader& h, const Deadline& d) = 0;
  virtual void allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                         const CallHeader& h, const Deadline& d) = 0;
  // In place: `bytes` at `buf` of local rank `root` to every local rank.  A round: the root
  // copies a piece into its slot, everyone else copies it out.
  virtual void broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                         const Deadline& d) = 0;
  // Returns once every local rank has called it; a round of headers only, checked by everyone
  // (a rank in another collective's round raises there and here).
  virtual void barrier(const CallHeader& h, const Deadline& d) = 0;
  // Marks this rank failed so that the others stop waiting for it.
  virtual void abort() = 0;
  // Throws Error when another local rank failed or gave up (abort): after a call that found
  // everything it waited for already there (a late rank), which the others did not finish.
  virtual void check_others() = 0;
  // The node's lanes (at least 1).
  virtual int lanes() const { return 1; }
  // The slot's bytes: an allreduce goes in rounds of at most this much, each with its own
  // cross-node step.
  virtual size_t slot() const = 0;
  // Lane l (0 <= l < lanes()) alone: its segment's rounds, for a caller that runs a slice of a
  // call per lane itself (run_lanes).
  virtual AllreduceEngine& lane(int /*l*/) { return *this; }
  // Runs f(0) on this thread and f(1) ... f(n - 1), n <= lanes(), on the lanes' helpers (where a
  // lane has none, on this thread after f(0)); returns when all have.  The first error aborts
  // every lane of this rank and is raised once all have returned.
  virtual void run_lanes(size_t n, const std::function<void(size_t)>& f) {
    for (size_t l = 0; l < n; ++l) f(l);
  }
};

}  // namespace pytorch_exec::dc::shm
