// Elastic membership as pure state (no processes, a clock of the test's own), driven through
// scripted sequences of what can happen while a job runs: arrivals, losses, readiness, in the
// orders the races produce them.  Slots are places in the job's map; the generation is a list of
// slots in rank order.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/frontend/membership.hpp"

using namespace pe;
using Slots = std::vector<int>;

namespace {

// A job started on `hosts` (one rank each) whose first generation runs.
Membership running(std::vector<std::string> hosts, int max_nodes = 4, int slot_limit = 8,
                   double cooldown = 10) {
  Membership m(MembershipSettings{max_nodes, slot_limit, cooldown});
  for (const auto& h : hosts) m.add_initial(h, 1);
  for (size_t i = 0; i < hosts.size(); ++i) m.ready(static_cast<int>(i));
  m.set_generation(m.next_generation());
  return m;
}

std::vector<std::string> hosts_of(const Membership& m, const Slots& slots) {
  std::vector<std::string> out;
  for (int s : slots) out.push_back(m.node(s).host);
  return out;
}

using Names = std::vector<std::string>;

}  // namespace

TEST(MembershipTest, TheFirstNodesUpToMaxFormTheGenerationTheRestAreSpares) {
  Membership m(MembershipSettings{2, 8, 10});
  for (const char* h : {"a", "b", "c"}) m.add_initial(h, 2);
  // While they start, they count (the job starts without the ones that never come).
  EXPECT_EQ(m.next_generation(), (Slots{0, 1}));
  EXPECT_EQ(m.left(), 3);
  m.lost(0, 0);
  EXPECT_EQ(m.next_generation(), (Slots{1, 2}));
  EXPECT_EQ(m.left(), 2);
}

TEST(MembershipTest, ArrivalsAreAppendedAndWaitUntilReady) {
  Membership m = running({"a", "b"});
  auto o = m.offer("c", 2, 0);
  EXPECT_EQ(o.slot, 2);
  EXPECT_EQ(m.node(2).ranks, 2);
  EXPECT_EQ(m.offer("c", 2, 0).slot, -1);  // already there: nothing to do, nothing to say
  EXPECT_EQ(m.offer("c", 2, 0).why, "");
  EXPECT_EQ(m.next_generation(), (Slots{0, 1}));  // starting: not yet
  EXPECT_EQ(m.starting(), 1);
  m.ready(2);
  EXPECT_EQ(m.starting(), 0);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "b", "c"}));
}

TEST(MembershipTest, SurvivorsKeepTheirOrderAheadOfEarlierAdmittedSpares) {
  // d was admitted before e, but e joined the generation first (d was slow to start): when d
  // is ready, e keeps its place and d comes after it.
  Membership m = running({"a", "b"}, 3);
  m.offer("d", 1, 0);
  m.offer("e", 1, 0);
  m.ready(3);  // e
  m.set_generation(m.next_generation());
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "b", "e"}));
  m.ready(2);  // d: MAX is reached, it waits as a spare
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "b", "e"}));
  m.lost(0, 0);  // a is lost: the spare is appended
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"b", "e", "d"}));
}

TEST(MembershipTest, AnArrivalDuringAStopJoinsTheNextGeneration) {
  // b is lost; while the survivors stop, c is offered and becomes ready: the generation that
  // starts next has a, the survivor d, and c after them.
  Membership m = running({"a", "b", "d"});
  m.lost(1, 5);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "d"}));
  auto o = m.offer("c", 1, 5.1);
  EXPECT_EQ(o.slot, 1);  // b's place in the map is taken again
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "d"}));
  m.ready(o.slot);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "d", "c"}));
}

TEST(MembershipTest, ALossDuringAReformIsLeftOutToo) {
  Membership m = running({"a", "b", "c", "d"});
  m.lost(1, 1);  // the re-forming starts: the survivors are being stopped
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c", "d"}));
  m.lost(3, 1.2);  // before they have all stopped
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c"}));
  EXPECT_EQ(m.left(), 2);
  EXPECT_EQ(m.lost(3, 1.3), 0);  // reported twice: once
}

TEST(MembershipTest, TheSameHostRejoiningWaitsItsCooldownWhichDoubles) {
  Membership m = running({"a", "b", "c"}, 4, 8, 10);
  EXPECT_EQ(m.lost(1, 100), 10);
  auto o = m.offer("b", 1, 105);
  EXPECT_EQ(o.slot, -1);
  EXPECT_EQ(o.why, "lost 1 time(s): kept out for another 5.0 s (cool-down)");
  o = m.offer("b", 1, 110);
  EXPECT_EQ(o.slot, 1);  // its own place again
  m.ready(1);
  // It is a new node: appended after the survivors.
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c", "b"}));
  m.set_generation(m.next_generation());
  EXPECT_EQ(m.lost(1, 120), 20);  // twice as long the second time
  EXPECT_EQ(m.offer("b", 1, 139).slot, -1);
  EXPECT_EQ(m.offer("b", 1, 140).slot, 1);
}

TEST(MembershipTest, ANodeLostWhileStartingIsKeptOutAndItsSlotIsUsedAgain) {
  Membership m = running({"a", "b"});
  int c = m.offer("c", 1, 0).slot;
  m.lost(c, 1);  // its daemon never came up
  EXPECT_EQ(m.find("c"), -1);
  EXPECT_EQ(m.offer("d", 1, 2).slot, c);  // another host takes the place
  EXPECT_EQ(m.find("d"), c);
  EXPECT_EQ(m.size(), 3u);
}

