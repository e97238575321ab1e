// The shared orchestration of the hierarchical allreduce (engines.hpp, hierarchical.cpp) on its
// own: the chunk planning of the cross-node step, and the order of the pipelined copies and wire
// steps, recorded by a copy engine that copies only when a copy is waited for (as an
// asynchronous device copy would complete), so that a chunk put on the wire before its copy
// completed, or a slot refilled before its copy back completed, gives wrong data as well as a
// wrong order.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dc/engines.hpp"

using namespace pytorch_exec::dc;

namespace {

TEST(ChunkPlan, CoversTheShardInWholeElements) {
  EXPECT_EQ(plan_chunks(0, 4, 0).chunks, 0u);
  EXPECT_EQ(plan_chunks(0, 4, 64).chunks, 0u);
  auto one = plan_chunks(1001, 4, 0);  // 0: the whole shard
  EXPECT_EQ(one.chunks, 1u);
  EXPECT_EQ(one.count(0, 1001), 1001u);
  auto tiny = plan_chunks(5, 8, 3);  // less than an element: one element per chunk
  EXPECT_EQ(tiny.chunks, 5u);
  EXPECT_EQ(plan_chunks(3, 4, 1 << 20).chunks, 1u);  // larger than the shard
  for (size_t count : {1u, 2u, 7u, 1001u, 65537u})
    for (size_t es : {1u, 2u, 4u, 8u})
      for (size_t bytes : {1u, 6u, 64u, 1000u, 4096u}) {
        auto p = plan_chunks(count, es, bytes);
        size_t sum = 0;
        for (size_t i = 0; i < p.chunks; ++i) {
          EXPECT_EQ(p.first(i), sum);
          EXPECT_GT(p.count(i, count), 0u);
          EXPECT_LE(p.count(i, count) * es, std::max(bytes, es));
          sum += p.count(i, count);
        }
        EXPECT_EQ(sum, count) << count << " " << es << " " << bytes;
      }
}

// Staging buffers of its own; a copy is carried out when it is waited for.
class RecordingCopy final : public CopyEngine {
 public:
  struct Pending {
    void* to = nullptr;
    const void* from = nullptr;
    size_t bytes = 0;
  };
  std::vector<std::string> log;
  std::vector<char> slots[kCopySlots];
  Pending up[kCopySlots], down[kCopySlots];
  bool up_done[kCopySlots] = {true, true, true}, down_done[kCopySlots] = {true, true, true};
  bool began = false, ended = false;

