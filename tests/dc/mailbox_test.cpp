// Mailbox: tagged point-to-point messages in flight together, with ranks as threads over real
// tcp connections.  Exchanges that would deadlock one-at-a-time sends, receives posted in
// another order than the sends, from any source, messages that arrive before their receive, a
// size that does not match, timeouts, a lost peer, and collectives running at the same time on
// another thread of the same ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>

#include "testlib.hpp"

using namespace dctest;

namespace {

using Boxes = std::vector<std::unique_ptr<Mailbox>>;

Boxes boxes_of(const Groups& g) {
  Boxes b(g.size());
  on_all(g, [&](ProcessGroup& pg, int r) { b[static_cast<size_t>(r)] = pg.mailbox(); });
  return b;
}

std::vector<float> filled(size_t n, float v) { return std::vector<float>(n, v); }

Groups over_tcp(int n) {
  Options o;
  o.intra = "tcp";
  return ProcessGroup::threads(n, o);
}

}  // namespace

TEST(Mailbox, BothRanksSendALargeMessageFirstAndThenReceive) {
  auto g = over_tcp(2);
  auto b = boxes_of(g);
  const size_t n = 4 << 20;  // 16 MiB each way: far more than the sockets hold
  on_all(g, [&](ProcessGroup&, int r) {
    Mailbox& m = *b[static_cast<size_t>(r)];
    auto out = filled(n, static_cast<float>(r + 1)), in = filled(n, 0);
    uint64_t s = m.isend(out.data(), n * 4, 1 - r, 0);
    uint64_t q = m.irecv(in.data(), n * 4, 1 - r, 0);
    m.wait(s);
    int src = -1;
    m.wait(q, &src);
    EXPECT_EQ(src, 1 - r);
    EXPECT_EQ(in.front(), static_cast<float>(2 - r));
    EXPECT_EQ(in.back(), static_cast<float>(2 - r));
  });
}

TEST(Mailbox, ReceivesMatchTheirTagWhateverTheOrderAndKeepEachTagsOrder) {
  auto g = over_tcp(2);
  auto b = boxes_of(g);
  on_all(g, [&](ProcessGroup&, int r) {
    Mailbox& m = *b[static_cast<size_t>(r)];
    if (r == 0) {
      int32_t v[4] = {10, 20, 11, 21};  // tag 1, tag 2, tag 1, tag 2
      std::vector<uint64_t> ids;
      for (int i = 0; i < 4; ++i) ids.push_back(m.isend(&v[i], 4, 1, 1 + i % 2));
      for (auto id : ids) m.wait(id);
    } else {
      int32_t got[4] = {};
      // Tag 2 first: the tag 1 messages are kept meanwhile.
      m.wait(m.irecv(&got[0], 4, 0, 2));
      m.wait(m.irecv(&got[1], 4, 0, 2));
      m.wait(m.irecv(&got[2], 4, 0, 1));
      m.wait(m.irecv(&got[3], 4, 0, 1));
      EXPECT_EQ(std::vector<int32_t>(got, got + 4), (std::vector<int32_t>{20, 21, 10, 11}));
    }
  });
}

TEST(Mailbox, AMessageStillComingWhenItsReceiveIsPostedGoesToIt) {
  auto g = over_tcp(2);
  auto b = boxes_of(g);
  const size_t n = 4 << 20;
  on_all(g, [&](ProcessGroup&, int r) {
    Mailbox& m = *b[static_cast<size_t>(r)];
    auto buf = filled(n, r == 0 ? 2.5f : 0.f);
    if (r == 0) return m.wait(m.isend(buf.data(), n * 4, 1, 9));
    // Its header and first bytes are read before the receive exists: they are being kept.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sockets fill up
    m.progress();  // reads the header, and the first bytes of 16 MiB
    m.progress();
    m.wait(m.irecv(buf.data(), n * 4, 0, 9, 20));
    EXPECT_EQ(buf.front(), 2.5f);
    EXPECT_EQ(buf.back(), 2.5f);
  });
}

TEST(Mailbox, ReceivesFromAnySourceSayWhoSent) {
  auto g = over_tcp(4);
  auto b = boxes_of(g);
  on_all(g, [&](ProcessGroup&, int r) {
    Mailbox& m = *b[static_cast<size_t>(r)];
    if (r != 0) {
      int64_t v = 100 + r;
      m.wait(m.isend(&v, 8, 0, 7));
      return;
    }
    std::vector<int> from;
    for (int i = 0; i < 3; ++i) {
      int64_t v = 0;
      int src = -1;
      m.wait(m.irecv(&v, 8, Mailbox::kAnySource, 7), &src);
      EXPECT_EQ(v, 100 + src);
      from.push_back(src);
    }
    std::sort(from.begin(), from.end());
    EXPECT_EQ(from, (std::vector<int>{1, 2, 3}));
  });
}

TEST(Mailbox, ASizeThatDoesNotMatchFailsThatReceiveOnly) {
  auto g = over_tcp(2);
  auto b = boxes_of(g);
  on_all(g, [&](ProcessGroup&, int r) {
    Mailbox& m = *b[static_cast<size_t>(r)];
    int64_t two[2] = {1, 2}, one = 3;
    if (r == 0) {
      m.wait(m.isend(two, 16, 1, 0));
      m.wait(m.isend(&one, 8, 1, 0));
      return;
    }
    int64_t got = 0;
    uint64_t q = m.irecv(&got, 8, 0, 0);
    try {
      m.wait(q);
      ADD_FAILURE() << "a 16-byte message went into an 8-byte receive";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has 16 bytes"), std::string::npos) << e.what();
    }
    m.wait(m.irecv(&got, 8, 0, 0));
    EXPECT_EQ(got, 3);
  });
}

