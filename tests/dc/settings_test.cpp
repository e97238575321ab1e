// Transport names in the settings of a process group: every name that Options or the environment
// (PYTORCH_DC_TRANSPORT, PYTORCH_DC_INTRA, PYTORCH_DC_INTER) gives is resolved once to a kind of
// the transport registry, and one that is unknown, not built or at the wrong level is an Error
// that names where it came from and what is accepted there.  Also the tcp transport's congestion
// control (PYTORCH_DC_TCP_CONGESTION), set on real loopback sockets, a thread's own wait mode
// (set_thread_spinning), and the processors that the cgroups' CPU quota allows (the automatic
// number of shm lanes).
#include <config.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <iterator>
#include <set>
#include <sstream>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "dc/bootstrap.hpp"
#include "dc/registry.hpp"
#include "dc/settings.hpp"
#include "dc/socket.hpp"
#include "dc/transport.hpp"
#include "testlib.hpp"

using namespace dctest;

namespace {

const char* const kVariables[] = {"PYTORCH_DC_TRANSPORT", "PYTORCH_DC_INTRA", "PYTORCH_DC_INTER"};

// Starts and ends every test with none of the transport variables set.
class TransportNames : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v : kVariables) ::unsetenv(v);
    ::unsetenv("PYTORCH_DC_TCP_CONGESTION");
  }
  // resolve_settings' error, "" when it resolves.
  static std::string error_of(const Options& o = {}) {
    try {
      resolve_settings(o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST_F(TransportNames, AnUnknownNameInAVariableIsAnErrorNamingTheVariable) {
  for (const char* v : kVariables) {
    ::setenv(v, "pigeon", 1);
    std::string e = error_of();
    ::unsetenv(v);
    EXPECT_TRUE(has(e, std::string(v) + "=pigeon")) << v << ": " << e;
    EXPECT_TRUE(has(e, "'pigeon' is unknown")) << v << ": " << e;
    EXPECT_TRUE(has(e, "tcp")) << v << ": the accepted names: " << e;
    EXPECT_EQ(has(e, "shm"), std::string(v) != "PYTORCH_DC_INTER") << v << ": " << e;
  }
}

TEST_F(TransportNames, AnUnknownNameInOptionsIsAnErrorNamingTheField) {
  Options o;
  o.intra = "pigeon";
  std::string e = error_of(o);
  EXPECT_TRUE(has(e, "Options::intra=pigeon") && has(e, "'pigeon' is unknown")) << e;
  EXPECT_TRUE(has(e, "shm, tcp")) << e;
  o.intra.clear();
  o.inter = "carrier-pigeon";
  e = error_of(o);
  EXPECT_TRUE(has(e, "Options::inter=carrier-pigeon")) << e;
  EXPECT_TRUE(has(e, "'carrier-pigeon' is unknown")) << e;
  EXPECT_TRUE(has(e, "takes tcp")) << e;
}

TEST_F(TransportNames, AnUnknownNameIsAnErrorEvenWhereAMoreSpecificSettingWins) {
  ::setenv("PYTORCH_DC_TRANSPORT", "pigeon", 1);
  ::setenv("PYTORCH_DC_INTRA", "tcp", 1);
  ::setenv("PYTORCH_DC_INTER", "tcp", 1);
  EXPECT_TRUE(has(error_of(), "PYTORCH_DC_TRANSPORT=pigeon")) << error_of();
  clear();
  ::setenv("PYTORCH_DC_INTER", "pigeon", 1);
  Options o;
  o.intra = o.inter = "tcp";
  EXPECT_TRUE(has(error_of(o), "PYTORCH_DC_INTER=pigeon")) << error_of(o);
}

TEST_F(TransportNames, ShmAcrossNodesIsAnErrorNamingWhereItCameFrom) {
  ::setenv("PYTORCH_DC_INTER", "shm", 1);
  std::string e = error_of();
  EXPECT_TRUE(has(e, "PYTORCH_DC_INTER=shm") && has(e, "only inside a node")) << e;
  clear();
  Options o;
  o.inter = "shm";
  e = error_of(o);
  EXPECT_TRUE(has(e, "Options::inter=shm") && has(e, "only inside a node")) << e;
}

TEST_F(TransportNames, KnownNamesResolveToTheirKinds) {
  ::setenv("PYTORCH_DC_TRANSPORT", "shm", 1);  // shm inside, tcp across
  Settings s = resolve_settings({});
  EXPECT_EQ(s.intra, TransportKind::Shm);
  EXPECT_EQ(s.inter, TransportKind::Tcp);
  ::setenv("PYTORCH_DC_TRANSPORT", "mpi", 1);
#ifdef HAVE_MPI
  s = resolve_settings({});
  EXPECT_EQ(s.intra, TransportKind::Mpi);
  EXPECT_EQ(s.inter, TransportKind::Mpi);
#else
  std::string e = error_of();
  EXPECT_TRUE(has(e, "PYTORCH_DC_TRANSPORT=mpi") && has(e, "built without")) << e;
#endif
  for (auto k : {TransportKind::Shm, TransportKind::Tcp, TransportKind::Mpi})
    EXPECT_EQ(transport_kind(transport_name(k)), k) << transport_name(k);
  EXPECT_FALSE(transport_kind("pigeon"));
  EXPECT_FALSE(transport_point_to_point(TransportKind::Shm));
}

TEST_F(TransportNames, AGroupWithAnUnknownTransportIsNotCreated) {
  Options o;
  o.intra = "pigeon";
  o.timeout = 20;
  try {
    ProcessGroup::threads(2, o);
    ADD_FAILURE() << "threads() created a group with transport 'pigeon'";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "Options::intra=pigeon")) << e.what();
  }
}

TEST_F(TransportNames, CongestionControlIsAutoUnlessNamed) {
  EXPECT_EQ(resolve_settings({}).tcp_congestion, "auto");
  ::setenv("PYTORCH_DC_TCP_CONGESTION", "reno", 1);
  EXPECT_EQ(resolve_settings({}).tcp_congestion, "reno");
  ::setenv("PYTORCH_DC_TCP_CONGESTION", "no such;name", 1);
  std::string e = error_of();
  EXPECT_TRUE(has(e, "PYTORCH_DC_TCP_CONGESTION=no such;name") && has(e, "cubic")) << e;
}

// The pipeline chunk of the hierarchical allreduce's cross-node step: 0 (one chunk) unless set.
TEST_F(TransportNames, PipelineBytesIsZeroUnlessSetAndMustBeANumber) {
  EXPECT_EQ(resolve_settings({}).pipeline_bytes, 0u);
  ::setenv("PYTORCH_DC_PIPELINE_BYTES", "65536", 1);
  EXPECT_EQ(resolve_settings({}).pipeline_bytes, 65536u);
  ::setenv("PYTORCH_DC_PIPELINE_BYTES", "lots", 1);
  std::string e = error_of();
  ::unsetenv("PYTORCH_DC_PIPELINE_BYTES");
  EXPECT_TRUE(has(e, "PYTORCH_DC_PIPELINE_BYTES=lots is not a non-negative number")) << e;
}

// A connected TCP socket over 127.0.0.1 (the accepted end is closed at the end of the test).
class CongestionControl : public ::testing::Test {
 protected:
  void SetUp() override {
    Listener l(0, "127.0.0.1");
    lfd_ = l.release();
    fd_ = connect_until("127.0.0.1", l.port(), Deadline::after(10.0, "connect"), "test");
    peer_ = ::accept(lfd_, nullptr, nullptr);
    ASSERT_GE(peer_, 0);
  }
  void TearDown() override {
    for (int fd : {fd_, peer_, lfd_})
      if (fd >= 0) ::close(fd);
  }
  bool set_raw(const std::string& name) {
    return ::setsockopt(fd_, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                        static_cast<socklen_t>(name.size())) == 0;
  }
  int lfd_ = -1, fd_ = -1, peer_ = -1;
};

TEST_F(CongestionControl, ANamedAlgorithmIsSetAndSystemLeavesItAlone) {
  set_congestion_control(fd_, "reno", "PYTORCH_DC_TCP_CONGESTION");  // always built, always allowed
  EXPECT_EQ(congestion_control(fd_), "reno");
  set_congestion_control(fd_, "system", "PYTORCH_DC_TCP_CONGESTION");
  EXPECT_EQ(congestion_control(fd_), "reno");
}

TEST_F(CongestionControl, AutoReplacesBbrOnly) {
  ASSERT_TRUE(set_raw("reno"));
  set_congestion_control(fd_, "auto", "PYTORCH_DC_TCP_CONGESTION");
  EXPECT_EQ(congestion_control(fd_), "reno");
  if (!set_raw("bbr")) GTEST_SKIP() << "this host does not let a process choose bbr (tcp_bbr)";
  set_congestion_control(fd_, "auto", "PYTORCH_DC_TCP_CONGESTION");
  std::string now = congestion_control(fd_);
  EXPECT_TRUE(now == "cubic" || now == "reno") << now;
}

TEST_F(CongestionControl, AnAlgorithmThatCannotBeUsedIsAnErrorNamingTheVariable) {
  try {
    set_congestion_control(fd_, "pigeon", "PYTORCH_DC_TCP_CONGESTION");
    ADD_FAILURE() << "no error for the congestion control 'pigeon'";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "PYTORCH_DC_TCP_CONGESTION=pigeon") && has(e.what(), "allowed"))
        << e.what();
  }
}