  void begin(const Deadline&) override {
    EXPECT_FALSE(began);
    began = true;
    log.push_back("begin");
  }
  void* host(int slot, void*, size_t bytes) override {
    auto& s = slots[slot];
    if (s.size() < bytes) s.resize(bytes);
    return s.data();
  }
  void to_host(int slot, void* host, const void* src, size_t bytes) override {
    EXPECT_TRUE(began);
    EXPECT_TRUE(down_done[slot]) << "slot " << slot << " refilled before its copy back completed";
    EXPECT_TRUE(up_done[slot]);
    up[slot] = {host, src, bytes};
    up_done[slot] = false;
    log.push_back("to_host " + std::to_string(slot));
  }
  void wait_to_host(int slot, const Deadline&) override {
    if (!up_done[slot]) std::memcpy(up[slot].to, up[slot].from, up[slot].bytes);
    up_done[slot] = true;
    log.push_back("wait_to_host " + std::to_string(slot));
  }
  void to_device(int slot, void* dst, const void* host, size_t bytes) override {
    EXPECT_TRUE(up_done[slot]);
    down[slot] = {dst, host, bytes};
    down_done[slot] = false;
    log.push_back("to_device " + std::to_string(slot));
  }
  void wait_to_device(int slot, const Deadline&) override {
    if (!down_done[slot]) std::memcpy(down[slot].to, down[slot].from, down[slot].bytes);
    down_done[slot] = true;
    log.push_back("wait_to_device " + std::to_string(slot));
  }
  void end(const Deadline&) override {
    for (int s = 0; s < kCopySlots; ++s) {
      EXPECT_TRUE(up_done[s]);
      EXPECT_TRUE(down_done[s]) << "end before slot " << s << "'s copy back completed";
    }
    ended = true;
    log.push_back("end");
  }
};

// Runs the pipeline over `count` int32 with a wire step that doubles each chunk (in host memory,
// checking that the chunk holds the shard's current values); returns the log.
std::vector<std::string> run(size_t count, size_t chunk_bytes) {
  std::vector<int32_t> shard(count);
  for (size_t i = 0; i < count; ++i) shard[i] = static_cast<int32_t>(i * 7 + 1);
  RecordingCopy copy;
  size_t seen = 0;
  Wire wire = [&](void* host, size_t k) {
    auto* p = static_cast<int32_t*>(host);
    for (size_t i = 0; i < k; ++i) {
      EXPECT_EQ(p[i], static_cast<int32_t>((seen + i) * 7 + 1)) << "chunk on the wire too early";
      p[i] *= 2;
    }
    seen += k;
    copy.log.push_back("wire " + std::to_string(k));
  };
  pipelined_cross(copy, wire, shard.data(), count, sizeof(int32_t), chunk_bytes,
                  Deadline::after(10, "test"));
  EXPECT_EQ(seen, count);
  for (size_t i = 0; i < count; ++i)
    EXPECT_EQ(shard[i], static_cast<int32_t>((i * 7 + 1) * 2)) << "element " << i;
  if (count > 0) {
    EXPECT_TRUE(copy.ended);
  }
  return copy.log;
}

TEST(Pipeline, NothingForAnEmptyShard) { EXPECT_TRUE(run(0, 64).empty()); }

TEST(Pipeline, OneChunk) {
  std::vector<std::string> want = {"begin",  "to_host 0",        "wait_to_host 0", "wire 5",
                                   "to_device 0", "wait_to_device 0", "end"};
  EXPECT_EQ(run(5, 0), want);
}

// Chunk i+1 goes to the host while chunk i is on the wire, chunk i-1 comes back meanwhile, and
// slot reuse waits for the copy back of the chunk three before.
TEST(Pipeline, OverlapsCopiesWithTheWire) {
  auto log = run(5 * 4, 16);  // 5 chunks of 4 int32
  std::vector<std::string> want = {
      "begin",
      "to_host 0",
      "to_host 1",  // chunk 1 up before chunk 0 goes on the wire
      "wait_to_host 0",
      "wire 4",
      "to_device 0",
      "to_host 2",
      "wait_to_host 1",
      "wire 4",
      "to_device 1",
      "wait_to_device 0",  // slot 0 (chunk 0) back before chunk 3 refills it
      "to_host 0",
      "wait_to_host 2",
      "wire 4",
      "to_device 2",
      "wait_to_device 1",
      "to_host 1",
      "wait_to_host 0",
      "wire 4",
      "to_device 0",
      "wait_to_host 1",
      "wire 4",
      "to_device 1",
      "wait_to_device 2",
      "wait_to_device 0",
      "wait_to_device 1",
      "end"};
  EXPECT_EQ(log, want);
}

TEST(Pipeline, OddSizesAndManyChunkSizes) {
  for (size_t count : {1u, 2u, 3u, 4u, 7u, 1001u, 8193u})
    for (size_t chunk : {0u, 1u, 4u, 12u, 100u, 4096u, 1u << 20}) {
      SCOPED_TRACE(std::to_string(count) + " elements, chunks of " + std::to_string(chunk));
      run(count, chunk);
    }
}

// The host engine stages through its own buffers when asked (PYTORCH_DC_PIPELINE_BYTES), and
// otherwise puts the shard on the wire in place.
TEST(MemcpyCopy, InPlaceOrStaged) {
  for (bool staged : {false, true}) {
    MemcpyCopy copy(staged);
    std::vector<int32_t> shard(1001);
    for (size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<int32_t>(i);
    std::vector<void*> where;
    Wire wire = [&](void* host, size_t k) {
      where.push_back(host);
      for (size_t i = 0; i < k; ++i) static_cast<int32_t*>(host)[i] += 1;
    };
    pipelined_cross(copy, wire, shard.data(), shard.size(), 4, 400, Deadline::after(10, "t"));
    for (size_t i = 0; i < shard.size(); ++i) ASSERT_EQ(shard[i], static_cast<int32_t>(i + 1));
    ASSERT_EQ(where.size(), 11u);
    for (size_t c = 0; c < where.size(); ++c) {
      bool in_place = where[c] == shard.data() + c * 100;
      EXPECT_EQ(in_place, !staged) << "chunk " << c;
    }
  }
}

}  // namespace
