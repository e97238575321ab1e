// Heartbeats on the control plane's links, on a clock of the test's own: heartbeats go out every
// interval, a link that sends nothing for the timeout is reported silent once and no longer
// watched, a link that is heard is not, and a tick that comes late (this process was stalled
// itself) declares nobody silent.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "common/event_loop.hpp"
#include "exec/ctrl/heartbeat.hpp"

using namespace pe;
using namespace pe::ctrl;

namespace {

struct Bed {
  EventLoop loop;
  double now = 100.0;
  std::map<int, int> sent;
  std::vector<int> silent;
  Heartbeats beats{loop, HeartbeatSettings{1.0, 3.0}, [this](int id) { ++sent[id]; },
                   [this](int id) { silent.push_back(id); }, [this] { return now; }};
  // Ticks every quarter second up to `until`, as the timer would.
  void run_until(double until) {
    while (now + 0.25 <= until) {
      now += 0.25;
      beats.tick();
    }
  }
};

}  // namespace

TEST(HeartbeatTest, ASilentLinkIsReportedOnceAndAHeardOneIsNot) {
  Bed b;
  b.beats.watch(1);
  b.beats.watch(2);
  for (int s = 0; s < 5; ++s) {
    b.run_until(b.now + 1.0);
    b.beats.heard(2);
  }
  EXPECT_EQ(b.silent, std::vector<int>{1});
  EXPECT_EQ(b.sent[2], 5);  // one heartbeat a second
  EXPECT_EQ(b.sent[1], 3);  // at 1, 2 and 3 s, when it was found silent
  b.run_until(b.now + 10);
  EXPECT_EQ(b.silent, (std::vector<int>{1, 2}));  // 2 went quiet too; 1 is not reported again
}

TEST(HeartbeatTest, ALateTickDeclaresNobodySilentTheNextOneJudges) {
  Bed b;
  b.beats.watch(1);
  b.beats.watch(2);
  b.run_until(b.now + 2.0);
  b.now += 5.0;  // this process was stopped for 5 s: what they sent may be unread
  b.beats.tick();
  EXPECT_TRUE(b.silent.empty());
  b.beats.heard(2);  // read before the next tick: 2 had sent something, 1 had not
  b.run_until(b.now + 0.25);
  EXPECT_EQ(b.silent, std::vector<int>{1});
  // Late all the time: only one tick in a row is let off.
  Bed late;
  late.beats.watch(1);
  for (int i = 0; i < 3; ++i) {
    late.now += 2.0;
    late.beats.tick();
  }
  EXPECT_EQ(late.silent, std::vector<int>{1});
}

TEST(HeartbeatTest, ALinkMayHaveALongerTimeoutAndBeatsGoOutFromAHeldLoop) {
  Bed b;
  b.beats.watch(1);
  b.beats.watch(2, 10);  // a daemon's parent
  b.run_until(b.now + 5);
  EXPECT_EQ(b.silent, std::vector<int>{1});
  b.run_until(b.now + 5);
  EXPECT_EQ(b.silent, (std::vector<int>{1, 2}));
  Bed held;
  held.beats.watch(1);
  held.now += 0.5;
  held.beats.beat();  // not due yet
  held.now += 0.6;
  held.beats.beat();
  held.beats.beat();
  EXPECT_EQ(held.sent[1], 1);
}

TEST(HeartbeatTest, AForgottenLinkGetsNothing) {
  Bed b;
  b.beats.watch(1);
  b.beats.forget(1);
  b.run_until(b.now + 5);
  EXPECT_TRUE(b.silent.empty());
  EXPECT_EQ(b.sent.count(1), 0u);
  EXPECT_EQ(silence(2.5), "no heartbeat for 2.5 s");
}

TEST(HeartbeatTest, AStartingLinkIsJudgedOnlyOnceItIsReady) {
  Bed b;
  b.beats.watch(1, kStartingTimeout);  // busy starting: silent for 30 s, not lost
  b.run_until(b.now + 30);
  EXPECT_TRUE(b.silent.empty());
  b.beats.settle(1);  // ready: the usual timeout, counted from now
  b.run_until(b.now + 2.5);
  EXPECT_TRUE(b.silent.empty());
  b.run_until(b.now + 1);
  EXPECT_EQ(b.silent, std::vector<int>{1});
  b.beats.settle(1);  // a link no longer watched stays so
  b.run_until(b.now + 10);
  EXPECT_EQ(b.silent, std::vector<int>{1});
}

TEST(HeartbeatTest, AHeldLinkIsNotJudgedButStillGetsHeartbeats) {
  Bed b;
  b.beats.watch(1);
  b.beats.hold(1, true);  // a relay does not read its child while its own queue is full
  b.run_until(b.now + 20);
  EXPECT_TRUE(b.silent.empty());
  EXPECT_EQ(b.sent[1], 20);  // a failed write still finds a child that is gone
  b.beats.hold(1, false);    // read again: the usual timeout, counted from now
  b.run_until(b.now + 2.5);
  EXPECT_TRUE(b.silent.empty());
  b.run_until(b.now + 1);
  EXPECT_EQ(b.silent, std::vector<int>{1});
  b.beats.hold(1, true);  // a link no longer watched stays so
  b.run_until(b.now + 5);
  EXPECT_EQ(b.silent, std::vector<int>{1});
}
