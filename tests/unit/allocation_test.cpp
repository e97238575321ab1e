#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <sstream>

#include "common/error.hpp"
#include "common/net.hpp"
#include "exec/frontend/allocation.hpp"
#include "exec/frontend/direct_launch.hpp"
#include "exec/frontend/job_map.hpp"
#include "pytorch_exec/version.h"

using pe::expand_hostlist;
using V = std::vector<std::string>;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const pe::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

pe::Allocation alloc(std::vector<pe::HostSlots> nodes) {
  pe::Allocation a;
  a.source = "test";
  a.limited = true;
  a.nodes = std::move(nodes);
  return a;
}

std::vector<std::vector<int>> ranks_per_node(const pe::JobMap& m) {
  std::vector<std::vector<int>> v;
  for (const auto& n : m.nodes) v.push_back(n.ranks);
  return v;
}

}  // namespace

TEST(HostlistTest, ExpandsRangesWithPaddingPrefixesAndSuffixes) {
  EXPECT_EQ(expand_hostlist("n[1-4,7]"), (V{"n1", "n2", "n3", "n4", "n7"}));
  EXPECT_EQ(expand_hostlist("gpu-[01-03]"), (V{"gpu-01", "gpu-02", "gpu-03"}));
  EXPECT_EQ(expand_hostlist("a[8-10]"), (V{"a8", "a9", "a10"}));
  EXPECT_EQ(expand_hostlist("a[1-2],b[3-4]"), (V{"a1", "a2", "b3", "b4"}));
  EXPECT_EQ(expand_hostlist("login,c[001-002]-ib"), (V{"login", "c001-ib", "c002-ib"}));
  EXPECT_EQ(expand_hostlist("r[1-2]n[1-2]"), (V{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_hostlist("single"), (V{"single"}));
}

TEST(HostlistTest, RejectsMalformedLists) {
  for (const char* bad : {"", "n[1-", "n1-2]", "n[[1]]", "n[]", "n[3-1]", "n[a-b]", "n[1-2-3]",
                          "a,,b", "n[-1]", "n[0-99999999999]"}) {
    std::string e = error_of([&] { expand_hostlist(bad); });
    EXPECT_EQ(e.rfind("hostlist", 0), 0u) << bad << ": " << e;
  }
}

TEST(CountsTest, ExpandsSlurmRepeatSyntax) {
  EXPECT_EQ(pe::expand_counts("SLURM_TASKS_PER_NODE", "2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(pe::expand_counts("X", "72(x2),36"), (std::vector<int>{72, 72, 36}));
  EXPECT_EQ(pe::expand_counts("X", "4"), (std::vector<int>{4}));
  for (const char* bad : {"", "2(x", "2(x0)", "x", "2(y3)", "-1", "1,,2"})
    EXPECT_NE(error_of([&] {
                pe::expand_counts("SLURM_TASKS_PER_NODE", bad);
              }).find("SLURM_TASKS_PER_NODE"),
              std::string::npos)
        << bad;
}

TEST(HostfileTest, ReadsOpenMpiFormsCommentsAndDuplicates) {
  std::istringstream in("# cluster\n\nn1 slots=2 max_slots=4\nn2:3   # fast one\nn3\nn1 slots=1\n");
  auto h = pe::parse_hostfile(in, "hf");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].host, "n1");
  EXPECT_EQ(h[0].slots, 3);
  EXPECT_EQ(h[1].slots, 3);
  EXPECT_EQ(h[2].slots, 1);
}

TEST(HostfileTest, ReportsTheLineOfAMistake) {
  std::istringstream bad("n1 slots=2\nn2 cpus=4\n");
  EXPECT_EQ(error_of([&] { pe::parse_hostfile(bad, "hf"); }),
            "hf:2: unknown 'cpus=4' (expected slots=N or max_slots=N)");
  std::istringstream bad2("n1 slots=x\n");
  EXPECT_EQ(error_of([&] { pe::parse_hostfile(bad2, "hf"); }), "hf:1: bad slot count 'x'");
  std::istringstream empty("# nothing\n");
  EXPECT_EQ(error_of([&] { pe::parse_hostfile(empty, "hf"); }), "hf: no hosts");
  std::istringstream badhost("n/1\n");
  EXPECT_NE(error_of([&] { pe::parse_hostfile(badhost, "hf"); }).find("bad host name"),
            std::string::npos);
  // Contradictions, and host names that a launch agent would take for options.
  std::istringstream twice("n1\nn2 slots=2 slots=3\n");
  EXPECT_EQ(error_of([&] { pe::parse_hostfile(twice, "hf"); }), "hf:2: slots given twice for n2");
  std::istringstream over("n1 max_slots=1 slots=4\n");
  EXPECT_EQ(error_of([&] { pe::parse_hostfile(over, "hf"); }),
            "hf:1: n1 has slots=4, more than max_slots=1");
  for (const char* h : {"-F.ssh-evil slots=1\n", "-oProxyCommand=x\n", ".n1\n"}) {
    std::istringstream opt(h);
    EXPECT_NE(error_of([&] { pe::parse_hostfile(opt, "hf"); }).find("bad host name"),
              std::string::npos)
        << h;
  }
  EXPECT_NE(error_of([] { pe::parse_host_list("-inf"); }).find("bad host name"), std::string::npos);
  // Not a hostfile: one line, whatever its size, and its bytes shown safely.
  std::istringstream zeros(std::string(1 << 20, '\0'));
  EXPECT_EQ(error_of([&] { pe::parse_hostfile(zeros, "hf"); }),
            "hf:1: a line longer than 65536 bytes (not a hostfile?)");
  std::istringstream binary(std::string("\x1b[2Jn\x01\n", 7));
  EXPECT_EQ(error_of([&] { pe::parse_hostfile(binary, "hf"); }),
            "hf:1: bad host name '\\x1b[2Jn\\x01'");
}

TEST(HostListOptionTest, AddsUpMentions) {
  auto h = pe::parse_host_list("a:1,b:3,a");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].slots, 2);
  EXPECT_EQ(h[1].slots, 3);
  EXPECT_NE(error_of([] { pe::parse_host_list("a:,b"); }).find("bad slot count"),
            std::string::npos);
  EXPECT_NE(error_of([] { pe::parse_host_list(",a"); }).find("bad host name"), std::string::npos);
}

