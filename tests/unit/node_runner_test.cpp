// The node runner, the one piece of code that starts a node's generation for both a single-node
// job and every pytorch_execd: the workers' specs from a NodeJob, and real workers started with
// what depends on the node (more ranks than processors: OMPI_MCA_mpi_yield_when_idle=1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "exec/node/node_runner.hpp"

extern char** environ;

using namespace pe;

namespace {

NodeJob job_of(int nranks, std::vector<std::string> args) {
  NodeJob j;
  j.job_id = "t";
  j.map = map_single_node("localhost", nranks);
  j.program = "/bin/sh";
  j.program_arg0 = "sh";
  j.args = std::move(args);
  j.wdir = "/";
  return j;
}

// Collects the workers' output and stops the loop when all have exited.
class Collect : public AgentListener {
 public:
  Collect(EventLoop& loop, int n) : loop_(loop), left_(n) {}
  void on_output(int, int, Stream, std::string_view lines) override { out += lines; }
  void on_exit(const WorkerExit& e) override {
    statuses.push_back(e.status);
    if (--left_ == 0) loop_.stop();
  }
  void on_abort(int, int, pid_t, int, const std::string&) override {}
  std::string out;
  std::vector<int> statuses;

 private:
  EventLoop& loop_;
  int left_;
};

std::vector<std::string> sorted_lines(const std::string& s) {
  std::vector<std::string> v;
  size_t at = 0;
  for (size_t nl; (nl = s.find('\n', at)) != std::string::npos; at = nl + 1)
    v.push_back(s.substr(at, nl - at));
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST(NodeRunnerTest, SpecsComeFromTheNodeJob) {
  NodeJob j = job_of(3, {"-c", "true", "--out=f_${local_rank}_${local_rank}.txt", "$$"});
  j.stdin_how = StdinHow::Forward;
  j.stdin_rank = 1;
  j.exports = {{"MINE", "x"}};
  NodeRunner r(j);
  GenerationInfo g;
  g.job_id = "t";
  g.generation = 2;
  auto specs = node_worker_specs(r.job(), {{"PATH", "/bin"}}, r.plan(), g);
  ASSERT_EQ(specs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& w = specs[static_cast<size_t>(i)];
    EXPECT_EQ(w.rank, i);
    EXPECT_EQ(w.spawn.path, "/bin/sh");
    // torchrun's ${local_rank} macro; "$$" stays (not torchrun's "$": mpirun's lines keep it).
    std::string l = std::to_string(i);
    EXPECT_EQ(w.spawn.argv, (std::vector<std::string>{"sh", "-c", "true",
                                                      "--out=f_" + l + "_" + l + ".txt", "$$"}));
    EXPECT_EQ(w.spawn.wdir, "/");
    EXPECT_EQ(w.spawn.stdin_pipe, i == 1);
    auto has = [&w](const std::string& kv) {
      return std::find(w.spawn.envp.begin(), w.spawn.envp.end(), kv) != w.spawn.envp.end();
    };
    EXPECT_TRUE(has("RANK=" + std::to_string(i)));
    EXPECT_TRUE(has("MINE=x"));
    EXPECT_TRUE(has("PATH=/bin"));
    EXPECT_TRUE(has("PYTORCH_EXEC_GENERATION=2"));
  }
  EXPECT_EQ(namespace_for(r.job().map, 0, g).nspace, "pytorch_exec.t.2");
}

// The regression this runner fixed: single-node jobs did not get the yield setting.  With it,
// the oversubscription settings mpirun gives its ranks.
TEST(NodeRunnerTest, MoreRanksThanProcessorsYield) {
  long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(ncpu, 0);
  for (int n : {1, static_cast<int>(ncpu) + 1}) {
    bool over = n > ncpu;
    NodeRunner r(job_of(n, {"-c",
                            "echo $RANK:${OMPI_MCA_mpi_yield_when_idle:-unset}:"
                            "${OMPI_MCA_mpi_oversubscribe:-unset}:"
                            "${OMPI_MCA_rmaps_base_oversubscribe:-unset}"}));
    EventLoop loop;
    Collect c(loop, n);
    r.open(loop, c, nullptr, "node_runner_test", environment_from(environ));
    GenerationInfo g;
    g.job_id = "t";
    g.generation = 1;
    r.start(g);
    Event timeout = loop.timer([&loop] { loop.stop(); });
    timeout.arm(30);
    loop.run();
    ASSERT_EQ(c.statuses.size(), static_cast<size_t>(n)) << "the workers did not all exit in 30 s";
    std::vector<std::string> want;
    for (int i = 0; i < n; ++i)
      want.push_back(std::to_string(i) + (over ? ":1:1:1" : ":unset:unset:unset"));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(sorted_lines(c.out), want) << n << " ranks on " << ncpu << " processors";
  }
}