// set_thread_spinning(false) stops this thread's waits from polling, and only this thread's;
// true gives it the process's mode again (which a group may have turned off for all).
TEST(ThreadSpinning, IsPerThread) {
  bool process = busy_polling();
  set_thread_spinning(false);
  EXPECT_FALSE(busy_polling());
  bool other = !process;
  std::thread([&] { other = busy_polling(); }).join();
  EXPECT_EQ(other, process);
  set_thread_spinning(true);
  EXPECT_EQ(busy_polling(), process);
}

// The cgroups' CPU quota (the automatic count of shm lanes): the least along the path up to the
// root, in cgroup v2 and v1 layouts written here; then a real cgroup v1 or v2 with a quota of
// half a processor, which a child process joins (root only), on a machine of several.
void write_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(CgroupCpuLimit, TheLeastQuotaOnThePathToTheRoot) {
  std::string root = ::testing::TempDir() + "cg" + std::to_string(::getpid());
  write_file(root + "/cpu.max", "max 100000\n");
  write_file(root + "/a/cpu.max", "250000 100000\n");
  write_file(root + "/a/b/cpu.max", "max 100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("0::/a/b\n", root), 2.5);
  write_file(root + "/a/b/cpu.max", "50000 100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("0::/a/b\n", root), 0.5);
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("0::/\n", root), 0);  // the root sets none
  // v1: the cpu controller's hierarchy, mounted under its controllers' names
  write_file(root + "/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  write_file(root + "/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  write_file(root + "/cpu,cpuacct/x/cpu.cfs_quota_us", "150000\n");
  write_file(root + "/cpu,cpuacct/x/cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("5:memory:/x\n4:cpu,cpuacct:/x\n0::/\n", root), 1.5);
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("4:cpuacct:/x\n", root), 0);  // not the cpu controller
  // v1 with cpu and cpuacct mounted together as "cpu" alone
  std::string alone = root + "/alone";
  write_file(alone + "/cpu/y/cpu.cfs_quota_us", "300000\n");
  write_file(alone + "/cpu/y/cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("3:cpu,cpuacct:/y\n", alone), 3);
  // A cgroup whose directory is not in this view (a container without its own namespace): its
  // ancestors, up to the root of the view, still count.
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("0::/a/elsewhere/c\n", root), 2.5);
  write_file(root + "/a/cpu.max", "garbage\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("0::/a\n", root), 0);
  EXPECT_DOUBLE_EQ(cgroup_cpu_limit("", "/nonexistent"), 0);
  std::filesystem::remove_all(root);
}

TEST(CgroupCpuLimit, ARealCgroupsQuotaLimitsTheUsableProcessors) {
  // The cgroup file system that has the cpu controller: v1's own, or v2's root with "cpu"
  // enabled for its children.
  std::string base, quota_file, quota;
  std::istringstream enabled(first_line("/sys/fs/cgroup/cgroup.subtree_control"));
  std::set<std::string> v2(std::istream_iterator<std::string>(enabled), {});
  if (std::filesystem::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")) {
    base = "/sys/fs/cgroup/cpu";
    quota_file = "cpu.cfs_quota_us";
    quota = "50000";
  } else if (v2.count("cpu")) {
    base = "/sys/fs/cgroup";
    quota_file = "cpu.max";
    quota = "50000 100000";
  } else {
    GTEST_SKIP() << "no cgroup file system with the cpu controller here";
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  if (CPU_COUNT(&set) < 2)
    GTEST_SKIP() << "one processor to run on: a quota of one cannot be told from it";
  std::string name = "pytorch_dc_test." + std::to_string(::getpid()), dir = base + "/" + name;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  if (::mkdir(dir.c_str(), 0755) != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    GTEST_SKIP() << "cannot make a cgroup (" << std::strerror(errno) << "): needs root";
  }
  struct Remove {  // the cgroup, once its process has left (it has, when waited for)
    std::string dir;
    ~Remove() {
      for (int i = 0; i < 100 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } remove{dir};
  std::ofstream(dir + "/" + quota_file) << quota << "\n";
  if (first_line(dir + "/" + quota_file).rfind(quota, 0) != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    GTEST_SKIP() << "this kernel does not take a CPU quota in " << dir;
  }
  pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    ::close(fds[0]);
    std::ofstream(dir + "/cgroup.procs") << ::getpid() << "\n";
    std::ifstream f("/proc/self/cgroup");
    std::stringstream text;
    text << f.rdbuf();
    // -1: it could not join the cgroup (so it says nothing about the quota)
    double cpus = text.str().find("/" + name) == std::string::npos ? -1 : usable_cpus();
    ssize_t ignored = ::write(fds[1], &cpus, sizeof cpus);
    (void)ignored;
    ::_exit(0);
  }
  ::close(fds[1]);
  double cpus = 0;
  ssize_t got = ::read(fds[0], &cpus, sizeof cpus);
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof cpus)) << "the child said nothing";
  if (cpus < 0) GTEST_SKIP() << "a process cannot join a new cgroup here";
  EXPECT_EQ(cpus, 1.0) << "half a processor of quota, rounded up, for a process that may run on "
                       << CPU_COUNT(&set);
}

}  // namespace
