#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "common/line_buffer.hpp"
#include "exec/frontend/failure.hpp"
#include "exec/frontend/stdio.hpp"
#include "exec/node/error_file.hpp"

using pe::Stream;

TEST(LineBufferTest, PassesOnlyWholeLines) {
  pe::LineBuffer b;
  EXPECT_EQ(b.append("ab", 2), "");
  EXPECT_EQ(b.append("c\nde", 4), "abc\n");
  EXPECT_EQ(b.append("f\ng\nh", 5), "def\ng\n");
  EXPECT_EQ(b.take_rest(), "h");
  EXPECT_TRUE(b.empty());
}

TEST(LineBufferTest, SplitsOverlongLines) {
  pe::LineBuffer b;
  std::string big(pe::LineBuffer::kMaxLine + 10, 'x');
  EXPECT_EQ(b.append(big.data(), big.size()).size(), pe::LineBuffer::kMaxLine);
  EXPECT_EQ(b.take_rest().size(), 10u);
}

TEST(OutputFormatTest, TagsLikeOpenMpi) {
  pe::OutputOptions o;
  o.tag = true;
  EXPECT_EQ(pe::line_prefix(o, 0, 3, Stream::Out, ""), "[1,3]<stdout>:");
  EXPECT_EQ(pe::line_prefix(o, 1, 0, Stream::Err, ""), "[2,0]<stderr>:");
  EXPECT_EQ(pe::prefix_lines("a\nbb\n", "[1,3]<stdout>:"), "[1,3]<stdout>:a\n[1,3]<stdout>:bb\n");
}

TEST(OutputFormatTest, SpawnedFilesAreNamedAsTheirTag) {
  pe::OutputOptions o;
  o.tag = true;
  EXPECT_EQ(pe::line_prefix(o, 1, 2, Stream::Out, "", 3), "[2.3,2]<stdout>:");
  EXPECT_EQ(pe::spawned_output_dir("out", 1, 3, 2), "out/2.3/rank.2");
}

TEST(OutputFormatTest, TimestampsAreIsoWithMicroseconds) {
  struct timespec ts {};
  ts.tv_sec = 0;
  ts.tv_nsec = 123456789;
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(pe::format_timestamp(ts), "[1970-01-01T00:00:00.123456]");
  pe::OutputOptions o;
  o.timestamp = true;
  EXPECT_EQ(pe::line_prefix(o, 0, 1, Stream::Out, "[T]"), "[T] ");
  o.tag = true;
  EXPECT_EQ(pe::line_prefix(o, 0, 1, Stream::Out, "[T]"), "[T][1,1]<stdout>:");
}

