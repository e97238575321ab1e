// A Comm is the set of ranks that run one collective together over one transport: members[i]
// is the transport peer (world rank) of the i-th member, `me` this rank's index among them.
// Sub-groups and the levels of a hierarchical allreduce are Comms over the same transport.
//
// Every collective starts with a CallHeader that neighbours exchange, so that ranks that called
// different operations (another count, dtype, op, or a different collective altogether) get a
// clear error instead of corrupt data or a hang.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dc/transport.hpp"

namespace pytorch_exec::dc {

enum class Kind : uint8_t {
  Allreduce,
  ReduceScatter,
  Allgather,
  Broadcast,
  Barrier,
  Send,
  Split,
  Alltoall,
  Gather,
  Scatter
};

struct CallHeader {
  uint32_t magic = 0x68636470;  // "pdch"
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t root = 0;  // broadcast root (low bits; the count check covers the rest)
  uint64_t count = 0;
  uint64_t seq = 0;  // the group's collective counter: catches calls made in different orders
  // A step of the call across nodes (hierarchical.cpp): its elements, so that nodes that cut a
  // call differently raise too; 0: the whole call.
  uint64_t part = 0;
};
static_assert(sizeof(CallHeader) == 32);

CallHeader make_header(Kind k, uint64_t count, DType t, Op op, uint64_t seq, int root = 0);
std::string describe(const CallHeader& h);
// Throws Error when `theirs` (from member `from`) differs from `mine`.
void check_header(const CallHeader& mine, const CallHeader& theirs, int from_rank);

// Receive buffers of the collectives, kept from call to call (per thread: a rank's thread) so
// that a collective neither allocates, zeroes nor faults in fresh memory.  One user at a time:
// the buffer is valid until the next call on this thread.
char* scratch_buffer(size_t bytes);

// Staging memory that a reduction reads while it stores into the caller's buffer (the shm
// slots, the ring's scratch) is placed half a page away from it: loads and stores at the same
// offset in their 4 KiB pages alias in the processor's store buffer ("4K aliasing"), and
// page-aligned buffers (std::vector of MiBs) made a 2-rank f32 sum of 1 MiB take 430 us instead
// of 94 us (AMD EPYC).  kUnaliasSlack: the bytes more that such staging memory needs; returns
// the offset from `area` (in [0, kUnaliasSlack)) where staging for `dest` starts.
constexpr size_t kUnaliasSlack = 4096;
inline size_t unaliased_offset(const void* area, const void* dest) {
  auto a = reinterpret_cast<uintptr_t>(area), b = reinterpret_cast<uintptr_t>(dest);
  return (b + kUnaliasSlack / 2 - a) % kUnaliasSlack;
}

// The largest chunk of a ring.  On a machine that runs more ranks than it has processors a chunk
// of a byte-stream transport (tcp) stays below one 64 KiB loopback segment: at 4 ranks on 2
// processors, chunks of 64 KiB and more made the tcp ring twice as slow at 1-8 MiB (a chunk
// that ends in a second, tiny segment costs the receiver another wake-up).
constexpr size_t kRingChunk = 256 << 10;
constexpr size_t kRingChunkShared = 48 << 10;

struct Comm {
  Transport* t = nullptr;
  std::vector<int> members;
  int me = 0;
  size_t max_chunk = kRingChunk;  // the same on every member: it decides how messages are cut

  int size() const { return static_cast<int>(members.size()); }
  int world(int i) const { return members[static_cast<size_t>(mod(i))]; }
  // The rank that messages name for member i: its world rank, or names[i] where the transport
  // numbers its peers otherwise (a lane's own connections across nodes).
  std::vector<int> names = {};
  int rank_of(int i) const { return names.empty() ? world(i) : names[static_cast<size_t>(mod(i))]; }
  int mod(int i) const {
    int n = size();
    return ((i % n) + n) % n;
  }
  Request isend(int i, const void* b, size_t n) const { return t->isend(world(i), b, n); }
  Request irecv(int i, void* b, size_t n) const { return t->irecv(world(i), b, n); }
  void wait(Request r, const Deadline& d) const { t->wait(r, d); }
};

// Receives member `from`'s call header and checks it against `mine`.
void recv_header(const Comm& c, int from, const CallHeader& mine, const Deadline& d);

// Every member shows its call header to the next one (a ring) and checks the previous one's: for
// calls whose messages go only to or from a root (gather, scatter, a broadcast across nodes),
// where members that disagree on the root would otherwise each wait for the others until the
// timeout, or return with data they did not get.
void check_ring_headers(const Comm& c, const CallHeader& mine, const Deadline& d);

}  // namespace pytorch_exec::dc