TEST(MembershipTest, NoMoreSlotsThanTheFrontEndTakes) {
  Membership m = running({"a", "b"}, 8, 3);
  EXPECT_EQ(m.offer("c", 1, 0).slot, 2);
  auto o = m.offer("d", 1, 0);
  EXPECT_EQ(o.slot, -1);
  EXPECT_EQ(o.why, "no room: the front end takes 3 nodes (--tree-radix)");
  m.lost(0, 0);
  EXPECT_EQ(m.offer("a", 1, 1).slot, -1);  // cooling down
  EXPECT_EQ(m.offer("d", 1, 1).slot, 0);   // its place is free for another host
}

TEST(MembershipTest, NodesForSpawnedProcessesNeverJoinAGeneration) {
  Membership m = running({"a", "b"}, 0);  // no limit: every ready node would join
  Membership::Offer o = m.offer("c", 0, 0, true);
  ASSERT_EQ(o.slot, 2);
  EXPECT_EQ(m.starting(), 0);  // nothing waits for it
  m.ready(o.slot);
  EXPECT_EQ(m.next_generation(), (Slots{0, 1}));
  EXPECT_EQ(m.left(), 2);
  EXPECT_EQ(m.find("c"), 2);
  m.lost(o.slot, 1);
  EXPECT_EQ(m.next_generation(), (Slots{0, 1}));
  EXPECT_EQ(m.offer("c", 0, 2, true).slot, -1);  // cooling down, as any lost host
}

TEST(MembershipTest, ARetiredNodeLeavesWithoutACooldownAndItsPlaceIsUsedAgain) {
  Membership m = running({"a", "b", "c"});
  m.retire(1);  // b no longer listed
  EXPECT_EQ(m.find("b"), -1);
  EXPECT_EQ(m.left(), 2);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c"}));
  m.set_generation(m.next_generation());
  // Listed again at once: admitted (no cool-down), in its old slot, after the survivors.
  auto o = m.offer("b", 1, 0.1);
  EXPECT_EQ(o.slot, 1);
  EXPECT_EQ(o.why, "");
  m.ready(1);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c", "b"}));
  // A loss after a retirement still counts as its host's first.
  m.set_generation(m.next_generation());
  EXPECT_EQ(m.lost(1, 1), 10);
}

// Join mode's static rendezvous: nodes arrive in any order but take their fixed node rank.
TEST(MembershipTest, FixedPlacesOrderTheGenerationWhateverTheArrivalOrder) {
  Membership m(MembershipSettings{4, 8, 10});
  m.add_initial("n0", 1);
  m.ready(0);
  for (auto [host, rank] : {std::pair<const char*, long>{"n3", 3}, {"n1", 1}, {"n2", 2}}) {
    auto o = m.offer(host, 1, 0, false, rank);
    ASSERT_GE(o.slot, 0);
    m.ready(o.slot);
  }
  EXPECT_EQ(hosts_of(m, m.next_generation()), (std::vector<std::string>{"n0", "n1", "n2", "n3"}));
  // A node without a fixed place comes after them all.
  auto o = m.offer("n4", 1, 0);
  m.ready(o.slot);
  Membership::Node n = m.node(o.slot);
  EXPECT_GT(n.order, 3);
}

TEST(MembershipTest, AGenerationIsItsNodesNotItsSlots) {
  Membership m = running({"a", "b"});
  EXPECT_TRUE(m.is_generation(Slots{0, 1}));
  EXPECT_FALSE(m.is_generation(Slots{1, 0}));
  EXPECT_FALSE(m.is_generation(Slots{0}));
  m.lost(1, 0);
  int c = m.offer("c", 1, 0).slot;  // takes b's place
  ASSERT_EQ(c, 1);
  m.ready(c);
  EXPECT_EQ(m.next_generation(), (Slots{0, 1}));  // the same slots as the running generation...
  EXPECT_FALSE(m.is_generation(m.next_generation()));  // ...with another node in one of them
}

TEST(MembershipTest, AGenerationIsAMultipleOfTheGivenNodeCount) {
  Membership m(MembershipSettings{4, 8, 10, 2});
  for (const char* h : {"a", "b", "c", "d"}) m.add_initial(h, 1);
  for (int i = 0; i < 4; ++i) m.ready(i);
  m.set_generation(m.next_generation());
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "b", "c", "d"}));
  m.lost(1, 0);  // three left: two form the generation, the third stands by
  EXPECT_EQ(m.left(), 2);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c"}));
  m.set_generation(m.next_generation());
  int e = m.offer("e", 1, 0).slot;  // a fourth again: all four
  m.ready(e);
  EXPECT_EQ(m.left(), 4);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c", "d", "e"}));
}

TEST(MembershipTest, AFirstNodeLateAtTheStartJoinsLaterAsAnArrival) {
  Membership m(MembershipSettings{3, 8, 10});
  for (const char* h : {"a", "b", "c"}) m.add_initial(h, 1);
  m.ready(0);
  m.ready(2);
  m.late(1);  // the job starts without b
  EXPECT_EQ(m.starting(), 1);
  EXPECT_EQ(m.left(), 2);
  m.set_generation(m.next_generation());
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c"}));
  m.ready(1);  // after the survivors, though it was listed before c
  EXPECT_EQ(m.starting(), 0);
  EXPECT_EQ(hosts_of(m, m.next_generation()), (Names{"a", "c", "b"}));
}
