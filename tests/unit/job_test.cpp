// The job controller's restart state machine, driven by a fake WorkerSet (no processes): a
// failing rank restarts the whole group while the budget lasts, with the generation and restart
// count moving on; without budget the job fails with the rank's status.  Elastic jobs re-form on
// the nodes left after one is lost, while at least --nnodes MIN remain.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "exec/frontend/job.hpp"

using namespace pe;

namespace {

// What the fake workers were told: failure notices (generation, rank, exit code, aborted), when
// the last came and when the first signal came.
std::vector<std::array<int, 4>> g_notices;
std::chrono::steady_clock::time_point g_notified_at, g_signalled_at;

// Ranks "run" until the loop turns; rank `fail_rank` exits 3 in the generations listed in
// `fails`, every other rank exits 0.  A signal ends every live rank by that signal.
class FakeWorkers : public WorkerSet {
 public:
  FakeWorkers(const WorkerSetContext& c, std::vector<int> fails, std::vector<GenerationInfo>* log)
      : c_(c), fails_(std::move(fails)), log_(log), map_(c.map) {}
  const char* lose_node = nullptr;     // in generation 0, node 1 (this host) is lost
  std::vector<JobMap>* maps = nullptr;  // gets the map of each generation
  void prepare(std::function<void()> ready) override { c_.loop.post(std::move(ready)); }
  std::string master_addr() override { return "127.0.0.1"; }
  int master_port() override { return 29500; }
  void use_map(const JobMap& map) override { map_ = map; }
  void start(const GenerationInfo& gen) override {
    log_->push_back(gen);
    if (maps) maps->push_back(map_);
    generation_ = gen.generation;
    alive_.assign(static_cast<size_t>(map_.world_size), true);
    bool fail = std::find(fails_.begin(), fails_.end(), gen.generation) != fails_.end();
    if (lose_node && gen.generation == 0) {  // its daemon goes away; the others keep running
      c_.loop.post([this] { c_.listener.on_node_lost(lose_node, "lost contact with its daemon"); });
      for (int r : map_.nodes[1].ranks) alive_[static_cast<size_t>(r)] = false;
      return;
    }
    for (int r = 0; r < map_.world_size; ++r) {
      int status = fail && r == 1 ? 3 << 8 : 0;
      if (status == 0 && fail) continue;  // the others wait to be stopped
      c_.loop.post([this, r, status, g = gen.generation] { exit(r, g, status); });
    }
  }
  void signal_all(int sig) override {
    if (g_signalled_at == std::chrono::steady_clock::time_point{})
      g_signalled_at = std::chrono::steady_clock::now();
    for (int r = 0; r < map_.world_size; ++r)
      c_.loop.post([this, r, sig, g = generation_] { exit(r, g, sig); });
  }
  void notify_failure(int generation, int, int rank, int exit_code, bool aborted) override {
    g_notices.push_back({generation, rank, exit_code, aborted ? 1 : 0});
    g_notified_at = std::chrono::steady_clock::now();
  }
  size_t live() const override {
    return static_cast<size_t>(std::count(alive_.begin(), alive_.end(), true));
  }
  void stdin_write(int, std::string_view) override {}
  void stdin_close_all() override {}
  size_t stdin_backlog() const override { return 0; }
  std::string host_of_rank(int) const override { return "fakehost"; }
  std::string format_map() const override { return ""; }

 private:
  void exit(int rank, int generation, int status) {
    if (generation != generation_ || !alive_[static_cast<size_t>(rank)]) return;
    alive_[static_cast<size_t>(rank)] = false;
    WorkerExit e;
    e.rank = rank;
    e.pid = 1000 + rank;
    e.generation = generation;
    e.status = status;
    c_.listener.on_exit(e);
  }
  WorkerSetContext c_;
  std::vector<int> fails_;
  std::vector<GenerationInfo>* log_;
  JobMap map_;
  int generation_ = -1;
  std::vector<bool> alive_;
};

int run_job(int max_restarts, std::vector<int> fails, std::vector<GenerationInfo>* log,
            double failure_window = 0) {
  g_notices.clear();
  g_notified_at = g_signalled_at = {};
  LaunchConfig cfg;
  cfg.failure_window = failure_window;
  cfg.np = 3;
  cfg.program = "/bin/fake";
  cfg.max_restarts = max_restarts;
  cfg.kill_grace = 1;
  cfg.stdin_mode = StdinMode::None;
  WorkerSetSource src;
  src.make = [fails, log](const WorkerSetContext& c) -> std::unique_ptr<WorkerSet> {
    return std::make_unique<FakeWorkers>(c, fails, log);
  };
  JobController job(cfg, {}, map_single_node("fakehost", 3), std::move(src));
  return job.run();
}

}  // namespace

TEST(JobTest, AFailureRestartsTheGroupWhileTheBudgetLasts) {
  std::vector<GenerationInfo> log;
  EXPECT_EQ(run_job(2, {0, 1}, &log), 0);
  ASSERT_EQ(log.size(), 3u);
  for (int g = 0; g < 3; ++g) {
    EXPECT_EQ(log[g].generation, g);
    EXPECT_EQ(log[g].restart_count, g);
    EXPECT_EQ(log[g].max_restarts, 2);
    EXPECT_EQ(log[g].master_port, 29500);
  }
}

TEST(JobTest, WithoutBudgetTheJobFailsWithTheRanksStatus) {
  std::vector<GenerationInfo> log;
  EXPECT_EQ(run_job(1, {0, 1}, &log), 3);
  EXPECT_EQ(log.size(), 2u);
  log.clear();
  EXPECT_EQ(run_job(0, {}, &log), 0);
  EXPECT_EQ(log.size(), 1u);
}

// Before the others are stopped they are told (a PMIx event on every node), and with
// --failure-window they get that long.
TEST(JobTest, TheOthersHearOfAFailureAndGetTheWindow) {
  std::vector<GenerationInfo> log;
  EXPECT_EQ(run_job(0, {0}, &log), 3);
  ASSERT_EQ(g_notices.size(), 1u);
  EXPECT_EQ(g_notices[0], (std::array<int, 4>{0, 1, 3, 0}));
  EXPECT_LE(g_notified_at, g_signalled_at);
  EXPECT_EQ(run_job(1, {0}, &log, 0.3), 0);  // restarts too
  ASSERT_EQ(g_notices.size(), 1u);
  EXPECT_GE(g_signalled_at - g_notified_at, std::chrono::milliseconds(300));
}