TEST(SlurmTest, ReadsTheAllocationFromTheEnvironment) {
  auto a = pe::slurm_allocation({{"SLURM_JOB_NODELIST", "n[1-3]"},
                                 {"SLURM_TASKS_PER_NODE", "2(x2),1"},
                                 {"SLURM_JOB_ID", "42"}});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->source, "SLURM job 42");
  EXPECT_EQ(a->total_slots(), 5);
  EXPECT_EQ(a->nodes[2].host, "n3");
  auto cpus = pe::slurm_allocation({{"SLURM_NODELIST", "c1"}, {"SLURM_JOB_CPUS_PER_NODE", "8"}});
  EXPECT_EQ(cpus->total_slots(), 8);
  EXPECT_FALSE(pe::slurm_allocation({{"PATH", "/bin"}}));
  EXPECT_NE(
      error_of([] {
        pe::slurm_allocation({{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}});
      }).find("names 2 nodes but SLURM_JOB_NODELIST='n[1-3]' has 3"),
      std::string::npos);
}

TEST(SlurmTest, InAStepsShellTheJobsCpusAreTheSlots) {
  // srun -N1 -n1 --pty bash in salloc -N2: the step's task counts are no slots of the job.
  std::map<std::string, std::string> env{
      {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_TASKS_PER_NODE", "1"},
      {"SLURM_JOB_CPUS_PER_NODE", "2(x2)"}, {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_ID", "7"}};
  auto a = pe::slurm_allocation(env);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->nodes.size(), 2u);
  EXPECT_EQ(a->total_slots(), 4);
  env["SLURM_CPUS_PER_TASK"] = "2";  // one task per two processors
  EXPECT_EQ(pe::slurm_allocation(env)->total_slots(), 2);
  env["SLURM_NTASKS_PER_NODE"] = "3";  // the job's --ntasks-per-node
  EXPECT_EQ(pe::slurm_allocation(env)->total_slots(), 6);
  env["SLURM_STEP_ID"] = "4294967291";  // the batch step's shell: its tasks per node are the job's
  env["SLURM_TASKS_PER_NODE"] = "1(x2)";
  EXPECT_EQ(pe::slurm_allocation(env)->total_slots(), 2);
}

TEST(SlurmTest, HostsOfTheAllocationNamedWithHAreStartedWithSrun) {
  std::map<std::string, std::string> env{{"SLURM_JOB_NODELIST", "n[1-3]"},
                                         {"SLURM_TASKS_PER_NODE", "2(x3)"}};
  auto a = pe::find_allocation("n3:2,n1", "", env, "login");
  EXPECT_TRUE(a.slurm);
  EXPECT_EQ(a.source, "-H n3:2,n1");
  EXPECT_EQ(a.total_slots(), 3);
  EXPECT_FALSE(pe::find_allocation("n1,elsewhere", "", env, "login").slurm);
  EXPECT_FALSE(pe::find_allocation("n1", "", {}, "login").slurm);
}

TEST(PortTest, MasterPortsAreOutsideTheEphemeralRangeAndFreeWithTheNext) {
  // Issue 13, item 9: a port the kernel hands out for outgoing connections (the ephemeral range)
  // may be taken by any connection between the check and its use.
  auto [lo, hi] = pe::ephemeral_port_range();
  for (int i = 0; i < 20; ++i) {
    int p = pe::find_free_port("127.0.0.1");
    EXPECT_TRUE(p < lo - 1 || p > hi) << p;
    EXPECT_LT(p, 65535) << p;                 // p+1 (DataChannel's store) exists
    pe::listen_tcp("127.0.0.1", p, nullptr);  // both are free
    pe::listen_tcp("127.0.0.1", p + 1, nullptr);
  }
  for (const char* step : {"0", "1", "2", "3", "17"}) {
    int p = pe::step_master_port("4711", step);
    EXPECT_TRUE(p < lo - 1 || p > hi) << p;
    EXPECT_GE(p, 1024) << p;
  }
}

// Join mode's claim of the rendezvous port tells a listening socket from one only bound.
TEST(PortTest, ListenersAreToldFromBoundSockets) {
  int port = 0;
  {
    pe::UniqueFd l = pe::listen_tcp("0.0.0.0", 0, &port);
    EXPECT_TRUE(pe::port_has_listener(port));
  }
  EXPECT_FALSE(pe::port_has_listener(port));
  pe::UniqueFd bound(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(bound.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa), 0);
  EXPECT_FALSE(pe::port_has_listener(port));
  ASSERT_EQ(::listen(bound.get(), 1), 0);
  EXPECT_TRUE(pe::port_has_listener(port));
}

TEST(DirectLaunchTest, OnlyTasksOfNumberedStepsAreDirectLaunches) {
  for (const char* id : {"0", "1", "17", "4294967279"}) EXPECT_TRUE(pe::is_task_step_id(id)) << id;
  // interactive (salloc with use_interactive_step), batch, extern, pending, old batch; nonsense
  for (const char* id : {"4294967280", "4294967290", "4294967291", "4294967292", "4294967293",
                         "4294967294", "4294967295", "4294967296", "", "-1", "0x1", "batch"})
    EXPECT_FALSE(pe::is_task_step_id(id)) << id;
  pe::EnvMap task{{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "3"}, {"SLURM_JOB_NODELIST", "n[1-4]"}};
  EXPECT_TRUE(pe::is_step_task(task, ::getpid()));
  pe::EnvMap interactive = task;
  interactive["SLURM_STEP_ID"] = "4294967290";
  EXPECT_FALSE(pe::is_step_task(interactive, ::getpid()));
  pe::EnvMap no_step = task;
  no_step.erase("SLURM_STEP_ID");
  EXPECT_FALSE(pe::is_step_task(no_step, ::getpid()));
  pe::EnvMap no_task = task;
  no_task.erase("SLURM_PROCID");
  EXPECT_FALSE(pe::is_step_task(no_task, ::getpid()));
  pe::EnvMap our_worker = task;
  our_worker[PYTORCH_EXEC_ENV_JOBID] = "job";
  EXPECT_FALSE(pe::is_step_task(our_worker, ::getpid()));
}

// A child process whose stdin is `in` (once this returns), that waits until killed.
static pid_t child_reading(int in) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in, 0);
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c;
  (void)!::read(ready[0], &c, 1);
  ::close(ready[0]);
  ::close(ready[1]);
  return pid;
}

