#include "exec/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"

namespace pe {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

[[noreturn]] void child_fail(int err_fd, int err) {
  ssize_t ignored = ::write(err_fd, &err, sizeof err);
  (void)ignored;
  ::_exit(127);
}

// Runs in the child between fork and exec: system calls only.
[[noreturn]] void child_main(const SpawnSpec& spec, pid_t parent, int in_fd, int out_fd,
                             int err_fd, int exec_err_fd, char** argv, char** envp) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
  // Signals: default dispositions and an empty mask (ignored signals survive execve otherwise).
  for (int s = 1; s < NSIG; ++s)
    if (s != SIGKILL && s != SIGSTOP) ::signal(s, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (::dup2(in_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0)
    child_fail(exec_err_fd, errno);
  if (!spec.wdir.empty() && ::chdir(spec.wdir.c_str()) != 0) child_fail(exec_err_fd, errno);
  ::execve(spec.path.c_str(), argv, envp);
  child_fail(exec_err_fd, errno);
}

}  // namespace

ChildProcess spawn_child(const SpawnSpec& spec) {
  ChildProcess c;
  Pipe out = make_pipe(), err = make_pipe(), ex = make_pipe();
  Pipe in;
  UniqueFd devnull;
  int child_in = spec.stdin_fd;
  if (spec.stdin_pipe) {
    in = make_pipe();
    child_in = in.read.get();
  } else if (child_in < 0) {
    devnull.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    PE_CHECK_ERRNO(devnull.valid(), "open /dev/null");
    child_in = devnull.get();
  }
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.envp);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  PE_CHECK_ERRNO(pid >= 0, "fork");
  if (pid == 0)
    child_main(spec, parent, child_in, out.write.get(), err.write.get(), ex.write.get(),
               argv.data(), envp.data());
  // Also in the parent, so a signal to the group cannot race the child's own setpgid.
  ::setpgid(pid, pid);
  c.pid = pid;
  c.stdout_r = std::move(out.read);
  c.stderr_r = std::move(err.read);
  c.exec_err_r = std::move(ex.read);
  if (spec.stdin_pipe) c.stdin_w = std::move(in.write);
  set_nonblocking(c.stdout_r.get());
  set_nonblocking(c.stderr_r.get());
  set_nonblocking(c.exec_err_r.get());
  if (c.stdin_w.valid()) set_nonblocking(c.stdin_w.get());
  return c;
}

int read_exec_error(const ChildProcess& c) {
  int err = 0;
  if (!c.exec_err_r.valid()) return 0;
  ssize_t n = ::read(c.exec_err_r.get(), &err, sizeof err);
  return n == static_cast<ssize_t>(sizeof err) ? err : 0;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    const char* name = ::strsignal(s);
    return "killed by signal " + std::to_string(s) + " (" + (name ? name : "unknown") + ")";
  }
  return "stopped (status " + std::to_string(status) + ")";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace pe
