// MPI_Comm_spawn's placement (plan_spawn) and the keys that name a collective's participants.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "exec/node/spawn_plan.hpp"
#include "pmix_rdzv/modex_router.hpp"

using namespace pe;

namespace {

JobMap two_nodes(int slots_a, int slots_b) {
  JobMap m;
  m.world_size = 2;
  m.nodes = {{"a", 0, {0}, slots_a}, {"b", 1, {1}, slots_b}};
  m.ranks = {{0, 0}, {1, 0}};
  return m;
}

pmix::SpawnRequest request(std::vector<int> counts, std::vector<std::string> hosts = {}) {
  pmix::SpawnRequest r;
  r.parent_nspace = "ns";
  for (int n : counts) {
    pmix::SpawnApp a;
    a.cmd = "/bin/true";
    a.argv = {"true"};
    a.maxprocs = n;
    a.hosts = hosts;
    r.apps.push_back(a);
  }
  return r;
}

}  // namespace

TEST(SpawnPlanTest, FillsFreeSlotsNodeByNode) {
  SpawnJob j = plan_spawn(request({3}), two_nodes(2, 3), {1, 1}, false);
  EXPECT_EQ(j.map.world_size, 3);
  ASSERT_EQ(j.map.nodes.size(), 2u);
  EXPECT_EQ(j.map.nodes[0].host, "a");
  EXPECT_EQ(j.map.nodes[0].ranks, (std::vector<int>{0}));
  EXPECT_EQ(j.map.nodes[1].ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(j.map.ranks[2].node, 1);
  EXPECT_EQ(j.map.ranks[2].local_rank, 1);
  EXPECT_EQ(j.appnum, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(j.universe_size, 5);
}

TEST(SpawnPlanTest, NumbersTheApplicationsInOrder) {
  SpawnJob j = plan_spawn(request({1, 2}), two_nodes(4, 4), {1, 1}, false);
  EXPECT_EQ(j.appnum, (std::vector<int>{0, 1, 1}));
  ASSERT_EQ(j.map.nodes.size(), 1u);  // all three fit on a
  EXPECT_EQ(j.map.nodes[0].ranks, (std::vector<int>{0, 1, 2}));
}

TEST(SpawnPlanTest, HostKeysChooseTheNodes) {
  SpawnJob j = plan_spawn(request({2}, {"b"}), two_nodes(4, 4), {1, 1}, false);
  ASSERT_EQ(j.map.nodes.size(), 1u);
  EXPECT_EQ(j.map.nodes[0].host, "b");
  EXPECT_THROW(plan_spawn(request({1}, {"c"}), two_nodes(4, 4), {1, 1}, false), SpawnError);
  // A hostfile names them too.
  char path[] = "/tmp/spawn_test_hostsXXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  std::string text = "# the spawn's hosts\nb slots=2\n";
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  auto req = request({2});
  req.apps[0].hostfile = path;
  SpawnJob j2 = plan_spawn(req, two_nodes(4, 4), {1, 1}, false);
  ::unlink(path);
  ASSERT_EQ(j2.map.nodes.size(), 1u);
  EXPECT_EQ(j2.map.nodes[0].host, "b");
  req.apps[0].hostfile = "/nonexistent/hostfile";
  EXPECT_THROW(plan_spawn(req, two_nodes(4, 4), {1, 1}, false), SpawnError);
}

TEST(SpawnPlanTest, HostsWithoutRanksOnlyWhereDaemonsCanBeAdded) {
  JobMap m = two_nodes(2, 2);
  m.spawn_hosts = {{"c", 0, {}, 3}};
  // Only when named, after the job's nodes; their slots count.
  SpawnJob j = plan_spawn(request({3}, {"c"}), m, {1, 1}, false, true);
  ASSERT_EQ(j.map.nodes.size(), 1u);
  EXPECT_EQ(j.map.nodes[0].host, "c");
  EXPECT_EQ(j.map.nodes[0].ranks.size(), 3u);
  EXPECT_EQ(j.universe_size, 4);  // the job's nodes' slots, as its ranks see it
  EXPECT_EQ(plan_spawn(request({2}), m, {1, 1}, false, true).map.nodes[0].host, "a");
  EXPECT_THROW(plan_spawn(request({4}, {"c"}), m, {1, 1}, false, true), SpawnError);
  EXPECT_EQ(plan_spawn(request({2}, {"c"}), m, {1, 1, 2}, true, true).map.nodes[0].host, "c");
  // Without daemons (a job on this machine alone), or a host in no list: one sentence.
  try {
    plan_spawn(request({1}, {"c"}), m, {1, 1}, false, false);
    FAIL() << "no error";
  } catch (const SpawnError& e) {
    EXPECT_NE(std::string(e.what()).find("host c runs none of the job's ranks"), std::string::npos)
        << e.what();
  }
  try {
    plan_spawn(request({1}, {"d"}), m, {1, 1}, false, true);
    FAIL() << "no error";
  } catch (const SpawnError& e) {
    EXPECT_EQ(std::string(e.what()),
              "host d is not in the job's host list (its nodes: a,b; the host list's: c)");
  }
}

TEST(SpawnPlanTest, BeyondTheSlotsOnlyWithOversubscribe) {
  try {
    plan_spawn(request({3}), two_nodes(2, 2), {1, 1}, false);
    FAIL() << "no error";
  } catch (const SpawnError& e) {
    EXPECT_NE(std::string(e.what()).find("have 2 free slot(s) (add --oversubscribe"),
              std::string::npos)
        << e.what();
  }
  // The second app finds the slots the first took.
  EXPECT_THROW(plan_spawn(request({1, 2}), two_nodes(2, 2), {1, 1}, false), SpawnError);
  SpawnJob j = plan_spawn(request({4}), two_nodes(1, 1), {1, 1}, true);
  EXPECT_EQ(j.map.nodes[0].ranks.size() + j.map.nodes[1].ranks.size(), 4u);
  EXPECT_EQ(j.map.nodes[0].ranks.size(), 2u);  // the overflow goes round the nodes
  // No limit (this machine without a host list): anything goes.
  JobMap one = two_nodes(0, 0);
  EXPECT_EQ(plan_spawn(request({16}), one, {1, 1}, false).map.world_size, 16);
  EXPECT_THROW(plan_spawn(request({0}), one, {1, 1}, false), SpawnError);
}

TEST(SpawnPlanTest, ProgramsAreResolvedOrRefused) {
  EXPECT_EQ(resolve_spawn_program("sh", "/", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(resolve_spawn_program("/bin/sh", "/tmp", ""), "/bin/sh");
  EXPECT_EQ(resolve_spawn_program("./sh", "/bin", ""), "/bin/./sh");
  EXPECT_THROW(resolve_spawn_program("no-such-program-here", "/", "/bin"), SpawnError);
  EXPECT_THROW(resolve_spawn_program("/etc/passwd", "/", ""), SpawnError);
}

TEST(ParticipantsKeyTest, NamesTheSameSetTheSameWay) {
  using pmix::ProcId;
  EXPECT_EQ(pmix::participants_key({{"ns", -1}}), "ns");
  EXPECT_EQ(pmix::participants_key({{"z", 2}, {"a", -1}, {"z", 0}}), "a:*;z:0,2");
  EXPECT_EQ(pmix::participants_key({{"z", 0}, {"z", 2}, {"a", -1}}, "connect"),
            "connect|a:*;z:0,2");
  auto back = pmix::parse_participants("connect|a:*;z:0,2");
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].nspace, "a");
  EXPECT_EQ(back[0].rank, -1);
  EXPECT_EQ(back[2].nspace, "z");
  EXPECT_EQ(back[2].rank, 2);
  ASSERT_EQ(pmix::parse_participants("ns.spawn1").size(), 1u);
  EXPECT_THROW(pmix::parse_participants("a:x"), std::invalid_argument);
  EXPECT_THROW(pmix::parse_participants(":1"), std::invalid_argument);
}