TEST(DirectLaunchTest, ACommandTypedInTheShellOfSrunPtyIsNoDirectLaunch) {
  // srun --pty bash: the step's task is the shell, on a terminal; what srun starts from it
  // carries SLURM_PTY_PORT too, as its own task or under a wrapper without a terminal.
  int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(terminal, 0);
  int null = ::open("/dev/null", O_RDONLY);
  pid_t shell = child_reading(terminal), wrapper = child_reading(null);
  ASSERT_GT(shell, 0);
  ASSERT_GT(wrapper, 0);
  pe::EnvMap env{{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_PTY_PORT", "40001"}};
  env["SLURM_TASK_PID"] = std::to_string(shell);
  EXPECT_FALSE(pe::is_step_task(env, ::getpid()));  // typed in the shell
  env["SLURM_TASK_PID"] = std::to_string(::getpid());
  EXPECT_TRUE(pe::is_step_task(env, ::getpid()));  // srun ... pytorch_exec from the shell
  env["SLURM_TASK_PID"] = std::to_string(wrapper);
  EXPECT_TRUE(pe::is_step_task(env, ::getpid()));  // srun ... bash -c '...; pytorch_exec ...'
  env.erase("SLURM_PTY_PORT");
  env["SLURM_TASK_PID"] = std::to_string(shell);
  EXPECT_TRUE(pe::is_step_task(env, ::getpid()));  // a task with its own terminal, no --pty
  for (pid_t p : {shell, wrapper}) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
  for (int fd : {master, terminal, null}) ::close(fd);
}

TEST(MapJobTest, FillsNodesBySlotOrRoundRobinByNode) {
  auto a = alloc({{"a", 1}, {"b", 3}});
  EXPECT_EQ(ranks_per_node(pe::map_job(a, {})), (std::vector<std::vector<int>>{{0}, {1, 2, 3}}));
  pe::MapRequest by_node;
  by_node.by_node = true;
  EXPECT_EQ(ranks_per_node(pe::map_job(a, by_node)),
            (std::vector<std::vector<int>>{{0}, {1, 2, 3}}));
  auto even = alloc({{"a", 2}, {"b", 2}});
  EXPECT_EQ(ranks_per_node(pe::map_job(even, by_node)),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  pe::MapRequest two;
  two.np = 2;
  auto m = pe::map_job(even, two);
  EXPECT_EQ(m.nodes.size(), 1u);  // nodes without ranks are left out
  EXPECT_EQ(m.ranks[1].local_rank, 1);
}

TEST(MapJobTest, EnforcesSlotsUnlessOversubscribed) {
  auto a = alloc({{"a", 2}, {"b", 2}});
  pe::MapRequest r;
  r.np = 5;
  EXPECT_EQ(error_of([&] { pe::map_job(a, r); }),
            "-n 5 but test has 4 slots (add --oversubscribe to place more ranks than slots)");
  r.oversubscribe = true;
  EXPECT_EQ(ranks_per_node(pe::map_job(a, r)), (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}}));
}

TEST(MapJobTest, NperNode) {
  auto a = alloc({{"a", 4}, {"b", 4}, {"c", 4}});
  pe::MapRequest r;
  r.npernode = 2;
  EXPECT_EQ(ranks_per_node(pe::map_job(a, r)),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  r.np = 3;
  EXPECT_EQ(ranks_per_node(pe::map_job(a, r)), (std::vector<std::vector<int>>{{0, 1}, {2}}));
  r.np = 7;
  EXPECT_NE(error_of([&] { pe::map_job(a, r); }).find("needs 4 nodes"), std::string::npos);
  r.np = 0;
  r.npernode = 5;
  EXPECT_NE(error_of([&] { pe::map_job(a, r); }).find("node a has 4 slot(s)"), std::string::npos);
}

TEST(RankfileTest, ReadsOpenMpisLinesInAnyOrder) {
  std::istringstream in(
      "# a rankfile\nrank 2=cc slot=1-2\n\n  rank 0 = aa  slot = 1:0-2 # first\n"
      "rank 1=+n1 slots=0:0,1\nrank 3=dd\n");
  auto v = pe::parse_rankfile(in, "rf");
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].host, "aa");
  EXPECT_EQ(v[0].slots, "1:0-2");
  EXPECT_EQ(v[0].line, 4);
  EXPECT_EQ(v[1].host, "+n1");
  EXPECT_EQ(v[1].slots, "0:0,1");
  EXPECT_EQ(v[2].host, "cc");
  EXPECT_EQ(v[3].slots, "");
}

