#include "exec/node/child_process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/error.hpp"

namespace pe {
namespace {

// Signals whose disposition the launcher changes; the child puts them back to default before it
// unblocks signals (a caught signal must never run the launcher's handler in the child).
constexpr int kLauncherSignals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGUSR1,
                                     SIGUSR2, SIGCHLD, SIGPIPE, SIGTSTP, SIGCONT};

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

struct ChildArgs {
  const SpawnSpec* spec;
  pid_t parent;
  int in_fd, out_fd, err_fd;
  char** argv;
  char** envp;
  sigset_t mask;            // the launcher's mask before spawning, restored in the child (minus
                            // everything: the worker starts with no signal blocked)
  volatile int exec_errno;  // written by the child (shared memory), read after clone returns
  cpu_set_t* cpus;          // nullptr: no binding
  size_t cpus_size;
  volatile bool bind_failed;
  long max_fd;  // above the highest descriptor open, for closing without close_range
};

#ifndef SYS_close_range
#define SYS_close_range 436  // Linux 5.9, where the headers are older
#endif

// Whether the kernel has close_range: probed once, on an empty range.
bool have_close_range() {
  static const bool have = ::syscall(SYS_close_range, ~0u, ~0u, 0u) == 0 || errno != ENOSYS;
  return have;
}

// Above the highest descriptor open here (the child closes those one by one without
// close_range).
long fd_bound() {
  long top = 2;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (struct dirent* e = ::readdir(d)) top = std::max(top, std::atol(e->d_name));
    ::closedir(d);
  } else {
    top = std::min(::sysconf(_SC_OPEN_MAX), 1L << 16);
  }
  return top + 1;
}

// Runs in the child, on its own stack, in the launcher's memory: system calls only.
int child_main(void* p) {
  auto* a = static_cast<ChildArgs*>(p);
  auto fail = [a](int err) {
    a->exec_errno = err;
    ::_exit(127);
  };
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != a->parent) ::_exit(127);  // the launcher died before prctl took effect
  for (int s : kLauncherSignals) ::signal(s, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (::dup2(a->in_fd, 0) < 0 || ::dup2(a->out_fd, 1) < 0 || ::dup2(a->err_fd, 2) < 0) fail(errno);
  // Only 0, 1 and 2 go on (as mpirun and torchrun give them): not what the launching shell left
  // open.  Without close_range (Linux < 5.9), each descriptor below the limit.
  if (::syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
    for (long fd = 3; fd < a->max_fd; ++fd) ::close(static_cast<int>(fd));
  if (!a->spec->wdir.empty() && ::chdir(a->spec->wdir.c_str()) != 0) fail(errno);
  if (a->cpus && ::sched_setaffinity(0, a->cpus_size, a->cpus) != 0) {
    a->bind_failed = true;
    fail(errno);
  }
  ::execve(a->spec->path.c_str(), a->argv, a->envp);
  fail(errno);
  return 127;
}

// The stack a child runs on until it execs.  CLONE_VFORK suspends the thread that cloned it
// until then, so one stack serves every child one thread starts.
class ChildStack {
 public:
  static constexpr size_t kSize = 256 * 1024;
  ChildStack() {
    base_ = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
                   -1, 0);
    PE_CHECK_ERRNO(base_ != MAP_FAILED, "mmap (child stack)");
  }
  ~ChildStack() { ::munmap(base_, kSize); }
  ChildStack(const ChildStack&) = delete;
  ChildStack& operator=(const ChildStack&) = delete;
  char* top() const { return static_cast<char*>(base_) + kSize; }

 private:
  void* base_;
};

// The stack for children that the calling thread starts with spawn_child, or as its share of
// spawn_children (a helper thread uses its own); kept for the process's life.
char* child_stack_top() {
  static ChildStack stack;
  return stack.top();
}

ChildProcess spawn_on(const SpawnSpec& spec, char* stack_top);

}  // namespace

