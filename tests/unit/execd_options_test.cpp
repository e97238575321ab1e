// The pytorch_execd command line: what pytorch_exec passes is understood, and every mistake is
// one UsageError naming the option.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "exec/daemon/execd_options.hpp"

using pe::ExecdRawOptions;

namespace {

ExecdRawOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "pytorch_execd");
  return pe::parse_execd_command_line(static_cast<int>(args.size()), args.data());
}

pe::DaemonOptions options(std::vector<const char*> args, const std::string& slurm_node = "s1") {
  return pe::validate_execd_options(parse(std::move(args)), slurm_node);
}

std::string usage_error(std::vector<const char*> args) {
  try {
    options(std::move(args));
  } catch (const pe::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ExecdOptionsTest, UnderstandsWhatPytorchExecPasses) {
  auto r = parse({"--connect", "10.0.0.1:5000,[::1]:5001", "--node", "n3", "--secret-stdin"});
  EXPECT_TRUE(r.secret_stdin);
  EXPECT_FALSE(r.slurm);
  auto o = pe::validate_execd_options(r, "unused");
  ASSERT_EQ(o.connect.size(), 2u);
  EXPECT_EQ(o.connect[0], (std::pair<std::string, int>{"10.0.0.1", 5000}));
  EXPECT_EQ(o.connect[1], (std::pair<std::string, int>{"[::1]", 5001}));
  EXPECT_EQ(o.node, "n3");
  EXPECT_DOUBLE_EQ(o.connect_timeout, 60.0);
}

TEST(ExecdOptionsTest, SlurmNamesTheNodeAndTimeoutsParse) {
  auto o = options({"--connect=h:1", "--slurm", "--connect-timeout", "2.5"}, "slurm-node");
  EXPECT_EQ(o.node, "slurm-node");
  EXPECT_DOUBLE_EQ(o.connect_timeout, 2.5);
  auto f = parse({"--connect", "h:1", "--node", "n", "--secret-file", "/run/s"});
  EXPECT_EQ(f.secret_file, "/run/s");
  EXPECT_TRUE(parse({"--help"}).help);
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"--version"}).version);
  EXPECT_NE(pe::execd_help_text().find("--connect-timeout"), std::string::npos);
}

TEST(ExecdOptionsTest, MistakesAreOneLineUsageErrors) {
  EXPECT_EQ(usage_error({"--node", "n"}), "--connect is required");
  EXPECT_EQ(usage_error({"--connect", "h:1"}), "--node NAME or --slurm is required");
  EXPECT_EQ(usage_error({"--connect", "h:1", "--node"}), "option --node needs a value");
  EXPECT_EQ(usage_error({"--connect"}), "option --connect needs a value");
  EXPECT_EQ(usage_error({"--bogus"}), "unknown option --bogus");
  EXPECT_EQ(usage_error({"--connect", "h:1", "--node", "n", "stray"}), "unknown argument 'stray'");
  EXPECT_EQ(usage_error({"--connect", "h", "--node", "n"}), "--connect: 'h' is not ADDR:PORT");
  EXPECT_EQ(usage_error({"--connect", ":5", "--node", "n"}), "--connect: ':5' is not ADDR:PORT");
  EXPECT_EQ(usage_error({"--connect", "h:70000", "--node", "n"}),
            "--connect: 'h:70000' is not ADDR:PORT");
  EXPECT_EQ(usage_error({"--connect", "h:1", "--node", "n", "--connect-timeout", "0"}),
            "--connect-timeout: '0' is not a number of seconds in (0, 3600]");
  EXPECT_EQ(usage_error({"--connect", "h:1", "--node", "n", "--connect-timeout", "5s"}),
            "--connect-timeout: '5s' is not a number of seconds in (0, 3600]");
  EXPECT_EQ(usage_error({"--slurm=yes"}), "option --slurm takes no value");
  for (const auto& e : {usage_error({"--node", "a", "--node", "b", "--connect", "h:1"}),
                        usage_error({"--bogus"}), usage_error({"--connect"})})
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}
