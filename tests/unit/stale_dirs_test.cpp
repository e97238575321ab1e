// remove_stale() takes only the marked directories whose maker is gone, on this machine and in
// this PID namespace; real processes make the marks.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "common/stale_dirs.hpp"

namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class StaleDirs : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/stale_dirs_test.XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    parent_ = templ;
  }
  void TearDown() override { fs::remove_all(parent_); }
  std::string dir(const std::string& name) {
    std::string d = parent_ + "/" + name;
    fs::create_directory(d);
    std::ofstream(d + "/file") << "x";  // not empty: removed whole
    return d;
  }
  // The mark of `d` with field `i` (0 magic, 1 pid, 2 start, 3 namespace, 4 boot id) replaced.
  void rewrite_mark(const std::string& d, int i, const std::string& value) {
    std::string path = d + "/.pytorch_exec_owner";
    std::istringstream in(read_all(path));
    std::string f[5], out;
    for (auto& x : f) in >> x;
    f[i] = value;
    for (auto& x : f) out += x + " ";
    std::ofstream(path) << out << "\n";
  }
  std::string parent_;
};

TEST_F(StaleDirs, RemovesOnlyThoseWhoseMakerIsGone) {
  // A: made by a child that exited
  std::string a = dir("pytorch_exec.aaaaaa");
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(pe::mark_owner(a) ? 0 : 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // B: made by this (live) process
  std::string b = dir("pytorch_exec.bbbbbb");
  ASSERT_TRUE(pe::mark_owner(b));
  // C: no mark (an older version's, or one being made)
  std::string c = dir("pytorch_exec.cccccc");
  // D, E: another boot (or machine), another PID namespace (container): not judged here
  std::string d = dir("pytorch_exec.dddddd"), e = dir("pytorch_exec.eeeeee");
  for (const auto& x : {d, e}) ASSERT_TRUE(pe::mark_owner(x));
  rewrite_mark(d, 4, "00000000-0000-0000-0000-000000000000");
  rewrite_mark(e, 3, "pid:[1]");
  // F: this pid, another start time: the pid was reused, the maker is gone
  std::string f = dir("pytorch_exec.ffffff");
  ASSERT_TRUE(pe::mark_owner(f));
  rewrite_mark(f, 2, "1");
  // G: a dead maker's mark on a directory of another name
  std::string g = dir("other.gggggg");
  fs::copy_file(a + "/.pytorch_exec_owner", g + "/.pytorch_exec_owner");
  // H: a file of the name
  std::ofstream(parent_ + "/pytorch_exec.hhhhhh") << "not a directory";

  EXPECT_EQ(pe::remove_stale(parent_), 2);
  EXPECT_FALSE(fs::exists(a));
  EXPECT_FALSE(fs::exists(f));
  for (const auto& x : {b, c, d, e, g, parent_ + "/pytorch_exec.hhhhhh"})
    EXPECT_TRUE(fs::exists(x)) << x;
  EXPECT_EQ(pe::remove_stale(parent_), 0);
  EXPECT_EQ(pe::remove_stale(parent_ + "/missing"), 0);
}

}  // namespace
