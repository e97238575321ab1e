// The control plane's messages: the job description and generation round-trip, malformed ones
// are errors, and the tree's parent/children/subtree relations agree with each other.
#include <gtest/gtest.h>

#include "exec/control.hpp"

using namespace pe;

namespace {

ctrl::JobDescription sample() {
  ctrl::JobDescription j;
  j.job_id = "abc123";
  j.node = 1;
  j.replace_env = true;
  j.stdin_forwarded = true;
  j.tree_radix = 4;
  j.cfg.np = 3;
  j.cfg.program = "/usr/bin/python3";
  j.cfg.program_arg0 = "python3";
  j.cfg.args = {"train.py", "--lr", ""};
  j.cfg.bind_to = topo::BindTo::Core;
  j.cfg.exports = {{"A", "1"}, {"B", ""}};
  j.cfg.stdin_mode = StdinMode::OneRank;
  j.cfg.stdin_rank = 2;
  j.cfg.max_restarts = 3;
  j.cfg.run_id = "run";
  j.env = {{"PATH", "/bin"}, {"X", "y=z"}};
  j.map.world_size = 3;
  j.map.nodes = {{"a", 0, {0}}, {"b", 1, {1, 2}}};
  j.map.ranks = {{0, 0}, {1, 0}, {1, 1}};
  return j;
}

}  // namespace

TEST(ControlTest, JobDescriptionRoundTrips) {
  auto j = ctrl::decode_job(ctrl::encode_job(sample()));
  EXPECT_EQ(j.job_id, "abc123");
  EXPECT_EQ(j.node, 1);
  EXPECT_TRUE(j.replace_env);
  EXPECT_TRUE(j.stdin_forwarded);
  EXPECT_EQ(j.tree_radix, 4);
  EXPECT_EQ(j.cfg.args, (std::vector<std::string>{"train.py", "--lr", ""}));
  EXPECT_EQ(j.cfg.exports, sample().cfg.exports);
  EXPECT_EQ(j.cfg.stdin_rank, 2);
  EXPECT_EQ(j.env, sample().env);
  ASSERT_EQ(j.map.nodes.size(), 2u);
  EXPECT_EQ(j.map.nodes[1].ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(j.map.ranks[2].node, 1);
  EXPECT_EQ(j.map.ranks[2].local_rank, 1);
}

TEST(ControlTest, MappingChoicesTravelAsCheckedBytes) {
  auto j = sample();
  j.cfg.map_by = topo::MapBy::Numa;
  j.cfg.rank_by = topo::RankBy::Domain;
  auto k = ctrl::decode_job(ctrl::encode_job(j));
  EXPECT_EQ(k.cfg.map_by, topo::MapBy::Numa);
  EXPECT_EQ(k.cfg.rank_by, topo::RankBy::Domain);
  EXPECT_EQ(k.cfg.bind_to, topo::BindTo::Core);
  j.cfg.bind_to = static_cast<topo::BindTo>(9);
  EXPECT_THROW(ctrl::decode_job(ctrl::encode_job(j)), wire::WireError);
  j = sample();
  j.cfg.rank_by = static_cast<topo::RankBy>(5);
  EXPECT_THROW(ctrl::decode_job(ctrl::encode_job(j)), wire::WireError);
}

TEST(ControlTest, MalformedJobDescriptionsAreErrors) {
  std::string good = ctrl::encode_job(sample());
  for (size_t cut = 0; cut < good.size(); cut += 7)
    EXPECT_THROW(ctrl::decode_job(good.substr(0, cut)), wire::WireError) << cut;
  EXPECT_THROW(ctrl::decode_job(good + "x"), wire::WireError);
  auto bad = sample();
  bad.map.nodes[1].ranks = {1, 1};  // a rank twice, rank 2 missing
  EXPECT_THROW(ctrl::decode_job(ctrl::encode_job(bad)), wire::WireError);
  bad = sample();
  bad.node = 5;
  EXPECT_THROW(ctrl::decode_job(ctrl::encode_job(bad)), wire::WireError);
  bad = sample();
  bad.map.nodes[0].ranks = {7};
  EXPECT_THROW(ctrl::decode_job(ctrl::encode_job(bad)), wire::WireError);
}

TEST(ControlTest, GenerationAndExitRoundTrip) {
  GenerationInfo g;
  g.job_id = "j";
  g.generation = 2;
  g.restart_count = 2;
  g.max_restarts = 5;
  g.master_addr = "10.0.0.1";
  g.master_port = 29500;
  auto h = ctrl::decode_generation(ctrl::encode_generation(g));
  EXPECT_EQ(h.generation, 2);
  EXPECT_EQ(h.master_addr, "10.0.0.1");
  EXPECT_EQ(h.master_port, 29500);
  g.master_port = 70000;
  EXPECT_THROW(ctrl::decode_generation(ctrl::encode_generation(g)), wire::WireError);
  WorkerExit e;
  e.rank = 3;
  e.pid = 42;
  e.status = 9;
  e.pmix_unfinalized = true;
  auto f = ctrl::decode_exit(ctrl::encode_exit(e));
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.pid, 42);
  EXPECT_EQ(f.status, 9);
  EXPECT_TRUE(f.pmix_unfinalized);
}

TEST(ControlTest, RoutedEnvelope) {
  auto r = ctrl::unwrap(ctrl::wrap(7, static_cast<uint16_t>(ctrl::Msg::Output), "data"));
  EXPECT_EQ(r.node, 7u);
  EXPECT_EQ(r.inner.type, static_cast<uint16_t>(ctrl::Msg::Output));
  EXPECT_EQ(r.inner.payload, "data");
  EXPECT_THROW(ctrl::unwrap(ctrl::wrap(1, static_cast<uint16_t>(ctrl::Msg::Routed), "x")), wire::WireError);
  EXPECT_THROW(ctrl::unwrap("abc"), wire::WireError);
}

TEST(ControlTest, TreeRelationsAgree) {
  for (int radix : {1, 2, 3, 32}) {
    const int n = 200;
    std::vector<int> seen(n, 0);
    for (int p = -1; p < n; ++p) {
      std::vector<int> kids;
      if (p < 0) {
        for (int i = 0; i < std::min(radix, n); ++i) kids.push_back(i);
      } else {
        kids = ctrl::tree_children(p, radix, n);
      }
      EXPECT_LE(kids.size(), static_cast<size_t>(radix));
      for (int c : kids) {
        EXPECT_EQ(ctrl::tree_parent(c, radix), p) << radix << " " << c;
        ++seen[c];
        if (p >= 0) {
          EXPECT_TRUE(ctrl::in_subtree(p, c, radix));
          EXPECT_FALSE(ctrl::in_subtree(c, p, radix));
        }
      }
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "radix " << radix << " node " << i;
  }
}