TEST(RankfileTest, NamesTheLineOfAMistake) {
  auto err = [](const std::string& text) {
    std::istringstream in(text);
    return error_of([&] { pe::parse_rankfile(in, "rf"); });
  };
  EXPECT_NE(err("rank 0=a\nrnk 1=b\n").find("rf:2: 'rnk 1=b' is not a rankfile line"),
            std::string::npos);
  EXPECT_NE(err("rank x=a\n").find("rf:1: 'x' is not a rank number"), std::string::npos);
  EXPECT_NE(err("rank 0=a cpu=1\n").find("'cpu=1' is not slot=LIST"), std::string::npos);
  EXPECT_NE(err("rank 0=a slot=\n").find("slot= is empty"), std::string::npos);
  EXPECT_NE(err("rank 0=a;b\n").find("bad host name"), std::string::npos);
  EXPECT_NE(err("rank 0=a\nrank 0=b\n").find("rf:2: rank 0 is given twice (also on line 1)"),
            std::string::npos);
  EXPECT_NE(err("rank 0=a\nrank 2=b\n").find("rank 1 has no line"), std::string::npos);
  EXPECT_NE(err("# none\n").find("no rank lines"), std::string::npos);
}

TEST(RankfileTest, MapsRanksToTheNodesTheyName) {
  std::istringstream in("rank 0=b\nrank 1=a\nrank 2=+n1\nrank 3=localhost\n");
  auto lines = pe::parse_rankfile(in, "rf");
  auto a = alloc({{"a", 2}, {"b", 2}, {"me", 1}});
  auto m = pe::map_rankfile(a, lines, "rf", "me.cluster");
  EXPECT_EQ(ranks_per_node(m), (std::vector<std::vector<int>>{{1}, {0, 2}, {3}}));
  EXPECT_EQ(m.nodes[1].host, "b");
  EXPECT_EQ(m.ranks[2].node, 1);
  EXPECT_EQ(m.ranks[2].local_rank, 1);
  EXPECT_EQ(m.nodes[0].slots, 2);
  EXPECT_NE(error_of([&] { pe::map_rankfile(alloc({{"a", 2}, {"b", 2}}), lines, "rf", "x"); })
                .find("rf:4: host localhost is not in test"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pe::map_rankfile(alloc({{"b", 1}}), lines, "rf", "x"); })
                .find("rf:2: host a is not in test"),
            std::string::npos);
  std::istringstream far("rank 0=+n5\n");
  EXPECT_NE(error_of([&] { pe::map_rankfile(a, pe::parse_rankfile(far, "rf"), "rf", "me"); })
                .find("rf:1: +n5: test has 3 node(s), +n0 to +n2"),
            std::string::npos);
  // Without a host list: the rankfile's hosts are the nodes, this machine under any name one.
  pe::Allocation here;
  here.source = "this machine";
  here.nodes = {{"me", 0}};
  std::istringstream own("rank 0=c\nrank 1=localhost\nrank 2=me\nrank 3=c\n");
  auto m2 = pe::map_rankfile(here, pe::parse_rankfile(own, "rf"), "rf", "me");
  EXPECT_EQ(ranks_per_node(m2), (std::vector<std::vector<int>>{{1, 2}, {0, 3}}));
  EXPECT_EQ(m2.nodes[0].host, "me");
  EXPECT_EQ(m2.nodes[1].host, "c");
  EXPECT_EQ(m2.nodes[1].slots, 0);
}

