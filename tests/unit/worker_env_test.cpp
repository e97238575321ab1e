#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "exec/frontend/job_map.hpp"
#include "exec/node/worker_env.hpp"

namespace {

pe::GenerationInfo gen() {
  pe::GenerationInfo g;
  g.job_id = "abc123";
  g.generation = 2;
  g.restart_count = 2;
  g.max_restarts = 5;
  g.master_addr = "10.1.2.3";
  g.master_port = 29500;
  return g;
}

}  // namespace

TEST(JobMapTest, SingleNodeMapsEveryRankInOrder) {
  auto m = pe::map_single_node("h", 3);
  EXPECT_EQ(m.world_size, 3);
  ASSERT_EQ(m.nodes.size(), 1u);
  EXPECT_EQ(m.nodes[0].ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(m.ranks[2].local_rank, 2);
}

TEST(WorkerEnvTest, SetsTheTorchrunAndOpenMpiNames) {
  auto m = pe::map_single_node("h", 4);
  auto env = pe::worker_environment({{"PATH", "/bin"}}, {}, "", m, 3, gen());
  std::map<std::string, std::string> want{{"RANK", "3"},
                                          {"WORLD_SIZE", "4"},
                                          {"LOCAL_RANK", "3"},
                                          {"LOCAL_WORLD_SIZE", "4"},
                                          {"GROUP_RANK", "0"},
                                          {"GROUP_WORLD_SIZE", "1"},
                                          {"ROLE_NAME", "default"},
                                          {"ROLE_RANK", "3"},
                                          {"ROLE_WORLD_SIZE", "4"},
                                          {"MASTER_ADDR", "10.1.2.3"},
                                          {"MASTER_PORT", "29500"},
                                          {"TORCHELASTIC_RESTART_COUNT", "2"},
                                          {"TORCHELASTIC_MAX_RESTARTS", "5"},
                                          {"TORCHELASTIC_RUN_ID", "abc123"},
                                          {"OMP_NUM_THREADS", "1"},
                                          {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                                          {"OMPI_COMM_WORLD_RANK", "3"},
                                          {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_NODE_RANK", "3"},
                                          {"PYTORCH_EXEC_JOBID", "abc123"},
                                          {"PYTORCH_EXEC_GENERATION", "2"},
                                          {"PYTORCH_EXEC_NODEID", "0"},
                                          {"PYTORCH_EXEC_DOMAIN", "0"},
                                          {"PATH", "/bin"}};
  EXPECT_EQ(env, want);
}

TEST(WorkerEnvTest, SaysTheStoreIsTheLaunchersOnlyWhenItIs) {
  auto m = pe::map_single_node("h", 1);
  auto g = gen();
  g.agent_store = true;
  EXPECT_EQ(pe::worker_environment({}, {}, "", m, 0, g)["TORCHELASTIC_USE_AGENT_STORE"], "True");
  // Not hosted (srun direct launch): not even a value inherited from an outer torchrun.
  g.agent_store = false;
  EXPECT_EQ(pe::worker_environment({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}, {}, "", m, 0, g)
                .count("TORCHELASTIC_USE_AGENT_STORE"),
            0u);
}

TEST(WorkerEnvTest, KeepsTheUsersThreadCountAndRunId) {
  auto m = pe::map_single_node("h", 1);
  auto g = gen();
  g.run_id = "myrun";
  auto env = pe::worker_environment(
      {{"OMP_NUM_THREADS", "8"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, {}, "", m, 0, g);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "8");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "myrun");
  auto env2 = pe::worker_environment({}, {{"OMP_NUM_THREADS", "2"}}, "", m, 0, g);
  EXPECT_EQ(env2["OMP_NUM_THREADS"], "2");
}

TEST(WorkerEnvTest, OversubscribedNodesMakeOpenMpiYieldAndSaySo) {
  auto m = pe::map_single_node("h", 2);
  auto g = gen();
  EXPECT_EQ(pe::worker_environment({}, {}, "", m, 0, g).count("OMPI_MCA_mpi_yield_when_idle"), 0u);
  EXPECT_EQ(pe::worker_environment({}, {}, "", m, 0, g).count("OMPI_MCA_mpi_oversubscribe"), 0u);
  EXPECT_EQ(pe::worker_environment({}, {}, "", m, 0, g).count("OMPI_MCA_rmaps_base_oversubscribe"),
            0u);
  g.oversubscribed = true;
  auto env = pe::worker_environment({}, {}, "", m, 0, g);
  EXPECT_EQ(env["OMPI_MCA_mpi_yield_when_idle"], "1");
  // As mpirun says it.
  EXPECT_EQ(env["OMPI_MCA_mpi_oversubscribe"], "1");
  EXPECT_EQ(env["OMPI_MCA_rmaps_base_oversubscribe"], "1");
  EXPECT_EQ(pe::worker_environment({{"OMPI_MCA_mpi_yield_when_idle", "0"}}, {}, "", m, 0,
                                   g)["OMPI_MCA_mpi_yield_when_idle"],
            "0");
}

TEST(WorkerEnvTest, GivesTheGenerationsDataChannelToken) {
  auto m = pe::map_single_node("h", 2);
  auto g = gen();
  EXPECT_EQ(
      pe::worker_environment({{"PYTORCH_DC_TOKEN", "mine"}}, {}, "", m, 0, g)["PYTORCH_DC_TOKEN"],
      "mine");  // none from the launcher (srun direct launch): the user's stays
  g.dc_token = "0123abcd";
  EXPECT_EQ(
      pe::worker_environment({{"PYTORCH_DC_TOKEN", "mine"}}, {}, "", m, 1, g)["PYTORCH_DC_TOKEN"],
      "0123abcd");
}

TEST(WorkerEnvTest, ExportsOverrideTheBaseButNotOurNames) {
  auto m = pe::map_single_node("h", 2);
  auto env = pe::worker_environment({{"A", "base"}, {"RANK", "77"}},
                                    {{"A", "exported"}, {"RANK", "99"}}, "", m, 1, gen());
  EXPECT_EQ(env["A"], "exported");
  EXPECT_EQ(env["RANK"], "1");
}

TEST(WorkerEnvTest, EnvpRoundTrips) {
  char a[] = "X=1", b[] = "Y=a=b", c[] = "NOEQUALS";
  char* envp[] = {a, b, c, nullptr};
  auto env = pe::environment_from(envp);
  EXPECT_EQ(env.size(), 2u);
  EXPECT_EQ(env["Y"], "a=b");
  EXPECT_EQ(pe::to_envp(env), (std::vector<std::string>{"X=1", "Y=a=b"}));
}

#include "pmix_rdzv/ompi_env.hpp"

TEST(OmpiEnvTest, SelectsThePmixPathAndKeepsSessionFilesInOurDirectory) {
  auto env = pe::pmix::open_mpi_environment({"ns.0", "/tmp/pe.x", 6});
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m["JSM_JSRUN_PORT"], "1");
  EXPECT_EQ(m.count("OMPI_MCA_orte_local_daemon_uri"), 0u);  // would hide Open MPI's errors
  EXPECT_EQ(m["OMPI_MCA_pmix"], "^s1,s2,cray,isolated");
  EXPECT_EQ(m["OMPI_MCA_orte_tmpdir_base"], "/tmp/pe.x");
  EXPECT_EQ(m["OMPI_UNIVERSE_SIZE"], "6");
  EXPECT_EQ(m.count("OMPI_MCA_btl_vader_backing_directory"), 0u);
  // With a directory in /dev/shm, the shared-memory segments go there (removed at the end).
  env = pe::pmix::open_mpi_environment({"ns.0", "/tmp/pe.x", 6, "/dev/shm/pe.y"});
  m = std::map<std::string, std::string>(env.begin(), env.end());
  EXPECT_EQ(m["OMPI_MCA_btl_vader_backing_directory"], "/dev/shm/pe.y");
}

TEST(WorkerEnvTest, PrefixGoesFirstInPathAndLibraryPath) {
  pe::JobMap m = pe::map_single_node("h", 2);
  char tmpl[] = "/tmp/pe_prefix_env_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  auto env = pe::worker_environment({{"PATH", "/usr/bin:/bin"}}, {{"LD_LIBRARY_PATH", "/x"}}, dir,
                                    m, 0, gen());
  EXPECT_EQ(env["PATH"], dir + "/bin:/usr/bin:/bin");
  EXPECT_EQ(env["LD_LIBRARY_PATH"], dir + "/lib:/x");  // after -x: the prefix's first
  // DIR/lib64 too where this machine has it; none before: no empty entry.
  ASSERT_EQ(::mkdir((dir + "/lib64").c_str(), 0755), 0);
  env = pe::worker_environment({}, {}, dir, m, 1, gen());
  EXPECT_EQ(env["PATH"], dir + "/bin");
  EXPECT_EQ(env["LD_LIBRARY_PATH"], dir + "/lib64:" + dir + "/lib");
  ::rmdir((dir + "/lib64").c_str());
  ::rmdir(tmpl);
  // No prefix: nothing added.
  EXPECT_EQ(
      pe::worker_environment({{"PATH", "/bin"}}, {}, "", m, 0, gen()).count("LD_LIBRARY_PATH"), 0u);
}
