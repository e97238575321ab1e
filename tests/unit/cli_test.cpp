#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/error.hpp"
#include "exec/frontend/cli.hpp"

using pe::LaunchConfig;
using pe::RawOptions;
using pe::StdinMode;

namespace {

RawOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "pytorch_exec");
  return pe::parse_command_line(static_cast<int>(args.size()), args.data());
}

LaunchConfig config(std::vector<const char*> args, pe::ValidationContext ctx = {}) {
  return pe::validate_options(parse(std::move(args)), ctx);
}

std::string usage_error(std::vector<const char*> args) {
  try {
    config(std::move(args));
  } catch (const pe::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(CliTest, OptionsStopAtTheProgram) {
  auto r = parse({"-n", "4", "python3", "-n", "1", "--tag-output", "x"});
  ASSERT_EQ(r.np, "4");
  EXPECT_FALSE(r.tag_output);
  EXPECT_EQ(r.command, (std::vector<std::string>{"python3", "-n", "1", "--tag-output", "x"}));
}

TEST(CliTest, DoubleDashEndsOptions) {
  auto r = parse({"-n", "2", "--", "-weird-program", "a"});
  EXPECT_EQ(r.command, (std::vector<std::string>{"-weird-program", "a"}));
}

TEST(CliTest, AcceptsEverySpellingOfTheProcessCount) {
  EXPECT_EQ(config({"-n", "3", "prog"}).np, 3);
  EXPECT_EQ(config({"-n3", "prog"}).np, 3);
  EXPECT_EQ(config({"-np", "5", "prog"}).np, 5);
  EXPECT_EQ(config({"--np", "6", "prog"}).np, 6);
  EXPECT_EQ(config({"--np=7", "prog"}).np, 7);
  EXPECT_EQ(config({"--nproc-per-node", "8", "prog"}).np, 8);
  EXPECT_EQ(config({"--nproc_per_node=9", "prog"}).np, 9);
}

TEST(CliTest, DefaultProcessCountComesFromTheContext) {
  pe::ValidationContext ctx;
  ctx.default_np = 12;
  EXPECT_EQ(config({"prog"}, ctx).np, 12);
}

TEST(CliTest, RejectsBadProcessCounts) {
  EXPECT_NE(usage_error({"-n", "0", "prog"}).find("-n: expected a positive integer, got '0'"),
            std::string::npos);
  EXPECT_NE(usage_error({"-n", "-2", "prog"}).find("got '-2'"), std::string::npos);
  EXPECT_NE(usage_error({"-n", "two", "prog"}).find("got 'two'"), std::string::npos);
  EXPECT_NE(usage_error({"-n", "99999999999999999999", "prog"}).find("-n:"), std::string::npos);
  EXPECT_NE(usage_error({"-n", "2", "--nproc-per-node", "3", "prog"}).find("disagree"),
            std::string::npos);
}

TEST(CliTest, ReportsUnknownOptionsAndMissingValues) {
  EXPECT_NE(usage_error({"--frobnicate", "prog"}).find("unknown option --frobnicate"),
            std::string::npos);
  EXPECT_NE(usage_error({"-j", "prog"}).find("unknown option -j"), std::string::npos);
  EXPECT_NE(usage_error({"-n"}).find("option -n needs a value"), std::string::npos);
  EXPECT_NE(usage_error({"--tag-output=yes", "prog"}).find("takes no value"), std::string::npos);
}

TEST(CliTest, EmptyValuesAreNamedByTheirOption) {
  EXPECT_EQ(usage_error({"-H", "", "prog"}), "-H: the host list is empty");
  EXPECT_EQ(usage_error({"--host=", "prog"}), "-H: the host list is empty");
  EXPECT_EQ(usage_error({"-H", "a", "-H", "", "prog"}), "-H: the host list is empty");
  // Several -H add up, as mpirun's.
  EXPECT_EQ(config({"-H", "a:2", "-H", "b,a", "prog"}).hosts, "a:2,b,a");
  EXPECT_EQ(usage_error({"--hostfile=", "prog"}), "--hostfile: the file name is empty");
  EXPECT_EQ(usage_error({"--launch-agent", "", "prog"}), "--launch-agent: the command is empty");
  EXPECT_EQ(usage_error({"--launch-agent", "\"\"", "prog"}),
            "--launch-agent: the command is empty");
  EXPECT_EQ(usage_error({"--wdir=", "prog"}), "--wdir: the directory name is empty");
  EXPECT_EQ(config({"--launch-agent", "ip netns exec {host}", "prog"}).launch_agent,
            "ip netns exec {host}");
  EXPECT_NE(
      usage_error({"-n", "2", "-n", "3", "prog"}).find("option -n or -c (--np) is given more than once"),
      std::string::npos);
}

TEST(CliTest, RequiresAProgram) {
  EXPECT_NE(usage_error({"-n", "2"}).find("no program given"), std::string::npos);
  EXPECT_NE(usage_error({"--", ""}).find("empty"), std::string::npos);
}

TEST(CliTest, AcceptsOversubscribe) {
  EXPECT_TRUE(config({"--oversubscribe", "-n", "64", "prog"}).oversubscribe);
  EXPECT_FALSE(config({"prog"}).oversubscribe);
}

TEST(CliTest, CountsVerbosity) {
  EXPECT_EQ(config({"-v", "prog"}).verbosity, 1);
  EXPECT_EQ(config({"-vv", "prog"}).verbosity, 2);
  EXPECT_EQ(config({"-v", "--verbose", "-v", "prog"}).verbosity, 3);
}

TEST(CliTest, MpirunsQuietAndDebugSetTheLogLevel) {
  EXPECT_EQ(config({"-q", "prog"}).verbosity, -1);
  EXPECT_EQ(config({"--quiet", "prog"}).verbosity, -1);
  EXPECT_EQ(config({"-d", "prog"}).verbosity, 2);
  EXPECT_EQ(config({"--debug-devel", "-vvv", "prog"}).verbosity, 3);
  EXPECT_NE(usage_error({"-q", "-v", "prog"}).find("-q (no warnings) and -v"), std::string::npos);
  EXPECT_NE(usage_error({"-d", "-q", "prog"}).find("and -d (more logging) disagree"),
            std::string::npos);
}

TEST(CliTest, MpirunsPrefix) {
  EXPECT_EQ(config({"--prefix", "/opt/ompi/", "prog"}).prefix, "/opt/ompi");
  EXPECT_EQ(config({"--prefix=/", "prog"}).prefix, "/");
  EXPECT_EQ(config({"--noprefix", "prog"}).prefix, "");
  EXPECT_NE(usage_error({"--prefix", "opt/ompi", "prog"}).find("'opt/ompi' is not an absolute path"),
            std::string::npos);
  EXPECT_NE(usage_error({"--prefix=", "prog"}).find("--prefix"), std::string::npos);
  EXPECT_NE(usage_error({"--prefix", "/a", "--noprefix", "prog"}).find("disagree"),
            std::string::npos);
  // The program is looked for in DIR/bin first, as the workers' PATH has it.
  char tmpl[] = "/tmp/pe_prefix_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, bin = dir + "/bin", prog = bin + "/only_here";
  ASSERT_EQ(::mkdir(bin.c_str(), 0755), 0);
  std::ofstream(prog) << "#!/bin/sh\n";
  ASSERT_EQ(::chmod(prog.c_str(), 0755), 0);
  pe::ValidationContext ctx;
  ctx.find_program = true;
  ctx.env["PATH"] = "/usr/bin:/bin";
  EXPECT_EQ(config({"--prefix", tmpl, "only_here"}, ctx).program, prog);
  EXPECT_THROW(config({"only_here"}, ctx), pe::ProgramError);
  // mpirun's --path: these directories before PATH (the workers' PATH unchanged).
  auto byp = config({"--path", ("/nonexistent:" + bin).c_str(), "only_here"}, ctx);
  EXPECT_EQ(byp.program, prog);
  EXPECT_EQ(byp.prefix, "");
  EXPECT_NE(usage_error({"--path=", "prog"}).find("--path: the directory list is empty"),
            std::string::npos);
  std::remove(prog.c_str());
  ::rmdir(bin.c_str());
  ::rmdir(tmpl);
}

TEST(CliTest, MpirunsAllocationOptions) {
  auto c = config({"--display-allocation", "--nolocal", "-H", "a,b", "prog"});
  EXPECT_TRUE(c.display_allocation);
  EXPECT_TRUE(c.nolocal);
  EXPECT_FALSE(config({"prog"}).nolocal);
  EXPECT_TRUE(config({"--map-by", "node:nolocal", "-H", "a,b", "prog"}).nolocal);
  EXPECT_TRUE(config({"--display-devel-map", "prog"}).display_map);
  EXPECT_NE(usage_error({"--nolocal", "--rdzv-endpoint", "h:1", "--rdzv-insecure", "prog"})
                .find("--nolocal: in join mode"),
            std::string::npos);
}

TEST(CliTest, MpirunsRankfile) {
  char tmpl[] = "/tmp/pe_rankfile_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(tmpl) << "rank 1=b slot=0:1\nrank 0=a slot=1\nrank 2=a\n";
  auto c = config({"-rf", tmpl, "prog"});
  EXPECT_EQ(c.np, 3);  // its ranks
  ASSERT_EQ(c.rankfile.size(), 3u);
  EXPECT_EQ(c.rankfile[1].slots, "0:1");
  EXPECT_EQ(c.rankfile_name, tmpl);
  EXPECT_EQ(config({"--rankfile", tmpl, "-n", "2", "prog"}).rankfile.size(), 2u);
  EXPECT_EQ(config({"--rankfile", tmpl, "--bind-to", "none", "prog"}).bind_to,
            pe::topo::BindTo::None);
  EXPECT_NE(usage_error({"--rankfile", tmpl, "-n", "4", "prog"})
                .find("-n 4: --rankfile " + std::string(tmpl) + " places 3 rank(s)"),
            std::string::npos);
  for (std::vector<const char*> other :
       {std::vector<const char*>{"--map-by", "core"}, {"--bind-to", "core"}, {"-N", "1"},
        {"--rank-by", "core"}, {"--cpus-per-rank", "2"}, {"--nnodes", "1:2"}})
    {
      other.insert(other.begin(), {"--rankfile", tmpl});
      other.push_back("prog");
      EXPECT_NE(usage_error(other).find("--rankfile places and binds every rank: "),
                std::string::npos)
          << other[2];
    }
  EXPECT_NE(usage_error({"--rankfile", tmpl, "-rf", tmpl, "prog"})
                .find("give either --rankfile or -rf, not both"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rankfile", tmpl, "--cpu-set", "0", "prog"})
                .find("--cpu-set and --rankfile both choose"),
            std::string::npos);
  std::ofstream(tmpl) << "rank 0=a slot=1:x\n";
  EXPECT_NE(usage_error({"--rankfile", tmpl, "prog"})
                .find(std::string(tmpl) + ":1: slot=1:x: only digits"),
            std::string::npos);
  std::remove(tmpl);
  EXPECT_NE(usage_error({"--rankfile", tmpl, "prog"}).find("--rankfile: cannot read"),
            std::string::npos);
}

TEST(CliTest, MpirunsCpuSetAndCpuList) {
  pe::ValidationContext ctx;
  ctx.count_cpu_set = [](const std::string& list, bool hwthreads) {
    return list == "0-3" ? (hwthreads ? 4 : 8) : 1;
  };
  auto c = config({"--cpu-set", "0-3", "prog"}, ctx);
  EXPECT_EQ(c.cpu_set, "0-3");
  EXPECT_EQ(c.np, 8);  // -n: the processors left
  EXPECT_EQ(config({"--cpu-set", "0-3", "-n", "2", "prog"}, ctx).np, 2);
  c = config({"--cpu-list", "1:0-3", "prog"});
  EXPECT_EQ(c.cpu_list, "1:0-3");
  EXPECT_FALSE(c.cpu_list_ordered);
  c = config({"--cpu-list", "0,2", "--bind-to", "cpu-list:ordered", "prog"});
  EXPECT_TRUE(c.cpu_list_ordered);
  EXPECT_EQ(c.bind_to, pe::topo::BindTo::Default);
  EXPECT_NE(usage_error({"--bind-to", "cpu-list", "prog"}).find("give it"), std::string::npos);
  EXPECT_NE(usage_error({"--cpu-list", "0", "--bind-to", "cpu-list:sorted", "prog"})
                .find("unknown qualifier 'sorted'"),
            std::string::npos);
  EXPECT_NE(usage_error({"--cpu-list", "0", "--bind-to", "core", "prog"})
                .find("--bind-to core contradicts it"),
            std::string::npos);
  EXPECT_NE(usage_error({"--cpu-list", "0", "--map-by", "slot:PE=2", "prog"})
                .find("PE=2 (or --cpus-per-rank) contradicts it"),
            std::string::npos);
  EXPECT_NE(usage_error({"--cpu-set", "0-", "prog"}).find("--cpu-set 0-: '0-' is not a number"),
            std::string::npos);
  EXPECT_NE(usage_error({"--cpu-list", "", "prog"}).find("--cpu-list: the list is empty"),
            std::string::npos);
  // The numbers are the whole node's: not within a --cpu-set.
  EXPECT_NE(usage_error({"--cpu-set", "0-3", "--cpu-list", "1", "prog"})
                .find("--cpu-set and --cpu-list both choose the ranks' processors: give one"),
            std::string::npos);
  std::string longer(5000, '1');
  EXPECT_NE(usage_error({"--cpu-list", longer.c_str(), "prog"})
                .find("--cpu-list: a processor list longer than 4096 characters"),
            std::string::npos);
  // One line, whatever was typed.
  std::string err = usage_error({"--cpu-set", "0\n1", "prog"});
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_NE(err.find("--cpu-set 0?1: only digits"), std::string::npos) << err;
}

TEST(CliTest, ExportsTakeValuesOrCopyThem) {
  pe::ValidationContext ctx;
  ctx.env["HOMEISH"] = "/h";
  auto c = config({"-x", "A=1", "-x", "HOMEISH", "-xB=x=y", "-x", "EMPTY=", "prog"}, ctx);
  std::vector<std::pair<std::string, std::string>> want{
      {"A", "1"}, {"HOMEISH", "/h"}, {"B", "x=y"}, {"EMPTY", ""}};
  EXPECT_EQ(c.exports, want);
}

TEST(CliTest, RejectsBadExports) {
  EXPECT_NE(usage_error({"-x", "=1", "prog"}).find("not a valid environment variable name"),
            std::string::npos);
  EXPECT_NE(usage_error({"-x", "1A=1", "prog"}).find("'1A'"), std::string::npos);
  EXPECT_NE(usage_error({"-x", "A-B=1", "prog"}).find("'A-B'"), std::string::npos);
  EXPECT_NE(usage_error({"-x", "NOT_SET_ANYWHERE", "prog"}).find("is not set here"),
            std::string::npos);
}

TEST(CliTest, MpirunsMcaAndRootOptions) {
  auto c = config({"--mca", "btl", "self,vader", "-x", "OMPI_MCA_pml=cm", "-mca", "pml", "ob1",
                   "--allow-run-as-root", "prog", "--mca", "a", "b"});
  std::vector<std::pair<std::string, std::string>> want{
      {"OMPI_MCA_pml", "cm"}, {"OMPI_MCA_btl", "self,vader"}, {"OMPI_MCA_pml", "ob1"}};
  EXPECT_EQ(c.exports, want);  // --mca after -x: its value wins
  EXPECT_EQ(c.args, (std::vector<std::string>{"--mca", "a", "b"}));  // the program's own
  EXPECT_NE(usage_error({"--mca", "btl"}).find("--mca needs two values: --mca KEY VALUE"),
            std::string::npos);
  EXPECT_NE(usage_error({"--mca=btl", "tcp", "prog"}).find("needs two values"), std::string::npos);
  EXPECT_NE(usage_error({"--mca", "a-b", "1", "prog"}).find("'a-b' is not an MCA parameter"),
            std::string::npos);
  EXPECT_NE(usage_error({"--mca", "", "1", "prog"}).find("not an MCA parameter"),
            std::string::npos);
  // --gmca: the same, after the --mca ones.
  auto g = config({"--gmca", "btl", "tcp", "--mca", "pml", "ob1", "prog"});
  std::vector<std::pair<std::string, std::string>> gwant{{"OMPI_MCA_pml", "ob1"},
                                                         {"OMPI_MCA_btl", "tcp"}};
  EXPECT_EQ(g.exports, gwant);
  EXPECT_NE(usage_error({"--gmca", "a-b", "1", "prog"}).find("--gmca: 'a-b' is not an MCA"),
            std::string::npos);
}

TEST(CliTest, RefusesMpirunsMultiProgramForm) {
  EXPECT_NE(usage_error({"-n", "1", "a", ":", "-n", "2", "b"}).find("(MPMD)"), std::string::npos);
  EXPECT_EQ(config({"prog", "a:b", "::"}).args, (std::vector<std::string>{"a:b", "::"}));
  EXPECT_EQ(config({"-n", "2", "--", "sh", "-c", ":"}).args,
            (std::vector<std::string>{"-c", ":"}));  // after --, the program's
}

TEST(CliTest, ParsesStdinTargets) {
  EXPECT_EQ(config({"prog"}).stdin_mode, StdinMode::OneRank);
  EXPECT_EQ(config({"prog"}).stdin_rank, 0);
  EXPECT_EQ(config({"--stdin", "none", "prog"}).stdin_mode, StdinMode::None);
  EXPECT_EQ(config({"--stdin", "all", "prog"}).stdin_mode, StdinMode::All);
  auto c = config({"-n", "4", "--stdin", "3", "prog"});
  EXPECT_EQ(c.stdin_mode, StdinMode::OneRank);
  EXPECT_EQ(c.stdin_rank, 3);
  EXPECT_NE(usage_error({"-n", "2", "--stdin", "2", "prog"}).find("rank 2 does not exist"),
            std::string::npos);
  EXPECT_NE(usage_error({"--stdin", "some", "prog"}).find("expected none, all or a rank"),
            std::string::npos);
}

TEST(CliTest, ParsesFailureHandlingOptions) {
  auto c = config({"--max-restarts", "3", "--kill-grace", "0.25", "prog"});
  EXPECT_EQ(c.max_restarts, 3);
  EXPECT_DOUBLE_EQ(c.kill_grace, 0.25);
  EXPECT_EQ(config({"prog"}).max_restarts, 0);
  EXPECT_DOUBLE_EQ(config({"prog"}).kill_grace, 5.0);
  EXPECT_NE(usage_error({"--max-restarts", "-1", "prog"}).find("non-negative"), std::string::npos);
  EXPECT_NE(usage_error({"--kill-grace", "soon", "prog"}).find("--kill-grace"), std::string::npos);
  EXPECT_NE(usage_error({"--kill-grace", "-1", "prog"}).find("--kill-grace"), std::string::npos);
  EXPECT_NE(usage_error({"--kill-grace", "nan", "prog"}).find("--kill-grace"), std::string::npos);
  EXPECT_DOUBLE_EQ(config({"prog"}).failure_window, 0.0);
  EXPECT_DOUBLE_EQ(config({"--failure-window", "1.5", "prog"}).failure_window, 1.5);
  EXPECT_NE(usage_error({"--failure-window", "-2", "prog"}).find("--failure-window"),
            std::string::npos);
}

TEST(CliTest, ParsesOutputOptions) {
  auto c = config({"--tag-output", "--timestamp-output", "--output-filename", "/tmp/o", "prog"});
  EXPECT_TRUE(c.tag_output);
  EXPECT_TRUE(c.timestamp_output);
  EXPECT_EQ(c.output_dir, "/tmp/o");
  EXPECT_TRUE(c.output_copy);
  auto n = config({"--output-filename", "out:nocopy", "prog"});
  EXPECT_EQ(n.output_dir, "out");
  EXPECT_FALSE(n.output_copy);
  EXPECT_NE(usage_error({"--output-filename", ":nocopy", "prog"}).find("empty"), std::string::npos);
}

// torchrun's logging options as torchtitan's and torchrun's documentation spell them.
TEST(CliTest, ParsesTorchrunsLogOptions) {
  auto c = config({"--local-ranks-filter", "0,2", "--role", "rank", "--tee", "3", "--log_dir",
                   "/tmp/l", "-r", "0:1,1:2", "--monitor-interval", "5", "--start_method",
                   "fork", "--shutdown-timeout", "7", "prog"});
  EXPECT_EQ(c.torch_logs.console_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(c.torch_logs.role, "rank");
  EXPECT_EQ(c.torch_logs.tee.of(5), 3);
  EXPECT_EQ(c.torch_logs.redirects.of(1), 2);
  EXPECT_EQ(c.torch_logs.log_dir, "/tmp/l");
  EXPECT_DOUBLE_EQ(c.kill_grace, 7);
  EXPECT_FALSE(config({"prog"}).torch_logs.files());
  // Empty values, as a wrapper's "$FILTER" gives them: no filter, an empty role (torchrun's).
  auto empty = config({"--local-ranks-filter", "", "--role", "", "prog"});
  EXPECT_TRUE(empty.torch_logs.console_ranks.empty());
  EXPECT_EQ(empty.torch_logs.role, "");
  // torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT: the default --kill-grace.
  pe::ValidationContext sd;
  sd.env = {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12"}};
  EXPECT_DOUBLE_EQ(config({"prog"}, sd).kill_grace, 12);
  EXPECT_DOUBLE_EQ(config({"--kill-grace", "2", "prog"}, sd).kill_grace, 2);
  sd.env = {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "x"}};
  EXPECT_THROW(config({"prog"}, sd), pe::UsageError);
  pe::ValidationContext ctx;
  ctx.env = {{"PET_TEE", "1"}, {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}|"}};
  auto e = config({"prog"}, ctx);
  EXPECT_EQ(e.torch_logs.tee.of(0), 1);
  EXPECT_EQ(e.torch_logs.prefix_template, "${rank}|");
  for (auto [args, want] : std::vector<std::pair<std::vector<const char*>, const char*>>{
           {{"--tee", "4", "prog"}, "--tee: expected 0, 1 (stdout), 2 (stderr), 3 (both)"},
           {{"-r", "x", "prog"}, "--redirects: expected"},
           {{"--local-ranks-filter", "0,a", "prog"}, "--local-ranks-filter: expected local ranks"},
           {{"--log-dir", "", "prog"}, "--log-dir: the directory name is empty"},
           {{"--tee", "3", "--output-filename", "o", "prog"}, "give one"},
           {{"--monitor-interval", "0", "prog"}, "--monitor-interval"},
           {{"--start-method", "thread", "prog"}, "--start-method: expected spawn, fork"},
           {{"--kill-grace", "1", "--shutdown-timeout", "2", "prog"}, "give one"}})
    EXPECT_NE(usage_error(args).find(want), std::string::npos) << usage_error(args);
}

TEST(CliTest, MappingChoicesBecomeEnums) {
  using pe::topo::BindTo;
  using pe::topo::MapBy;
  using pe::topo::RankBy;
  auto d = config({"prog"});
  EXPECT_EQ(d.map_by, MapBy::Default);
  EXPECT_EQ(d.rank_by, RankBy::Slot);
  EXPECT_EQ(d.bind_to, BindTo::Default);
  auto c = config({"--map-by", "numa", "--rank-by", "gpu", "--bind-to=core", "prog"});
  EXPECT_EQ(c.map_by, MapBy::Numa);
  EXPECT_EQ(c.rank_by, RankBy::Gpu);
  EXPECT_EQ(c.bind_to, BindTo::Core);
  for (MapBy m : pe::topo::kMapByChoices)
    EXPECT_EQ(config({"--map-by", pe::topo::to_string(m), "prog"}).map_by, m);
  for (RankBy r : pe::topo::kRankByChoices)
    EXPECT_EQ(config({"--rank-by", pe::topo::to_string(r), "prog"}).rank_by, r);
  for (BindTo b : pe::topo::kBindToChoices)
    EXPECT_EQ(config({"--bind-to", pe::topo::to_string(b), "prog"}).bind_to, b);
}

TEST(CliTest, RejectsBadMappingChoices) {
  EXPECT_EQ(usage_error({"--map-by", "diagonal", "prog"}),
            "--map-by: expected one of slot, node, numa, gpu, domain, core, hwthread, l3cache, "
            "socket, package or ppr:N:OBJECT, got 'diagonal'");
  EXPECT_EQ(usage_error({"--rank-by", "x", "prog"}),
            "--rank-by: expected one of slot, node, numa, gpu, domain, core, hwthread, l3cache, "
            "socket, got 'x'");
  EXPECT_EQ(usage_error({"--bind-to", "board", "prog"}),
            "--bind-to: expected one of none, core, numa, gpu, hwthread, l3cache, socket or "
            "package, got 'board'");
  EXPECT_EQ(usage_error({"--map-by", "default", "prog"}),
            "--map-by: expected one of slot, node, numa, gpu, domain, core, hwthread, l3cache, "
            "socket, package or ppr:N:OBJECT, got 'default'");
  EXPECT_EQ(usage_error({"--bind-to=", "prog"}),
            "--bind-to: expected one of none, core, numa, gpu, hwthread, l3cache, socket or "
            "package, got ''");
  EXPECT_EQ(usage_error({"--map-by", "ppr:0:socket", "prog"}),
            "--map-by ppr:0:socket: N is 1 to 4096 ranks per socket");
  EXPECT_EQ(usage_error({"--map-by", "ppr:2:gpu", "prog"}),
            "--map-by: expected ppr:N:OBJECT, N ranks per node, socket, numa, l3cache, core or "
            "hwthread, got 'ppr:2:gpu'");
  EXPECT_EQ(usage_error({"--map-by", "socket:span", "prog"}),
            "--map-by: unknown modifier 'span' in 'socket:span' (PE=n, oversubscribe, "
            "nooversubscribe and nolocal are known)");
  EXPECT_EQ(usage_error({"--map-by", "socket:PE=0", "prog"}),
            "--map-by: PE= takes a number of cores from 1 to 4096, got 'socket:PE=0'");
  EXPECT_EQ(usage_error({"--map-by", "core:PE=2", "prog"}),
            "--map-by core:PE=2: PE=n gives each rank n cores of a wider object: slot, node, "
            "numa, l3cache, socket or ppr:N:node|socket|numa|l3cache");
  EXPECT_EQ(usage_error({"--cpus-per-rank", "2", "--map-by", "hwthread", "prog"}),
            "--cpus-per-rank 2 with --map-by hwthread: PE=n gives each rank n cores of a wider "
            "object: slot, node, numa, l3cache, socket or ppr:N:node|socket|numa|l3cache");
  EXPECT_EQ(usage_error({"--bind-to", "core:sometimes", "prog"}),
            "--bind-to: unknown qualifier 'sometimes' in 'core:sometimes' (overload-allowed and "
            "if-supported are known)");
  EXPECT_EQ(usage_error({"--cpus-per-rank", "2", "--map-by", "socket:PE=3", "prog"}),
            "--cpus-per-rank 2 and --map-by socket:PE=3 disagree");
  EXPECT_EQ(usage_error({"--cpus-per-rank", "0", "prog"}).substr(0, 16), "--cpus-per-rank:");
  EXPECT_EQ(usage_error({"-n", "2", "-c", "3", "prog"}), "option -n or -c (--np) is given more than once");
  EXPECT_EQ(usage_error({"--hostfile", "a", "--machinefile", "b", "prog"}),
            "give either --hostfile or --machinefile, not both");
  EXPECT_EQ(usage_error({"--npersocket", "2", "--map-by", "core", "prog"}),
            "give either --npersocket or --map-by, not both");
  EXPECT_EQ(usage_error({"--oversubscribe", "--nooversubscribe", "prog"}),
            "--oversubscribe and --nooversubscribe contradict each other");
  EXPECT_EQ(usage_error({"--oversubscribe", "--map-by", "core:nooversubscribe", "prog"}),
            "--oversubscribe and --map-by core:nooversubscribe contradict each other");
  EXPECT_EQ(usage_error({"--pernode", "-N", "2", "prog"}), "--pernode and -N disagree");
  EXPECT_EQ(usage_error({"--npersocket", "2", "--pernode", "prog"}),
            "give one of --npersocket and --pernode, not both");
  EXPECT_EQ(usage_error({"--npersocket", "2", "-N", "4", "prog"}),
            "--npersocket sets the ranks per node: leave out -N");
  EXPECT_EQ(usage_error({"--cpus-per-proc", "2", "--map-by", "numa:PE=4", "prog"}),
            "--cpus-per-proc 2 and --map-by numa:PE=4 disagree");
}

// Open MPI's forms: ppr:N:OBJECT counts the objects of this machine, -c is numa:PE=n,
// --npersocket is ppr:N:socket, --pernode is -N 1, modifiers and qualifiers in any case.
TEST(CliTest, MpirunsMappingForms) {
  using pe::topo::BindTo;
  using pe::topo::MapBy;
  pe::ValidationContext ctx;
  ctx.default_np = 8;
  ctx.count_objects = [](MapBy kind) {
    return kind == MapBy::Socket ? 2 : kind == MapBy::Core ? 16 : 4;
  };
  auto cfg = [&ctx](std::vector<const char*> args) { return config(std::move(args), ctx); };
  auto c = cfg({"--map-by", "ppr:4:SOCKET:pe=2", "--bind-to", "Core:Overload-Allowed:if-supported",
                "prog"});
  EXPECT_EQ(c.map_by, MapBy::Ppr);
  EXPECT_EQ(c.ppr, 4);
  EXPECT_EQ(c.ppr_object, MapBy::Socket);
  EXPECT_EQ(c.pe, 2);
  EXPECT_EQ(c.bind_to, BindTo::Core);
  EXPECT_TRUE(c.bind_overload);
  EXPECT_EQ(c.np, 8);  // 4 per socket, 2 sockets
  EXPECT_TRUE(c.np_given);
  EXPECT_EQ(cfg({"-n", "3", "--map-by", "ppr:4:socket", "prog"}).np, 3);
  EXPECT_THROW(cfg({"-n", "9", "--map-by", "ppr:4:socket", "prog"}), pe::UsageError);
  EXPECT_THROW(cfg({"-N", "2", "--map-by", "ppr:4:socket", "prog"}), pe::UsageError);
  // On several nodes: ranks per node.
  auto h = cfg({"-H", "a:16,b:16", "--map-by", "ppr:1:core", "prog"});
  EXPECT_EQ(h.npernode, 16);
  EXPECT_EQ(cfg({"-H", "a:16,b:16", "--npersocket", "3", "prog"}).npernode, 6);
  auto p = cfg({"-H", "a:4,b:4", "--pernode", "prog"});
  EXPECT_EQ(p.npernode, 1);
  EXPECT_EQ(p.map_by, MapBy::Default);
  EXPECT_EQ(cfg({"--pernode", "prog"}).np, 1);
  EXPECT_EQ(cfg({"-c", "3", "prog"}).np, 3);  // mpirun's -c is -n
  EXPECT_EQ(parse({"-machinefile", "hosts", "prog"}).hostfile, "hosts");
  EXPECT_EQ(config({"-machinefile", "hosts", "prog"}).hostfile_option, "--machinefile");
  EXPECT_EQ(config({"--hostfile", "hosts", "prog"}).hostfile_option, "--hostfile");
  EXPECT_NE(usage_error({"--machinefile=", "prog"}).find("--machinefile: the file name is empty"),
            std::string::npos);
  auto m = cfg({"--cpus-per-rank", "4", "prog"});
  EXPECT_EQ(m.map_by, MapBy::Numa);
  EXPECT_EQ(m.pe, 4);
  EXPECT_EQ(cfg({"--cpus-per-proc", "2", "--map-by", "socket", "prog"}).pe, 2);
  EXPECT_EQ(cfg({"--map-by", "package", "prog"}).map_by, MapBy::Socket);
  EXPECT_EQ(cfg({"--bind-to", "package", "prog"}).bind_to, BindTo::Socket);
  EXPECT_TRUE(cfg({"--map-by", "slot:OVERSUBSCRIBE", "prog"}).oversubscribe);
  EXPECT_FALSE(cfg({"--nooversubscribe", "prog"}).oversubscribe);
  EXPECT_TRUE(cfg({"--use-hwthread-cpus", "--cpus-per-rank", "2", "prog"}).hwthread_cpus);
  // mpirun's older spellings.
  EXPECT_EQ(cfg({"--bynode", "prog"}).map_by, MapBy::Node);
  EXPECT_EQ(cfg({"-byslot", "prog"}).map_by, MapBy::Slot);
  EXPECT_EQ(cfg({"--bind-to-core", "prog"}).bind_to, BindTo::Core);
  EXPECT_EQ(cfg({"-bind-to-socket", "prog"}).bind_to, BindTo::Socket);
  EXPECT_THROW(cfg({"--bynode", "--map-by", "core", "prog"}), pe::UsageError);
  EXPECT_THROW(cfg({"--bind-to-core", "--bind-to", "none", "prog"}), pe::UsageError);
  EXPECT_THROW(cfg({"--bynode", "--byslot", "prog"}), pe::UsageError);
}

TEST(CliTest, WorkingDirectoriesHereAndOnOtherNodes) {
  pe::ValidationContext ctx;
  ctx.cwd = "/launch/dir";
  auto c = config({"prog"}, ctx);
  EXPECT_EQ(c.wdir, "");  // workers here inherit it
  EXPECT_EQ(c.remote_wdir, "/launch/dir");
  auto w = config({"--wdir", "rel", "prog"}, ctx);
  EXPECT_EQ(w.wdir, "rel");
  EXPECT_EQ(w.remote_wdir, "/launch/dir/rel");  // the daemons start elsewhere
  EXPECT_EQ(config({"--wdir", "/abs", "prog"}, ctx).remote_wdir, "/abs");
}

TEST(CliTest, FindsTheProgramOnlyWhenAsked) {
  std::string dir = ::testing::TempDir() + "/pe_validate";
  ::mkdir(dir.c_str(), 0755);
  std::string exe = dir + "/tool";
  std::ofstream(exe) << "#!/bin/sh\n";
  ::chmod(exe.c_str(), 0755);
  pe::ValidationContext ctx;
  ctx.env["PATH"] = "/nonexistent:" + dir;
  EXPECT_EQ(config({"tool"}, ctx).program, "tool");  // not asked: as typed
  ctx.find_program = true;
  EXPECT_EQ(config({"tool", "a"}, ctx).program, exe);
  EXPECT_EQ(config({"--dry-run", "no-such-tool-here"}, ctx).program, "no-such-tool-here");
  EXPECT_THROW(config({"no-such-tool-here"}, ctx), pe::ProgramError);
  // Every usage error comes before the program is looked for.
  EXPECT_THROW(config({"-n", "0", "no-such-tool-here"}, ctx), pe::UsageError);
}

TEST(CliTest, HelpListsEveryGroup) {
  std::string h = pe::help_text();
  for (const char* s : {"Processes:", "Environment:", "Output:", "Failure handling:", "Debugging:",
                        "--max-restarts", "--kill-grace", "--tag-output", "--stdin", "-x"})
    EXPECT_NE(h.find(s), std::string::npos) << s;
}

TEST(ResolveProgramTest, SearchesPathAndReportsWhyNot) {
  std::string dir = ::testing::TempDir() + "/pe_resolve";
  ::mkdir(dir.c_str(), 0755);
  std::string exe = dir + "/tool", plain = dir + "/data";
  std::ofstream(exe) << "#!/bin/sh\n";
  std::ofstream(plain) << "x\n";
  ::chmod(exe.c_str(), 0755);
  ::chmod(plain.c_str(), 0644);
  EXPECT_EQ(pe::resolve_program("tool", "", "/nonexistent:" + dir), exe);
  EXPECT_EQ(pe::resolve_program(exe, "", ""), exe);
  EXPECT_EQ(pe::resolve_program("./tool", dir, ""), dir + "/./tool");
  try {
    pe::resolve_program("no-such-tool-here", "", dir);
    FAIL() << "no error";
  } catch (const pe::ProgramError& e) {
    EXPECT_EQ(e.exit_status(), 127);
    EXPECT_NE(std::string(e.what()).find("not found in PATH"), std::string::npos);
  }
  try {
    pe::resolve_program(plain, "", "");
    FAIL() << "no error";
  } catch (const pe::ProgramError& e) {
    EXPECT_EQ(e.exit_status(), 126);
  }
  try {
    pe::resolve_program(dir, "", "");
    FAIL() << "no error";
  } catch (const pe::ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos);
  }
  // Relative to where pytorch_exec runs, the program is found in a relative --wdir, and named
  // so that the workers, which start in --wdir, run that file.
  char here[4096], tmp[4096];
  ASSERT_NE(::getcwd(here, sizeof here), nullptr);
  ASSERT_EQ(::chdir(::testing::TempDir().c_str()), 0);
  ASSERT_NE(::getcwd(tmp, sizeof tmp), nullptr);
  EXPECT_EQ(pe::resolve_program("./tool", "pe_resolve", ""),
            std::string(tmp) + "/pe_resolve/./tool");
  EXPECT_EQ(pe::resolve_program("tool", "", "pe_resolve"), std::string(tmp) + "/pe_resolve/tool");
  ASSERT_EQ(::chdir(here), 0);
  EXPECT_THROW(pe::resolve_program("tool", dir + "/missing", dir), pe::UsageError);
  EXPECT_THROW(pe::resolve_program("tool", exe, dir), pe::UsageError);
}

TEST(CliTest, ElasticNodeCounts) {
  auto c = config({"--nnodes", "2:4", "prog"});
  EXPECT_EQ(c.nnodes_min, 2);
  EXPECT_EQ(c.nnodes_max, 4);
  EXPECT_EQ(c.max_scale_events, -1);
  c = config({"--nnodes", "3", "--max-scale-events", "5", "prog"});
  EXPECT_EQ(c.nnodes_min, 3);
  EXPECT_EQ(c.nnodes_max, 3);
  EXPECT_EQ(c.max_scale_events, 5);
  EXPECT_EQ(config({"prog"}).nnodes_min, 0);
  for (const char* bad : {"0", "4:2", "2:", ":3", "x", "1:2:3", ""})
    EXPECT_NE(usage_error({"--nnodes", bad, "prog"}).find("--nnodes: expected N or MIN:MAX"),
              std::string::npos)
        << bad;
  EXPECT_EQ(usage_error({"--max-scale-events", "2", "prog"}),
            "--max-scale-events needs --nnodes MIN:MAX");
  EXPECT_EQ(usage_error({"--spares", "1", "prog"}), "--spares needs --nnodes MIN:MAX");
  EXPECT_EQ(config({"--nnodes", "2:3", "--spares", "2", "prog"}).spares, 2);
  // --nnodes-multiple K: MIN up and MAX down to multiples of K.
  c = config({"--nnodes", "3:9", "--nnodes-multiple", "2", "prog"});
  EXPECT_EQ(c.nnodes_min, 4);
  EXPECT_EQ(c.nnodes_max, 8);
  EXPECT_EQ(c.nnodes_multiple, 2);
  EXPECT_EQ(usage_error({"--nnodes", "3:3", "--nnodes-multiple", "2", "prog"}),
            "--nnodes 3:3 has no multiple of --nnodes-multiple 2");
  EXPECT_EQ(usage_error({"--nnodes-multiple", "2", "prog"}), "--nnodes-multiple needs --nnodes MIN:MAX");
  EXPECT_NE(usage_error({"--nnodes", "2:4", "--nnodes-multiple", "0", "prog"}).find("--nnodes-multiple"),
            std::string::npos);
  // Arrivals talk to the front end directly: it takes 2*(MAX+spares) nodes unless told.
  EXPECT_EQ(config({"prog"}).tree_radix, 32);
  EXPECT_EQ(config({"--nnodes", "2:4", "prog"}).tree_radix, 32);
  EXPECT_EQ(config({"--nnodes", "8:40", "--spares", "2", "prog"}).tree_radix, 84);
  EXPECT_EQ(config({"--nnodes", "8:4000", "prog"}).tree_radix, 1024);
  EXPECT_EQ(config({"--nnodes", "8:40", "--tree-radix", "4", "prog"}).tree_radix, 4);
  EXPECT_NE(usage_error({"--nnodes", "2:3", "--max-scale-events", "-1", "prog"})
                .find("--max-scale-events: expected a non-negative integer"),
            std::string::npos);
}

TEST(CliTest, HeartbeatAndArrivals) {
  auto c = config({"prog"});
  EXPECT_EQ(c.heartbeat_interval, 1.0);
  EXPECT_EQ(c.heartbeat_timeout, 3.0);
  EXPECT_EQ(c.last_call, 1.0);
  EXPECT_EQ(c.host_cooldown, 10.0);
  c = config({"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5", "prog"});
  EXPECT_EQ(c.heartbeat_interval, 0.2);
  EXPECT_EQ(c.heartbeat_timeout, 1.5);
  EXPECT_EQ(usage_error({"--heartbeat-interval", "3", "prog"}),
            "--heartbeat-timeout must be longer than --heartbeat-interval");
  EXPECT_EQ(usage_error({"--heartbeat-timeout", "0", "prog"}),
            "--heartbeat-timeout: '0' is not a number of seconds in (0, 3600]");
  c = config({"--nnodes", "1:4", "--host-discovery", "./list-hosts", "--host-discovery-interval",
              "5", "--last-call", "0", "--host-cooldown", "30", "prog"});
  EXPECT_EQ(c.host_discovery, "./list-hosts");
  EXPECT_EQ(c.discovery_interval, 5.0);
  EXPECT_EQ(c.last_call, 0.0);
  EXPECT_EQ(c.host_cooldown, 30.0);
  for (const char* opt :
       {"--host-discovery", "--host-discovery-interval", "--last-call", "--host-cooldown"})
    EXPECT_EQ(usage_error({opt, "1", "prog"}), std::string(opt) + " needs --nnodes MIN:MAX");
  EXPECT_EQ(usage_error({"--nnodes", "2", "--host-discovery", "", "prog"}),
            "--host-discovery: the command is empty");
  EXPECT_EQ(usage_error({"--nnodes", "2", "--last-call", "-1", "prog"}),
            "--last-call: '-1' is not a number of seconds in [0, 3600]");
}