// A pseudo-terminal for a child's stdout: {master, slave}, or nothing where there is none.  The
// slave does no output processing ("\n" stays "\n") and echoes nothing; it becomes no process's
// controlling terminal (O_NOCTTY, and the child keeps the launcher's session).
Pipe open_stdout_tty(unsigned short rows, unsigned short cols) {
  Pipe p;
  UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  char name[128];
  if (!master.valid() || ::grantpt(master.get()) != 0 || ::unlockpt(master.get()) != 0 ||
      ::ptsname_r(master.get(), name, sizeof name) != 0)
    return p;
  UniqueFd slave(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  struct termios t;
  if (!slave.valid() || ::tcgetattr(slave.get(), &t) != 0) return p;
  t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
  t.c_lflag &= ~static_cast<tcflag_t>(ECHO | ECHONL | ICANON | ISIG | IEXTEN);
  if (::tcsetattr(slave.get(), TCSANOW, &t) != 0) return p;
  if (rows && cols) {
    struct winsize ws {};
    ws.ws_row = rows;
    ws.ws_col = cols;
    ::ioctl(slave.get(), TIOCSWINSZ, &ws);
  }
  p.read = std::move(master);
  p.write = std::move(slave);
  return p;
}

ChildProcess spawn_child(const SpawnSpec& spec) { return spawn_on(spec, child_stack_top()); }

namespace {

// The threads that start children beside the caller's in spawn_children.  Kept for the
// process's life, never ended: a child's PR_SET_PDEATHSIG fires when the *thread* that cloned it
// ends, so a helper that ended would kill the ranks it started.  Allocated once and never freed
// (its threads wait on it until the process exits).
class SpawnHelpers {
 public:
  static SpawnHelpers& get() {
    static auto* helpers = new SpawnHelpers;
    return *helpers;
  }

  // Runs job(stack_top) on `n` helpers (fewer if no more can be started) and waits for them.
  // From one thread at a time (the node agent's loop).
  void run(size_t n, const std::function<void(char*)>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    while (stacks_.size() < n && start_one()) {
    }
    wanted_ = std::min(n, stacks_.size());
    if (wanted_ == 0) {
      lock.unlock();
      job(nullptr);
      return;
    }
    job_ = &job;
    running_ = wanted_;
    ++round_;
    work_.notify_all();
    lock.unlock();
    job(nullptr);  // the caller's share (nullptr: its own stack, in the job)
    lock.lock();
    done_.wait(lock, [this] { return running_ == 0; });
    job_ = nullptr;
  }

 private:
  bool start_one() {
    try {
      stacks_.push_back(std::make_unique<ChildStack>());
    } catch (const Error&) {
      return false;
    }
    size_t index = stacks_.size() - 1;
    char* top = stacks_.back()->top();
    // Started with every signal blocked: the process's signals are the main thread's business.
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    bool started = true;
    try {
      std::thread([this, index, top] { serve(index, top); }).detach();
    } catch (...) {  // no thread to be had (system_error, bad_alloc)
      stacks_.pop_back();
      started = false;
    }
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return started;
  }

  void serve(size_t index, char* top) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return round_ != seen; });
      seen = round_;
      if (index >= wanted_) continue;
      const auto* job = job_;
      lock.unlock();
      (*job)(top);
      lock.lock();
      if (--running_ == 0) done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_, done_;
  std::vector<std::unique_ptr<ChildStack>> stacks_;  // one for every helper thread
  const std::function<void(char*)>* job_ = nullptr;
  uint64_t round_ = 0;
  size_t wanted_ = 0, running_ = 0;
};

}  // namespace

std::exception_ptr spawn_children(const std::vector<const SpawnSpec*>& specs,
                                  std::vector<ChildProcess>& out) {
  out.clear();
  out.resize(specs.size());
  // Each start waits for its child's execve: from several threads, several children exec at
  // once (64 processes of /bin/true started a quarter faster on 2 cores than from one thread).
  cpu_set_t mask;
  size_t cpus =
      ::sched_getaffinity(0, sizeof mask, &mask) == 0 ? static_cast<size_t>(CPU_COUNT(&mask)) : 1;
  size_t threads = std::min({cpus, specs.size() / 4, kMaxSpawnThreads});
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::exception_ptr error;
  std::function<void(char*)> work = [&](char* stack_top) {
    try {
      if (!stack_top) stack_top = child_stack_top();
      while (!stop) {
        size_t i = next++;
        if (i >= specs.size()) break;
        out[i] = spawn_on(*specs[i], stack_top);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      stop = true;
    }
  };
  if (threads > 1)
    SpawnHelpers::get().run(threads - 1, work);
  else
    work(nullptr);
  return error;
}

namespace {

ChildProcess spawn_on(const SpawnSpec& spec, char* stack_top) {
  ChildProcess c;
  Pipe out;
  if (spec.stdout_tty) out = open_stdout_tty(spec.tty_rows, spec.tty_cols);
  if (!out.read.valid()) out = make_pipe();
  Pipe err = make_pipe();
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
  cpu_set_t* cpus = nullptr;
  size_t cpus_size = 0;
  if (!spec.cpus.empty()) {
    int max = *std::max_element(spec.cpus.begin(), spec.cpus.end());
    cpus = CPU_ALLOC(static_cast<size_t>(max) + 1);
    cpus_size = CPU_ALLOC_SIZE(static_cast<size_t>(max) + 1);
    CPU_ZERO_S(cpus_size, cpus);
    for (int c : spec.cpus) CPU_SET_S(static_cast<size_t>(c), cpus_size, cpus);
  }
  ChildArgs args{&spec,
                 ::getpid(),
                 child_in,
                 out.write.get(),
                 err.write.get(),
                 argv.data(),
                 envp.data(),
                 {},
                 0,
                 cpus,
                 cpus_size,
                 false,
                 have_close_range() ? 0 : fd_bound()};
  sigset_t all;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &args.mask);
  pid_t pid = ::clone(child_main, stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &args.mask, nullptr);
  if (cpus) CPU_FREE(cpus);
  if (pid < 0) throw SystemError("clone (starting " + spec.path + ")", clone_errno);
  // Also in the parent, so a signal to the group cannot race the child's own setpgid.
  ::setpgid(pid, pid);
  c.pid = pid;
  c.exec_errno = args.exec_errno;
  c.bind_failed = args.bind_failed;
  c.stdout_r = std::move(out.read);
  c.stderr_r = std::move(err.read);
  if (spec.stdin_pipe) c.stdin_w = std::move(in.write);
  set_nonblocking(c.stdout_r.get());
  set_nonblocking(c.stderr_r.get());
  if (c.stdin_w.valid()) set_nonblocking(c.stdin_w.get());
  return c;
}

}  // namespace

std::vector<std::string> environ_of(pid_t pid) {
  const std::string env = read_file("/proc/" + std::to_string(pid) + "/environ", std::string::npos);
  std::vector<std::string> vars;
  for (size_t at = 0; at < env.size();) {
    size_t end = std::min(env.find('\0', at), env.size());
    vars.push_back(env.substr(at, end - at));
    at = end + 1;
  }
  return vars;
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