TEST(LocalHostTest, RecognisesThisMachine) {
  EXPECT_TRUE(pe::is_local_host("localhost", "node7.cluster"));
  EXPECT_TRUE(pe::is_local_host("node7", "node7.cluster"));
  EXPECT_TRUE(pe::is_local_host("node7.cluster", "node7.cluster"));
  EXPECT_FALSE(pe::is_local_host("node8", "node7.cluster"));
}

TEST(LocalHostTest, NolocalLeavesThisMachineOut) {
  pe::Allocation a;
  a.source = "-H localhost:2,node8,node7";
  a.limited = true;
  a.nodes = {{"localhost", 2}, {"node8", 1}, {"node7", 3}};
  auto b = pe::without_local_host(a, "node7.cluster", false);
  ASSERT_EQ(b.nodes.size(), 1u);
  EXPECT_EQ(b.nodes[0].host, "node8");
  EXPECT_EQ(pe::format_allocation(b), "allocation (-H localhost:2,node8,node7): 1 node(s)\n"
                                      "  node8 slots=1\n");
  a.nodes = {{"node7", 2}};
  EXPECT_NE(error_of([&] { pe::without_local_host(a, "node7", false); })
                .find("--nolocal: -H localhost:2,node8,node7 lists no node but this machine (node7)"),
            std::string::npos);
  EXPECT_TRUE(pe::without_local_host(a, "node7", true).nodes.empty());  // an elastic job waits
  pe::Allocation here;  // this machine, no list
  here.source = "this machine";
  here.nodes = {{"node7", 0}};
  EXPECT_NE(error_of([&] { pe::without_local_host(here, "node7", true); })
                .find("no node is given but this machine"),
            std::string::npos);
  EXPECT_EQ(pe::format_allocation(here), "allocation (this machine): 1 node(s)\n"
                                         "  node7 slots=unlimited\n");
  // A rankfile's hosts, without a host list: the nodes to leave this machine out of.
  std::istringstream rf("rank 0=c\nrank 1=localhost\n");
  auto from_rankfile =
      pe::rankfile_allocation(here, pe::parse_rankfile(rf, "rf"), "rf", "node7.cluster");
  EXPECT_EQ(pe::format_allocation(from_rankfile), "allocation (--rankfile rf): 2 node(s)\n"
                                                  "  node7 slots=unlimited\n  c slots=unlimited\n");
  auto left = pe::without_local_host(from_rankfile, "node7.cluster", false);
  ASSERT_EQ(left.nodes.size(), 1u);
  EXPECT_EQ(left.nodes[0].host, "c");
}