TEST(Mailbox, AReceiveNobodyAnswersTimesOutAloneAndALostPeerFailsWhatInvolvesIt) {
  auto g = over_tcp(2);
  auto b = boxes_of(g);
  int64_t v = 0;
  EXPECT_THROW(b[0]->wait(b[0]->irecv(&v, 8, 1, 3, 0.2)), TimeoutError);
  int64_t w = 5;
  b[1]->wait(b[1]->isend(&w, 8, 0, 4));
  b[0]->wait(b[0]->irecv(&v, 8, 1, 4));  // still usable
  EXPECT_EQ(v, 5);
  uint64_t q = b[0]->irecv(&v, 8, 1, 4, 20);
  b[1].reset();  // rank 1 goes away
  try {
    b[0]->wait(q);
    ADD_FAILURE() << "a receive from a closed peer completed";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "a closed peer was noticed only at the timeout: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b[0]->wait(b[0]->isend(&w, 8, 1, 0)), Error);
}

TEST(Mailbox, WhatAPeerSentBeforeItWentIsStillReceived) {
  auto g = over_tcp(3);
  auto b = boxes_of(g);
  std::vector<float> big = filled(1 << 20, 2.5f);  // 4 MiB: more than the sockets hold
  int64_t last = 9;
  uint64_t s[2] = {b[1]->isend(big.data(), big.size() * sizeof(float), 0, 1),
                   b[1]->isend(&last, 8, 0, 2)};
  bool sent[2] = {false, false};
  for (int i = 0; i < 1000000 && !(sent[0] && sent[1]); ++i) {
    b[1]->progress();
    b[0]->progress();
    for (int k = 0; k < 2; ++k)
      if (!sent[k]) sent[k] = b[1]->test(s[k]);
  }
  ASSERT_TRUE(sent[0] && sent[1]);
  // Rank 0 has taken both in (kept: no receive posted yet) when rank 1 goes away.
  for (int i = 0; i < 100; ++i) b[0]->progress();
  b[1].reset();
  std::vector<float> got(big.size());
  int64_t v = 0;
  int64_t spare = 0;
  // The loss is noticed; a receive that nothing kept fails, naming it.
  EXPECT_THROW(b[0]->wait(b[0]->irecv(&spare, 8, 1, 7, 20)), Error);
  b[0]->wait(b[0]->irecv(&v, 8, 1, 2));
  b[0]->wait(b[0]->irecv(got.data(), got.size() * sizeof(float), Mailbox::kAnySource, 1));
  EXPECT_EQ(v, 9);
  EXPECT_EQ(got, big);
  EXPECT_THROW(b[0]->wait(b[0]->isend(&v, 8, 1, 0)), Error);  // to the lost one: an error
  // Ranks 0 and 2 go on between themselves (rank 1 may have destroyed its group, as a pipeline
  // stage that is done does).
  int64_t to2 = 42, at2 = 0;
  uint64_t s2 = b[0]->isend(&to2, 8, 2, 5), r2 = b[2]->irecv(&at2, 8, 0, 5);
  bool sent2 = false, got2 = false;
  for (int i = 0; i < 1000000 && !(sent2 && got2); ++i) {
    b[0]->progress();
    b[2]->progress();
    if (!sent2) sent2 = b[0]->test(s2);
    if (!got2) got2 = b[2]->test(r2);
  }
  EXPECT_TRUE(sent2 && got2);
  EXPECT_EQ(at2, 42);
}

TEST(Mailbox, CollectivesRunOnAnotherThreadMeanwhile) {
  auto g = over_tcp(2);
  auto b = boxes_of(g);
  on_all(g, [&](ProcessGroup& pg, int r) {
    std::thread p2p([&] {
      Mailbox& m = *b[static_cast<size_t>(r)];
      for (int i = 0; i < 200; ++i) {
        int32_t out = r * 1000 + i, in = -1;
        uint64_t s = m.isend(&out, 4, 1 - r, i % 3);
        m.wait(m.irecv(&in, 4, 1 - r, i % 3));
        m.wait(s);
        EXPECT_EQ(in, (1 - r) * 1000 + i);
      }
    });
    for (int i = 0; i < 200; ++i) {
      std::vector<float> x(1000, static_cast<float>(r + i));
      pg.allreduce(x.data(), x.size(), DType::F32, Op::Sum);
      EXPECT_EQ(x[999], static_cast<float>(1 + 2 * i));
    }
    p2p.join();
  });
}

TEST(Mailbox, BadArgumentsAreErrors) {
  auto g = over_tcp(2);
  auto b = boxes_of(g);
  int v = 0;
  EXPECT_THROW(b[0]->isend(&v, 4, 0, 0), Error);   // itself
  EXPECT_THROW(b[0]->isend(&v, 4, 2, 0), Error);   // no such rank
  EXPECT_THROW(b[0]->irecv(&v, 4, 1, -1), Error);  // negative tag
  EXPECT_THROW(b[0]->test(12345), Error);          // unknown request
  EXPECT_THROW(b[0]->isend(nullptr, 4, 1, 0), Error);
}