TEST(OutputFormatTest, LastLines) {
  EXPECT_EQ(pe::last_lines("a\nb\nc\n", 2), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(pe::last_lines("a\nb", 5), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(pe::last_lines("", 3).empty());
}

TEST(OutputSinkTest, WritesTaggedLinesAndKeepsTheStderrTail) {
  int out[2], err[2];
  ASSERT_EQ(pipe(out), 0);
  ASSERT_EQ(pipe(err), 0);
  pe::OutputOptions o;
  o.tag = true;
  pe::OutputSink sink(o, 2, out[1], err[1]);
  sink.write(0, 1, Stream::Out, "hello\n");
  for (int i = 0; i < 20; ++i) sink.write(0, 1, Stream::Err, "e" + std::to_string(i) + "\n");
  char buf[256] = {};
  ASSERT_GT(read(out[0], buf, sizeof buf - 1), 0);
  EXPECT_STREQ(buf, "[1,1]<stdout>:hello\n");
  auto tail = sink.stderr_tail(1, 3);
  EXPECT_EQ(tail, (std::vector<std::string>{"e17", "e18", "e19"}));
  EXPECT_TRUE(sink.stderr_tail(0, 3).empty());
  sink.clear_tails();
  EXPECT_TRUE(sink.stderr_tail(1, 3).empty());
  for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
}

std::string drain(int fd) {
  std::string got;
  char buf[256];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  return got;
}

// Partial lines (the agent's, after kPartialHold or at exit): a rank's rest goes on its line
// unless another's output came in between (then the line is ended first); with prefixes the
// last partial line is ended at the end, without them one rank's bytes stay as they are.  pytorch_exec's own lines start a line of their own.
TEST(OutputSinkTest, PartialLines) {
  for (bool tag : {false, true}) {
    int out[2], err[2];
    ASSERT_EQ(pipe2(out, O_NONBLOCK), 0);
    ASSERT_EQ(pipe2(err, O_NONBLOCK), 0);
    pe::OutputOptions o;
    o.tag = tag;
    pe::OutputSink sink(o, 2, out[1], err[1]);
    sink.write(0, 0, Stream::Out, "prompt> ");
    sink.write(0, 0, Stream::Out, "answer\na");
    sink.write(0, 1, Stream::Out, "b\n");
    sink.write(0, 0, Stream::Out, "c");
    sink.write(0, 1, Stream::Err, "err");
    sink.message("pytorch_exec: note\n");
    sink.flush();
    if (tag) {
      EXPECT_EQ(drain(out[0]),
                "[1,0]<stdout>:prompt> answer\n[1,0]<stdout>:a\n[1,1]<stdout>:b\n"
                "[1,0]<stdout>:c\n");
      EXPECT_EQ(drain(err[0]), "[1,1]<stderr>:err\npytorch_exec: note\n");
    } else {
      EXPECT_EQ(drain(out[0]), "prompt> answer\na\nb\nc");
      EXPECT_EQ(drain(err[0]), "err\npytorch_exec: note\n");
    }
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
  }
  EXPECT_EQ(pe::prefix_lines("a\nb", "P:", true), "a\nP:b");
  // stdout and stderr on one pipe (2>&1): a line of either stream ends the other's partial one.
  int both[2];
  ASSERT_EQ(pipe2(both, O_NONBLOCK), 0);
  pe::OutputSink sink({}, 2, both[1], both[1]);
  sink.write(0, 0, Stream::Out, "Enter: ");
  sink.write(0, 1, Stream::Err, "warning\n");
  sink.write(0, 0, Stream::Out, "x\n");
  sink.write(0, 0, Stream::Out, "abc");
  sink.message("pytorch_exec: rank 0 exited\n");
  sink.write(0, 0, Stream::Err, "e");
  sink.write(0, 0, Stream::Out, "o");
  sink.flush();
  EXPECT_EQ(drain(both[0]), "Enter: \nwarning\nx\nabc\npytorch_exec: rank 0 exited\ne\no");
  close(both[0]);
  close(both[1]);
}

TEST(TorchLogsTest, ParsesTorchrunsStdValues) {
  auto all = pe::parse_std_streams("3");
  ASSERT_TRUE(all);
  EXPECT_EQ(all->of(0), 3);
  EXPECT_EQ(all->of(7), 3);
  auto per = pe::parse_std_streams("0:1,12:2");
  ASSERT_TRUE(per);
  EXPECT_EQ(per->of(0), 1);
  EXPECT_EQ(per->of(12), 2);
  EXPECT_EQ(per->of(1), 0);
  EXPECT_TRUE(per->any());
  EXPECT_FALSE(pe::parse_std_streams("0")->any());
  for (const char* bad : {"", "4", "-1", "1,2", "0:4", "a:1", "0:1,", "0:", ":1", "03"})
    EXPECT_FALSE(pe::parse_std_streams(bad)) << bad;
}

TEST(TorchLogsTest, ExpandsThePrefixTemplateAsTorchrun) {
  EXPECT_EQ(pe::expand_prefix_template("[${role_name}${local_rank}]:", "default", 2, 6, "n1"),
            "[default2]:");
  EXPECT_EQ(pe::expand_prefix_template("$hostname:$rank: ${x} $rank_x $", "r", 0, 5, "n1"),
            "n1:5: ${x} $rank_x $");
  EXPECT_EQ(pe::expand_prefix_template("<$${rank}>$$|", "r", 0, 5, "n1"), "<${rank}>$|");
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// torchrun's --log-dir with --redirects/--tee and --local-ranks-filter: files per attempt and
// local rank; a redirected stream stays off the terminal, a tee'd one is prefixed there, a
// filtered-out local rank is only in its files; late output of the generation before goes to
// that generation's file.
TEST(TorchLogsTest, FilesPerAttemptAndTheTerminalAsTorchrun) {
  char base[] = "/tmp/stdio_test_XXXXXX";
  ASSERT_TRUE(mkdtemp(base));
  int out[2], err[2];
  ASSERT_EQ(pipe2(out, O_NONBLOCK), 0);
  ASSERT_EQ(pipe2(err, O_NONBLOCK), 0);
  pe::OutputOptions o;
  o.torch.log_dir = std::string(base) + "/logs";
  o.torch.redirects = *pe::parse_std_streams("0:1");   // local 0: stdout to the file only
  o.torch.tee = *pe::parse_std_streams("1:3");         // local 1: both to file and terminal
  o.torch.console_ranks = {0, 1};                      // local 2: files only (none here)
  o.torch.role = "trainer";
  o.run_id = "job/1";
  pe::OutputSink sink(o, 0, out[1], err[1]);
  sink.open_files();
  const std::string run = sink.run_dir();
  ASSERT_EQ(run.rfind(std::string(base) + "/logs/job_1_", 0), 0u) << run;
  EXPECT_NE(drain(err[0]).find("logs (--redirects, --tee) are in " + run), std::string::npos);
  // Two nodes of three ranks; this sink prints node 1's (ranks 3, 4, 5: local 0, 1, 2).
  pe::JobMap map;
  map.world_size = 6;
  map.nodes = {{"a", 0, {0, 1, 2}, 3}, {"b", 1, {3, 4, 5}, 3}};
  sink.start_generation(0, 0, map, 1);
  sink.write(0, 3, Stream::Out, "r3 out\n");
  sink.write(0, 3, Stream::Err, "r3 err\n");
  sink.write(0, 4, Stream::Out, "r4 out\n");
  sink.write(0, 4, Stream::Err, "r4 err\n");
  sink.write(0, 5, Stream::Out, "r5 out\n");
  EXPECT_EQ(drain(out[0]), "[trainer1]:r4 out\n");
  EXPECT_EQ(drain(err[0]), "r3 err\n[trainer1]:r4 err\n");
  EXPECT_EQ(slurp(run + "/attempt_0/0/stdout.log"), "r3 out\n");
  EXPECT_EQ(access((run + "/attempt_0/0/stderr.log").c_str(), F_OK), -1);
  EXPECT_EQ(slurp(run + "/attempt_0/1/stdout.log"), "r4 out\n");
  EXPECT_EQ(slurp(run + "/attempt_0/1/stderr.log"), "r4 err\n");
  EXPECT_EQ(access((run + "/attempt_0/2").c_str(), F_OK), 0);  // as torchrun: a directory each
  // A restart: attempt_1, ranks numbered again (this node is node 0 now: ranks 0, 1, 2).
  map.nodes = {{"b", 0, {0, 1, 2}, 3}};
  map.world_size = 3;
  sink.start_generation(1, 1, map, 0);
  sink.write(0, 4, Stream::Out, "late\n");  // the old generation's last words: its own file
  sink.write(1, 1, Stream::Out, "again\n");
  EXPECT_EQ(slurp(run + "/attempt_1/1/stdout.log"), "again\n");
  EXPECT_EQ(slurp(run + "/attempt_0/1/stdout.log"), "r4 out\nlate\n");
  EXPECT_EQ(drain(out[0]), "[trainer1]:late\n[trainer1]:again\n");
  // The sink of every node's ranks (-H): directories by rank.
  pe::OutputSink all(o, 0, out[1], err[1]);
  all.open_files();
  map.nodes = {{"a", 0, {0, 1}, 2}, {"b", 1, {2, 3}, 2}};
  map.world_size = 4;
  all.start_generation(0, 0, map);
  all.write(0, 3, Stream::Out, "r3\n");  // local 1 on b: tee'd
  EXPECT_EQ(slurp(all.run_dir() + "/attempt_0/3/stdout.log"), "r3\n");
  EXPECT_NE(drain(out[0]).find("[trainer1]:r3\n"), std::string::npos);
  for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
  std::string rm = std::string("rm -rf ") + base;
  EXPECT_EQ(system(rm.c_str()), 0);
}

pe::Failure failure(int rank, pid_t pid, const std::string& host, int status, int exec_errno,
                    const std::string& program) {
  pe::Failure f;
  f.rank = rank;
  f.pid = pid;
  f.host = host;
  f.status = status;
  f.exec_errno = exec_errno;
  f.program = program;
  return f;
}

TEST(FailureTest, DescribesExitsSignalsAndExecErrors) {
  pe::Failure f = failure(1, 42, "node1", 3 << 8, 0, "/bin/prog");
  EXPECT_TRUE(pe::is_failure(f.status, 0));
  EXPECT_FALSE(pe::is_failure(0, 0));
  EXPECT_EQ(pe::describe_failure(f), "rank 1 (pid 42 on node1) exited with status 3");
  EXPECT_EQ(pe::failure_exit_code(f), 3);
  f.status = 9;  // killed by SIGKILL
  EXPECT_EQ(pe::describe_failure(f), "rank 1 (pid 42 on node1) killed by signal 9 (Killed)");
  EXPECT_EQ(pe::failure_exit_code(f), 137);
  f.exec_errno = 8;  // ENOEXEC
  EXPECT_EQ(pe::failure_exit_code(f), 126);
  EXPECT_NE(pe::describe_failure(f).find("could not execute /bin/prog: Exec format error"),
            std::string::npos);
  pe::Failure a = failure(2, 7, "n", 5, 0, "/bin/prog");
  a.aborted = true;
  a.abort_message = "N/A";
  EXPECT_EQ(pe::describe_failure(a),
            "rank 2 (pid 7 on n) called MPI_Abort/PMIx_Abort with status 5");
  EXPECT_EQ(pe::failure_exit_code(a), 5);
  a.abort_message = "bad input";
  EXPECT_EQ(pe::describe_failure(a),
            "rank 2 (pid 7 on n) called MPI_Abort/PMIx_Abort with status 5: bad input");
  pe::Failure u = failure(1, 8, "n", 0, 0, "/bin/prog");
  u.unfinalized = true;
  EXPECT_TRUE(pe::is_failure(0, 0, true));
  EXPECT_EQ(pe::failure_exit_code(u), 1);
  EXPECT_EQ(pe::describe_failure(u),
            "rank 1 (pid 8 on n) exited with status 0 without calling MPI_Finalize (it had "
            "connected to the PMIx server)");
  u.status = 9;  // killed: the signal says it all, MPI or not
  EXPECT_EQ(pe::describe_failure(u), "rank 1 (pid 8 on n) killed by signal 9 (Killed)");
  std::string report = pe::failure_report(f, {"Traceback", "Boom"});
  EXPECT_NE(report.find("last lines of rank 1's stderr:\n    Traceback\n    Boom\n"),
            std::string::npos);
}

TEST(FailureTest, NamesTheExceptionOfTheErrorFile) {
  pe::Failure f = failure(1, 42, "node1", 1 << 8, 0, "/bin/prog");
  f.error = "ValueError: bad batch\nsecond line";
  EXPECT_EQ(pe::describe_failure(f),
            "rank 1 (pid 42 on node1) exited with status 1: ValueError: bad batch");
  f.error = "E: \x1b[2J";  // shown, not obeyed
  EXPECT_EQ(pe::describe_failure(f), "rank 1 (pid 42 on node1) exited with status 1: E: \\x1b[2J");
  f.error = std::string(5000, 'x');
  EXPECT_LT(pe::describe_failure(f).size(), 500u);
}

TEST(ErrorFileTest, FindsTorchsMessageInEitherForm) {
  EXPECT_EQ(pe::error_file_message(
                R"({"message": {"message": "ValueError: 7\nbad \"x\" \u00e9", "extraInfo": )"
                R"({"py_callstack": "Traceback\n", "timestamp": "1700000000"}}})"),
            "ValueError: 7\nbad \"x\" \xc3\xa9");
  // Key order, older string form, extra keys and arrays elsewhere.
  EXPECT_EQ(pe::error_file_message(R"({"a": [1, {"message": "no"}], "message": {"extraInfo": )"
                                   R"({"message": "no"}, "message": "yes", "errorCode": 1}})"),
            "yes");
  EXPECT_EQ(pe::error_file_message(R"( {"message": "RuntimeError: x"} )"), "RuntimeError: x");
  // Anything else: nothing.
  for (const char* bad : {"", "{", R"({"message": )", R"({"message": "x")", R"(["message"])",
                          R"({"other": "x"})", R"({"message": "x"} trailing)", "null",
                          R"({"message": "\u12"})"})
    EXPECT_EQ(pe::error_file_message(bad), "") << bad;
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(pe::error_file_message(deep), "");  // bounded nesting, no stack overflow
}

// The rank chose what is at the path: a FIFO or a link is not waited on nor followed.
TEST(ErrorFileTest, TakesOnlyARegularFileAndRemovesIt) {
  char dir[] = "/tmp/pe-error-file-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string d = dir, file = d + "/f.json", fifo = d + "/fifo", link = d + "/link";
  {
    std::ofstream(file) << R"({"message": {"message": "E: x"}})";
  }
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(file.c_str(), link.c_str()), 0);
  EXPECT_EQ(pe::take_error_file(fifo), "");  // returns at once
  EXPECT_EQ(pe::take_error_file(link), "");
  EXPECT_EQ(pe::take_error_file(file), "E: x");
  EXPECT_NE(::access(file.c_str(), F_OK), 0);  // taken
  EXPECT_EQ(pe::take_error_file(d + "/none"), "");
  ::unlink(fifo.c_str());
  ::unlink(link.c_str());
  ::rmdir(dir);
}

TEST(FailureTest, BindingFailuresAreNamedAsSuch) {
  pe::Failure b = failure(3, 9, "n", 0, 22, "/bin/prog");
  b.bind_failed = true;
  EXPECT_EQ(pe::describe_failure(b),
            "rank 3 (pid 9 on n) could not be bound to its processors: Invalid argument");
  EXPECT_EQ(pe::failure_exit_code(b), 1);
}