TEST(LocalHostTest, OffersBridgeAndLoopbackAddressesLast) {
  std::vector<pe::InterfaceAddress> ifs{
      {"lo", "127.0.0.1", true},        {"docker0", "172.17.0.1", false},
      {"eth0", "10.0.0.5", false},      {"virbr0", "192.168.122.1", false},
      {"br-1a2b", "172.18.0.1", false}, {"ib0", "10.1.0.5", false},
      {"veth9", "169.254.1.1", false}};
  EXPECT_EQ(pe::order_addresses(ifs), (V{"10.0.0.5", "10.1.0.5", "172.17.0.1", "192.168.122.1",
                                         "172.18.0.1", "169.254.1.1", "127.0.0.1"}));
  EXPECT_EQ(pe::order_addresses({{"docker0", "172.17.0.1", false}}),
            V{"172.17.0.1"});  // still offered
}

TEST(LocalHostTest, RouteSourceIsTheAddressTheKernelSendsFrom) {
  EXPECT_EQ(pe::route_source_address("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(pe::route_source_address("127.3.4.5"), "127.0.0.1");
  EXPECT_EQ(pe::route_source_address("not-an-address"), "");
  auto own = pe::local_ipv4_addresses();
  EXPECT_EQ(pe::route_source_address(own[0]), own[0]);  // an address of ours is reached from itself
}
