// DcBackend: the c10d::Backend over a DataChannel ProcessGroup (see backend.hpp).  Each
// collective checks its arguments where it is called (errors raise at once), then queues a task
// that stages the tensors as flat contiguous buffers (copies only where a tensor is not
// contiguous, or an int8/bool tensor is reduced in a wider type), calls the DataChannel, and
// copies the results back.
//
// CUDA tensors (see device.cpp for the stream semantics): allreduce runs on the GPU through
// libpytorch_dc's allreduce_device (NCCL) where the tensor is contiguous and its dtype is one the
// DataChannel reduces as is; so do broadcast, allgather_into_tensor and reduce_scatter_tensor
// (broadcast_device, allgather_device, reduce_scatter_device) on contiguous tensors.  Every other
// collective on CUDA tensors (the list forms of allgather and reduce_scatter, gather, scatter,
// alltoall, reduce, allreduce_coalesced, and the cases above on non-contiguous tensors or dtypes
// reduced in a wider type) is host-staged: the task works on the pinned host tensors that its
// DeviceStage hands out in place of the GPU tensors (stage->in / out / inout, copied on the
// backend's stream), and runs the host collective, the same code as for CPU tensors.  Sends and
// receives of CUDA tensors go through host memory synchronously (message()).
#include "backend.hpp"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace pytorch_dc {
namespace {

[[noreturn]] void bad(const char* what, const std::string& why) {
  throw std::invalid_argument(std::string("pytorch_dc: ") + what + ": " + why);
}

// Whether a collective on these (staged) tensors runs on the GPU itself: CUDA tensors, every one
// contiguous (the library takes flat device buffers).
bool on_device(const std::shared_ptr<DeviceStage>& st, const std::vector<at::Tensor>& ts) {
  if (!st) return false;
  for (const auto& t : ts)
    if (!t.is_cuda() || !t.is_contiguous()) return false;
  return true;
}

// The GPU tensors themselves, for a collective that runs on them (st->native of each).
std::vector<at::Tensor> natives(DeviceStage* st, const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(st->native(t));
  return out;
}

// The host of the TCPStore under `store`, which every rank reaches; "" for other stores.
std::string store_host(const c10::intrusive_ptr<c10d::Store>& store) {
  c10d::Store* s = store.get();
  while (auto* p = dynamic_cast<c10d::PrefixStore*>(s)) s = p->getUnderlyingStore().get();
  auto* tcp = dynamic_cast<c10d::TCPStore*>(s);
  return tcp ? tcp->getHost() : "";
}

dc::Exchange exchange_over(const c10::intrusive_ptr<c10d::Store>& store) {
  dc::Exchange x;
  x.set = [store](const std::string& k, const std::string& v) {
    store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
  };
  x.get = [store](const std::string& k, double timeout) {
    store->wait({k}, std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
    auto v = store->get(k);
    return std::string(v.begin(), v.end());
  };
  x.add = [store](const std::string& k, int64_t delta) { return store->add(k, delta); };
  x.toward = store_host(store);
  return x;
}

void same_shape(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (a.numel() != b.numel() || a.scalar_type() != b.scalar_type())
    bad(what, "tensors of different sizes or dtypes (" + std::to_string(a.numel()) + " " +
                  c10::toString(a.scalar_type()) + " and " + std::to_string(b.numel()) + " " +
                  c10::toString(b.scalar_type()) + ")");
}

// The flat concatenation of `ts`, in dtype `wire`.
at::Tensor concat(const std::vector<at::Tensor>& ts, at::ScalarType wire) {
  std::vector<at::Tensor> f;
  for (auto& t : ts) f.push_back(t.reshape({-1}));
  return at::cat(f).to(wire).contiguous();
}

// Copies consecutive pieces of `buf` into `ts`.
void split_into(const at::Tensor& buf, const std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (auto& t : ts) {
    if (t.numel()) t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

// Bytes per row (first dimension) of `t`; 0 for an empty tensor.
size_t row_bytes(const at::Tensor& t) {
  return t.dim() == 0 || t.size(0) == 0 ? bytes_of(t)
                                        : bytes_of(t) / static_cast<size_t>(t.size(0));
}

std::vector<size_t> split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits, int n,
                                const char* what) {
  std::vector<size_t> out(static_cast<size_t>(n));
  int64_t rows = t.dim() ? t.size(0) : 1, sum = 0;
  if (!splits.empty() && splits.size() != static_cast<size_t>(n))
    bad(what, std::to_string(splits.size()) + " split sizes for a group of " + std::to_string(n));
  for (int r = 0; r < n; ++r) {
    int64_t k = splits.empty() ? rows / n : splits[static_cast<size_t>(r)];
    // Checked here, before anything is sent: the peers' calls are not broken by it.
    if (k < 0) bad(what, "split size " + std::to_string(k) + " for rank " + std::to_string(r));
    out[static_cast<size_t>(r)] = static_cast<size_t>(k) * row_bytes(t);
    sum += k;
  }
  if (sum != rows)
    bad(what, "the splits do not add up to the tensor's " + std::to_string(rows) + " rows");
  return out;
}

// Whether the caller will wait for the call at once (async_op=False): torch 2.6 and later say
// so in the options' asyncOp; earlier ones do not (then: asynchronous).
template <class O>
auto is_sync(const O& o, int) -> decltype(o.asyncOp, bool()) {
  return !o.asyncOp;
}
template <class O>
bool is_sync(const O&, long) {
  return false;
}

// PYTORCH_DC_WORKER_IDLE: seconds, more than 0 (default 10).
double worker_idle_seconds() {
  const char* e = std::getenv("PYTORCH_DC_WORKER_IDLE");
  if (!e || !*e) return 10;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(e, &end);
  if (errno || *end || !(v > 0) || v > 1e9)
    throw std::invalid_argument(std::string("pytorch_dc: PYTORCH_DC_WORKER_IDLE=") + e +
                                ": expected the seconds an idle worker thread waits before it "
                                "ends, more than 0");
  return v;
}

}  // namespace

namespace {

// The backends alive, for drain_all().  drains: how many drains are in it (its destructor waits
// for them to leave it, then takes it out).  holds: workers that hold it while completing a Work
// (a callback that shut the group down leaves the destructor to one of them; drain_all() waits
// for that, not for references the program still has).  serial tells a backend from a later one
// at the same address.
struct Live {
  DcBackend* backend;
  uint64_t serial;
  int drains = 0;
  int holds = 0;
};
std::mutex live_m;
std::condition_variable live_cv;
std::vector<Live> live;
uint64_t live_serials = 0;

// The backend whose destructor ran last on this thread (loop(): whether it was its own).
thread_local const DcBackend* t_destroyed = nullptr;

Live* live_entry(const DcBackend* b, uint64_t serial) {
  for (auto& e : live)
    if (e.backend == b && e.serial == serial) return &e;
  return nullptr;
}

// A worker let go of the backend `b` (see start_completing_locked()), which may be gone now.
void release_hold(const DcBackend* b, uint64_t serial) {
  {
    std::lock_guard<std::mutex> l(live_m);
    if (Live* e = live_entry(b, serial)) --e->holds;
  }
  live_cv.notify_all();
}

}  // namespace

DcBackend::DcBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      timeout_s_(static_cast<double>(timeout.count()) / 1000),
      order_(std::make_shared<CompletionOrder>(timeout_s_ > 0 ? timeout_s_ : 60)),
      idle_limit_(worker_idle_seconds()) {
  streams_ = device_streams();
  dc::Options o;
  o.timeout = timeout_s_ > 0 ? timeout_s_ : 0;
  try {
    pg_ = dc::ProcessGroup::init(rank, size, exchange_over(store), o);
    mailbox_ = pg_->mailbox();
  } catch (const std::exception& e) {
    throw std::runtime_error("pytorch_dc: init of rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + " failed: " + e.what());
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::runtime_error("pytorch_dc: eventfd failed");
  {
    std::lock_guard<std::mutex> l(m_);
    spare_locked();
  }
  p2p_thread_ = std::thread([this] { p2p_loop(); });
  ::pthread_setname_np(p2p_thread_.native_handle(), "pt_dc mailbox");
  std::lock_guard<std::mutex> l(live_m);
  serial_ = ++live_serials;
  live.push_back(Live{this, serial_});
}

DcBackend::~DcBackend() {
  t_destroyed = this;
  shutdown();
  {
    std::unique_lock<std::mutex> l(live_m);
    live_cv.wait(l, [&] { return live_entry(this, serial_)->drains == 0; });  // no drain in it
    Live* me = live_entry(this, serial_);
    live.erase(live.begin() + (me - live.data()));
  }
  live_cv.notify_all();
  if (wake_fd_ >= 0) ::close(wake_fd_);  // here, not in shutdown(): a late send still writes it
}

bool DcBackend::drain(double seconds) {
  std::unique_lock<std::mutex> l(m_);
  // Shut down (a callback destroyed the group): what is queued will not run; its callbacks
  // being run are waited for all the same.
  auto settled = [&] {
    return !completing_ && (stop_ || (queue_.empty() && !busy_ && completions_.empty() &&
                                      sends_open_ == 0 && watches_.empty()));
  };
  settled_cv_.wait_for(l, std::chrono::duration<double>(std::max(seconds, 0.0)), settled);
  return stop_;
}

void DcBackend::drain_all() {
  // Not under live_m while waiting: a callback being waited for may destroy a group.
  struct Drain {
    DcBackend* backend;
    uint64_t serial;
    double seconds;
  };
  std::vector<Drain> all;
  {
    std::lock_guard<std::mutex> l(live_m);
    for (auto& e : live) {
      ++e.drains;
      all.push_back({e.backend, e.serial, e.backend->timeout_s_ > 0 ? e.backend->timeout_s_ : 60});
    }
  }
  for (auto [b, serial, seconds] : all) {
    bool stopped = b->drain(seconds);
    std::unique_lock<std::mutex> l(live_m);
    --live_entry(b, serial)->drains;
    live_cv.notify_all();
    // Shut down by a callback: a worker that still holds it may be about to destroy it; let
    // that finish before Python does (it may be gone: looked up, not touched).
    if (stopped)
      live_cv.wait_for(l, std::chrono::duration<double>(seconds), [&] {
        Live* e = live_entry(b, serial);
        return !e || e->holds == 0;
      });
  }
}

void DcBackend::shutdown() {
  {
    // Sends the program did not wait for still go (as an MPI_Finalize delivers them): a peer's
    // mailbox takes a message before its recv, and one shut down has closed its connections
    // (below), so this waits only on a peer whose group is up but that does not read (stopped).
    std::unique_lock<std::mutex> l(m_);
    settled_cv_.wait_for(l, std::chrono::duration<double>(timeout_s_ > 0 ? timeout_s_ : 60),
                         [&] { return sends_open_ == 0; });
    stop_ = true;
  }
  settled_cv_.notify_all();  // a drain of this backend stops waiting for the queue
  wake_mailbox_thread();
  if (p2p_thread_.joinable()) p2p_thread_.join();  // hands its last messages to the workers
  // Closed now, not with the backend (which the program may hold on to): a peer still sending
  // to this rank gets an error at once instead of waiting for its timeout in its own shutdown.
  mailbox_.reset();
  {
    std::lock_guard<std::mutex> l(m_);
    stop_workers_ = true;  // no worker is started after this: workers_ stays as it is
    wake_all_locked();
  }
  for (auto& w : workers_) {
    if (!w.thread.joinable()) continue;
    if (w.thread.get_id() == std::this_thread::get_id())
      w.thread.detach();  // a Future callback on this worker shut the group down: it ends soon
    else
      w.thread.join();
  }
  // The GPU work on the streams is waited for (each watch is bounded by its timeout).
  {
    std::lock_guard<std::mutex> l(m_);
    stop_watcher_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  std::vector<Task> done;
  std::deque<Task> never;  // queued behind a callback that shut the group down: not run
  {
    std::lock_guard<std::mutex> l(m_);
    done.swap(done_);
    never.swap(queue_);
  }
  for (Task& t : never)
    t.work->complete(std::make_exception_ptr(std::runtime_error(
        std::string("pytorch_dc: ") + t.name + " not run: the process group was shut down")),
        -1, 0, false);
  // The group's own connections and shared memory close now too, not with the backend, which
  // the program may hold long after destroy_process_group() (a DDP model does).  A task holds
  // the group until it is done: a collective running inline on another thread, or the worker
  // that a callback which shut the group down detached, lets go of it when it finishes.
  std::shared_ptr<dc::ProcessGroup> last;
  {
    std::lock_guard<std::mutex> l(m_);
    last.swap(pg_);
  }
}

c10::intrusive_ptr<c10d::Backend::Options> DcBackend::getBackendOptions() {
  return c10::make_intrusive<Options>(
      "dc", std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000)));
}

c10::intrusive_ptr<c10d::Backend> DcBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                   const std::vector<int>& ranks,
                                                   const c10::intrusive_ptr<Options>& opts) {
  auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return nullptr;
  auto timeout = opts ? opts->timeout : getBackendOptions()->timeout;
  return c10::make_intrusive<DcBackend>(store, static_cast<int>(me - ranks.begin()),
                                        static_cast<int>(ranks.size()), timeout);
}

std::string DcBackend::describe() const {
  std::shared_ptr<dc::ProcessGroup> pg;
  {
    std::lock_guard<std::mutex> l(m_);
    pg = pg_;
  }
  if (!pg) return "dc rank " + std::to_string(getRank()) + " of " + std::to_string(getSize()) +
                  " (shut down)";
  int lanes = pg->shm_lanes();
  return "dc rank " + std::to_string(pg->rank()) + " of " + std::to_string(pg->size()) + ", " +
         std::to_string(pg->nodes()) + " node(s), " + pg->intra_transport() + "/" +
         pg->inter_transport() +
         (lanes > 1 ? ", " + std::to_string(lanes) + " shm lanes" : std::string());
}

double DcBackend::seconds(std::chrono::milliseconds t) const {
  return t.count() < 0 ? -1 : static_cast<double>(t.count()) / 1000;
}

std::shared_ptr<DeviceStage> DcBackend::stage(const std::vector<at::Tensor>& ts,
                                              const char* what) {
  return device_stage(streams_, device_of(ts, what), what);
}

c10::intrusive_ptr<c10d::Work> DcBackend::enqueue(c10d::OpType type, const char* name,
                                                  std::vector<at::Tensor> outputs,
                                                  std::function<void(dc::ProcessGroup&)> run,
                                                  bool sync,
                                                  std::shared_ptr<DeviceStage> stage,
                                                  std::optional<double> watch) {
  auto work = c10::make_intrusive<DcWork>(getRank(), type, name, std::move(outputs), stage,
                                                 order_);
  Task t{work, name, std::move(run), {}, std::move(stage), watch};
  std::vector<Task> done;
  bool queue;
  std::condition_variable* wake = nullptr;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stop_) bad(name, "the process group was shut down");
    t.pg = pg_;  // not shut down: shutdown() lets go of it only after stop_
    done.swap(done_);
    queue = !sync || busy_ || !queue_.empty();
    if (queue) {
      queue_.push_back(std::move(t));
      // Not while a worker is on its way back from a completion: it finds this (and waking
      // another costs a context switch per call, the caller waiting for it).
      if (order_->returning.load() == 0) wake = wake_one_locked();
    } else {
      busy_ = true;  // nothing queued or running before it: issue order holds
      t.ticket = ++ran_;
    }
  }
  if (queue) {
    if (wake) wake->notify_one();  // unlocked: the worker it wakes does not wait for this lock
    return work;                 // `done` goes here, on the caller's thread
  }
  // A synchronous call (async_op=False) that would only wait for the thread: run here, without
  // the two hand-offs between threads.
  std::exception_ptr error = run_task(t);
  {
    std::lock_guard<std::mutex> l(m_);
    busy_ = false;
    // What another thread queued meanwhile (not otherwise: a wake-up that finds nothing costs
    // an idle worker's context switch per call, on a processor the peers may need).
    if (!queue_.empty()) wake = wake_one_locked();
  }
  if (wake) wake->notify_one();
  settled_cv_.notify_all();
  finish_task(t, error, -1, false);
  return work;
}

std::exception_ptr DcBackend::run_task(Task& t) {
  // The copies into the caller's tensors are the collective's, not the program's: no autograd
  // (a leaf that requires grad, a Parameter) and no inference-mode checks, as on the caller's
  // thread below the dispatcher's autograd keys, where c10d's ops call the backend.
  at::AutoDispatchBelowADInplaceOrView below;
  std::lock_guard<std::mutex> lib(lib_m_);
  try {
    if (gpu_failed_.load()) throw std::runtime_error(gpu_failure());
    if (!t.stage) {
      t.run(*t.pg);
    } else {  // with the tensors' GPU and the backend's stream of it current
      t.stage->on_stream([&] {
        t.stage->begin(timeout_s_ > 0 ? timeout_s_ : -1, gpu_failed_);
        t.run(*t.pg);
        t.stage->end();
      });
      // Watched in issue order: queued here, under lib_m_.
      if (t.watch) t.watched = queue_watch(t);
    }
  } catch (const std::exception& e) {
    // After the watcher found a failure, what failed here (a wait that gave up) is that one.
    if (gpu_failed_.load()) return failure(t.name, std::runtime_error(gpu_failure()));
    return failure(t.name, e);
  }
  return nullptr;
}

bool DcBackend::finish_task(Task& t, std::exception_ptr error, int source, bool worker) {
  if (!t.stage) return t.work->complete(error, source, t.ticket, worker);
  // No watcher took its GPU work (none could be started, or it was shut down meanwhile): it is
  // watched here, once the Work has completed (a worker then does not go straight back).
  const bool here = t.watch && !error && !t.watched;
  bool returning = false;
  // On the stage's stream: the Future records its events there.
  t.stage->on_stream(
      [&] { returning = t.work->complete(error, source, t.ticket, worker && !here); });
  if (here) watch_on_its_gpu(watch_of(t));
  return returning;
}

DcBackend::Watch DcBackend::watch_of(const Task& t) const {
  const double s = *t.watch >= 0 ? *t.watch : t.pg->timeout();
  return Watch{t.stage, t.pg, t.name, s,
               std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(s))};
}

bool DcBackend::queue_watch(const Task& t) {
  bool wake;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stop_watcher_) return false;
    if (!watcher_.joinable()) {
      try {
        watcher_ = std::thread([this] { watch_loop(); });
        ::pthread_setname_np(watcher_.native_handle(), "pt_dc watcher");
      } catch (const std::system_error&) {
        return false;  // no thread to be had (a limit)
      }
    }
    watches_.push_back(watch_of(t));
    wake = watcher_asleep_;
  }
  if (wake) watch_cv_.notify_one();  // not otherwise: the watcher looks at the queue by itself
  return true;
}

void DcBackend::watch_loop() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> l(m_);
  auto last = Clock::now();  // when the last watch ended
  for (;;) {
    if (watches_.empty() && !stop_watcher_) {
      // While collectives come, the queue is looked at every millisecond rather than slept on:
      // a wake-up would cost each call a system call (nothing waits for the watcher but drain()
      // and the next call's error).  Idle for 50 ms: asleep until woken.
      if (Clock::now() - last < std::chrono::milliseconds(50)) {
        l.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        l.lock();
        continue;
      }
      watcher_asleep_ = true;
      watch_cv_.wait(l, [&] { return !watches_.empty() || stop_watcher_; });
      watcher_asleep_ = false;
    }
    if (watches_.empty()) return;  // shut down, and nothing left to watch
    Watch w = watches_.front();  // stays queued (drain() waits for it) until its work is done
    l.unlock();
    watch_on_its_gpu(w);
    l.lock();
    watches_.pop_front();
    last = Clock::now();
    if (watches_.empty()) settled_cv_.notify_all();
  }
}

void DcBackend::watch_on_its_gpu(const Watch& w) {
  try {
    // A CUDA call on a thread with no device set would make a context on GPU 0 (hundreds of
    // MiB on GPU 0 of every rank).
    w.stage->on_stream([&] { watch(w); });
  } catch (const std::exception& e) {  // setting the device failed: the GPU is unusable
    fail_gpu(std::string("watching the GPU work of an earlier ") + w.name + " failed: " +
             e.what());
  }
}

std::string DcBackend::gpu_failure() {
  std::lock_guard<std::mutex> l(failure_m_);
  return gpu_failure_;
}

void DcBackend::fail_gpu(const std::string& why) {
  {
    std::lock_guard<std::mutex> l(failure_m_);
    if (!gpu_failure_.empty()) return;
    gpu_failure_ = why;
  }
  gpu_failed_.store(true);
}

void DcBackend::watch(const Watch& w) {
  using Clock = std::chrono::steady_clock;
  const std::string earlier = std::string("the GPU work of an earlier ") + w.name;
  const char* aborted = "; the group's NCCL communicators were aborted";
  dc::ProcessGroup& pg = *w.pg;
  auto ask = Clock::now();  // when to ask the library next
  // Between two looks at the event: from 50 us, doubling to 1 ms while the work runs on.
  std::chrono::microseconds pause(50);
  for (;;) {
    // Failed before: the communicators were aborted, and later collectives raise that.
    if (gpu_failed_.load()) return;
    try {
      if (w.stage->query()) return;
    } catch (const std::exception&) {
      ask = Clock::now();  // a CUDA error: the library names it (and aborts) below
    }
    const auto now = Clock::now();
    if (now >= w.deadline) {
      // Decided without the library: a collective that holds it may wait behind this work
      // (a host-staged one's copies), and gives up once gpu_failed_ is set.  The communicators
      // are aborted once no collective uses the library, without holding it: an abort may wait
      // for the GPU work ahead of it on the stream, and the callers raise meanwhile.
      fail_gpu(earlier + " did not finish within its timeout (" + c10::str(w.seconds) + " s)" +
               aborted);
      { std::lock_guard<std::mutex> lib(lib_m_); }
      try {
        pg.device_wait_event(w.stage->end_event(), 0);
      } catch (const std::exception&) {
        // the abort's own report of the timeout
      }
      return;
    }
    if (now >= ask) {
      // Between the collectives' library calls; a check waits for none of them.
      std::unique_lock<std::mutex> lib(lib_m_, std::try_to_lock);
      if (lib.owns_lock()) {
        try {
          if (pg.device_event_done(w.stage->end_event())) return;
        } catch (const std::exception& e) {
          fail_gpu(earlier + " failed: " + e.what() + aborted);  // the library aborted them
          return;
        }
        ask = now + std::chrono::milliseconds(1);
      }
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

c10::intrusive_ptr<DcBackend> DcBackend::start_completing_locked() {
  spare_locked();
  ++completing_;
  {
    std::lock_guard<std::mutex> l(live_m);
    ++live_entry(this, serial_)->holds;
  }
  return c10::intrusive_ptr<DcBackend>::unsafe_reclaim_from_nonowning(this);
}

void DcBackend::spare_locked() {
  if (idle_ > 0 || stop_workers_) return;
  reap_locked(nullptr);
  try {
    // A worker that ended and was joined leaves its Sleeper for the next one: a notify_one()
    // that a waker makes after unlocking may still come to its condition variable.
    auto unused = std::find_if(workers_.begin(), workers_.end(),
                               [](const Sleeper& w) { return w.ended && !w.thread.joinable(); });
    const bool reused = unused != workers_.end();
    Sleeper* me = reused ? &*unused : &workers_.emplace_back();
    me->ended = false;
    try {
      me->thread = std::thread([this, me] { loop(me); });
    } catch (...) {
      if (reused)
        me->ended = true;
      else
        workers_.pop_back();
      throw;
    }
    // Named as it starts (top -H, py-spy, debuggers; the tests count them).
    ::pthread_setname_np(me->thread.native_handle(), "pt_dc worker");
    ++idle_;  // idle from the start: it goes straight to waiting
  } catch (const std::system_error&) {
    // No thread to be had (a limit): the workers there are go on; only a callback that blocks
    // on what a missing worker would have run waits (bounded by its own timeout).
  }
}

void DcBackend::reap_locked(const Sleeper* self) {
  // An ended worker let go of m_ for the last time before it was seen ended here: the join
  // waits only for its thread's exit (its thread-local buffers freed).
  for (Sleeper& w : workers_)
    if (&w != self && w.ended && w.thread.joinable()) w.thread.join();
}

std::condition_variable* DcBackend::wake_one_locked() {
  if (asleep_.empty()) return nullptr;
  Sleeper* s = asleep_.back();
  asleep_.pop_back();
  s->woken = true;
  return &s->cv;
}

void DcBackend::wake_all_locked() {
  while (std::condition_variable* cv = wake_one_locked()) cv->notify_one();
}

void DcBackend::loop(Sleeper* me) {
  // Collectives run here while the caller's thread computes (DDP's backward): a wait that spins
  // would take a processor from it.
  dc::set_thread_spinning(false);
  std::unique_lock<std::mutex> l(m_);
  for (;;) {
    while (!finished_locked() && completions_.empty() && (queue_.empty() || busy_)) {
      me->woken = false;
      asleep_.push_back(me);
      const std::chrono::duration<double> limit(idle_limit_);
      if (me->cv.wait_for(l, limit, [&] { return me->woken; })) continue;
      // Idle too long: it ends if another worker is idle too (it takes what comes), else it
      // goes back to sleep.
      asleep_.erase(std::find(asleep_.begin(), asleep_.end(), me));
      if (idle_ > 1 && !stop_workers_) {
        --idle_;
        me->ended = true;
        reap_locked(me);  // one ended before: at most one ended worker is left unjoined
        return;
      }
    }
    Task t;
    // Held while callbacks run here: one that destroys the group (destroy_process_group) leaves
    // the backend's destructor to this worker, after them (see the end of the loop).
    c10::intrusive_ptr<DcBackend> self;
    bool returning = false;  // counted in order_->returning (finish_task)
    if (!queue_.empty() && !busy_) {  // the collectives first: the next one waits for them
      --idle_;
      spare_locked();  // a message may complete while the collective waits for its peer
      for (;;) {
        t = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        t.ticket = ++ran_;
        l.unlock();
        std::exception_ptr error = run_task(t);
        l.lock();
        busy_ = false;
        if (queue_.empty() && completions_.empty()) {
          // Completed here, even while another worker still completes an earlier one (order_
          // keeps the order): a hand-over would cost a wake-up per call.
          self = start_completing_locked();
          l.unlock();
          returning = finish_task(t, error, -1, true);
          break;
        }
        // Another worker completes it (its callbacks may block); this one goes on with the
        // next collective, if any, at once.
        completions_.push_back(Completion{std::move(t), error, -1});
        spare_locked();
        if (std::condition_variable* cv = wake_one_locked()) cv->notify_one();
        if (queue_.empty()) break;
      }
      if (!t.work) {  // handed over: nothing to release here
        ++idle_;
        settled_cv_.notify_all();
        continue;
      }
    } else if (!completions_.empty()) {
      Completion c = std::move(completions_.front());
      completions_.pop_front();
      --idle_;
      self = start_completing_locked();
      l.unlock();
      returning = finish_task(c.task, c.error, c.source, true);
      t = std::move(c.task);
    } else {  // shut down, and nothing left for this worker
      --idle_;
      wake_all_locked();  // one that went back to sleep while the queue was busy ends too
      return;
    }
    t.pg.reset();  // no tensor in it: the group goes here if it was shut down meanwhile
    l.lock();
    // Not released here: the last reference to a tensor that Python also knows takes the GIL,
    // and once the caller, woken by complete(), has let Python finalize, taking it ends this
    // thread in the middle of a destructor (std::terminate).  The caller's next call releases it.
    done_.push_back(std::move(t));
    ++idle_;
    --completing_;
    settled_cv_.notify_all();
    const uint64_t serial = serial_;
    // Shut down, nothing left: this worker ends here, without touching the backend once it lets
    // go of it (another thread may then destroy it, not waiting for a worker that detached).
    bool last = finished_locked();
    if (last) wake_all_locked();
    l.unlock();
    t_destroyed = nullptr;
    self.reset();  // the last reference: the destructor runs here, on this worker
    bool gone = t_destroyed == this;
    release_hold(this, serial);  // `this` as a name only: it may be gone
    if (gone || last) return;  // gone: this worker ran the destructor (which let it go)
    l.lock();
    if (returning) order_->returning.fetch_sub(1);  // back: it looks at the queue next
  }
}

std::exception_ptr DcBackend::failure(const char* name, const std::exception& e) const {
  return std::make_exception_ptr(std::runtime_error(std::string("pytorch_dc: ") + name +
                                                    " failed on rank " + std::to_string(getRank()) +
                                                    " of " + std::to_string(getSize()) + ": " +
                                                    e.what()));
}

c10::intrusive_ptr<c10d::Work> DcBackend::allreduce_one(const at::Tensor& t, c10d::ReduceOp op,
                                                        std::chrono::milliseconds timeout,
                                                        bool sync) {
  Reduction r = reduction_for(t, op, "allreduce");
  auto st = stage({t}, "allreduce");
  double s = seconds(timeout);
  if (on_device(st, {t}) && r.wire == t.scalar_type()) {
    // On the GPU (NCCL), enqueued on the backend's stream.
    at::Tensor g = st->native(t);
    DeviceStage* d = st.get();  // the task holds it
    auto n = static_cast<size_t>(g.numel());
    return enqueue(
        c10d::OpType::ALLREDUCE, "allreduce", {t},
        [=](dc::ProcessGroup& pg) {
          pg.allreduce_device(g.data_ptr(), n, r.dtype, r.op, d->stream(), s);
        },
        sync, st, s);
  }
  at::Tensor h = st ? st->inout(t) : t;
  return enqueue(
      c10d::OpType::ALLREDUCE, "allreduce", {t},
      [=](dc::ProcessGroup& pg) {
        at::Tensor w = flat(h).to(r.wire);
        pg.allreduce(w.data_ptr(), static_cast<size_t>(w.numel()), r.dtype, r.op, s);
        copy_back(h, w);
      },
      sync, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::AllreduceOptions& opts) {
  return allreduce_one(single(tensors, "allreduce"), opts.reduceOp, opts.timeout,
                       is_sync(opts, 0));
}

c10::intrusive_ptr<c10d::Work> DcBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) bad("allreduce_coalesced", "no tensors");
  Reduction r = reduction_for(tensors[0], opts.reduceOp, "allreduce_coalesced");
  for (auto& t : tensors)
    if (t.scalar_type() != tensors[0].scalar_type())
      bad("allreduce_coalesced", "tensors of different dtypes");
  auto st = stage(tensors, "allreduce_coalesced");
  double s = seconds(opts.timeout);
  std::vector<at::Tensor> ts;
  for (auto& t : tensors) ts.push_back(st ? st->inout(t) : t);
  return enqueue(
      c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors,
      [=](dc::ProcessGroup& pg) {
        at::Tensor buf = concat(ts, r.wire);
        pg.allreduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), r.dtype, r.op, s);
        split_into(buf, ts);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::reduce(std::vector<at::Tensor>& tensors,
                                                 const c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  Reduction r = reduction_for(t, opts.reduceOp, "reduce");
  auto st = stage({t}, "reduce");
  double s = seconds(opts.timeout);
  bool root = static_cast<int>(opts.rootRank) == getRank();
  at::Tensor h = st ? st->inout(t) : t;
  return enqueue(
      c10d::OpType::REDUCE, "reduce", {t},
      [=](dc::ProcessGroup& pg) {
        at::Tensor w = flat(h).to(r.wire);
        at::Tensor out = root ? w : at::empty_like(w);  // the result matters on the root only
        pg.allreduce(w.data_ptr(), out.data_ptr(), static_cast<size_t>(w.numel()), r.dtype, r.op,
                     s);
        if (root) copy_back(h, w);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                    const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  double s = seconds(opts.timeout);
  int root = static_cast<int>(opts.rootRank);
  auto st = stage({t}, "broadcast");
  if (on_device(st, {t})) {
    at::Tensor g = st->native(t);
    DeviceStage* d = st.get();
    size_t n = bytes_of(g);
    return enqueue(
        c10d::OpType::BROADCAST, "broadcast", {t},
        [=](dc::ProcessGroup& pg) {
          pg.broadcast_device(g.data_ptr(), n, dc::DType::U8, root, d->stream(), s);
        },
        false, st, s);
  }
  at::Tensor h = st ? st->inout(t) : t;
  return enqueue(
      c10d::OpType::BROADCAST, "broadcast", {t},
      [=](dc::ProcessGroup& pg) {
        at::Tensor w = flat(h);
        pg.broadcast(w.data_ptr(), bytes_of(w), dc::DType::U8, root, s);
        copy_back(h, w);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "allgather");
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize()))
    bad("allgather", "expected one output list of " + std::to_string(getSize()) + " tensors");
  for (auto& o : outputs[0]) same_shape(in, o, "allgather");
  std::vector<at::Tensor> all = outputs[0];
  all.push_back(in);
  auto st = stage(all, "allgather");
  double s = seconds(opts.timeout);
  at::Tensor hin = st ? st->in(in) : in;
  std::vector<at::Tensor> outs = staged_out(st.get(), outputs[0]);
  return enqueue(
      c10d::OpType::ALLGATHER, "allgather", outputs[0],
      [=](dc::ProcessGroup& pg) {
        at::Tensor i = flat(hin);
        at::Tensor buf = at::empty({i.numel() * static_cast<int64_t>(outs.size())}, i.options());
        pg.allgather(i.data_ptr(), buf.data_ptr(), bytes_of(i), dc::DType::U8, s);
        split_into(buf, outs);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                          const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return allgather_into_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> DcBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (outputs.size() != inputs.size()) bad("allgather_into_tensor", "unequal numbers of tensors");
  for (size_t k = 0; k < inputs.size(); ++k)
    if (outputs[k].numel() != inputs[k].numel() * getSize() ||
        outputs[k].scalar_type() != inputs[k].scalar_type())
      bad("allgather_into_tensor", "the output must hold world size times the input");
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  auto st = stage(all, "allgather_into_tensor");
  double s = seconds(opts.timeout);
  if (on_device(st, all)) {
    DeviceStage* d = st.get();
    std::vector<at::Tensor> gi = natives(d, inputs), go = natives(d, outputs);
    return enqueue(
        c10d::OpType::_ALLGATHER_BASE, "allgather_into_tensor", outputs,
        [=](dc::ProcessGroup& pg) {
          for (size_t k = 0; k < gi.size(); ++k)
            pg.allgather_device(gi[k].data_ptr(), go[k].data_ptr(), bytes_of(gi[k]),
                                dc::DType::U8, d->stream(), s);
        },
        false, st, s);
  }
  std::vector<at::Tensor> outs = staged_out(st.get(), outputs), ins = staged_in(st.get(), inputs);
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, "allgather_into_tensor", outputs,
      [=](dc::ProcessGroup& pg) {
        for (size_t k = 0; k < ins.size(); ++k) {
          at::Tensor i = flat(ins[k]), o = flat(outs[k]);
          pg.allgather(i.data_ptr(), o.data_ptr(), bytes_of(i), dc::DType::U8, s);
          copy_back(outs[k], o);
        }
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather");
  int root = static_cast<int>(opts.rootRank);
  bool is_root = root == getRank();
  std::vector<at::Tensor> outs;
  if (is_root) {
    if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize()))
      bad("gather", "expected one output list of " + std::to_string(getSize()) + " tensors");
    for (auto& o : outputs[0]) same_shape(in, o, "gather");
    outs = outputs[0];
  }
  std::vector<at::Tensor> all = outs;
  all.push_back(in);
  auto st = stage(all, "gather");
  double s = seconds(opts.timeout);
  at::Tensor hin = st ? st->in(in) : in;
  std::vector<at::Tensor> houts = staged_out(st.get(), outs);
  return enqueue(
      c10d::OpType::GATHER, "gather", outs,
      [=, outs = houts](dc::ProcessGroup& pg) {
    at::Tensor i = flat(hin), buf;
    if (is_root) buf = at::empty({i.numel() * static_cast<int64_t>(outs.size())}, i.options());
    pg.gather(i.data_ptr(), is_root ? buf.data_ptr() : nullptr, bytes_of(i), root, s);
    if (is_root) split_into(buf, outs);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter");
  int root = static_cast<int>(opts.rootRank);
  bool is_root = root == getRank();
  std::vector<at::Tensor> ins;
  if (is_root) {
    if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize()))
      bad("scatter", "expected one input list of " + std::to_string(getSize()) + " tensors");
    for (auto& i : inputs[0]) same_shape(out, i, "scatter");
    ins = inputs[0];
  }
  std::vector<at::Tensor> all = ins;
  all.push_back(out);
  auto st = stage(all, "scatter");
  double s = seconds(opts.timeout);
  at::Tensor hout = st ? st->out(out) : out;
  std::vector<at::Tensor> hins = staged_in(st.get(), ins);
  return enqueue(
      c10d::OpType::SCATTER, "scatter", {out},
      [=](dc::ProcessGroup& pg) {
        at::Tensor o = flat(hout), buf;
        if (is_root) buf = concat(hins, hout.scalar_type());
        pg.scatter(is_root ? buf.data_ptr() : nullptr, o.data_ptr(), bytes_of(o), root, s);
        copy_back(hout, o);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter");
  if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize()))
    bad("reduce_scatter", "expected one input list of " + std::to_string(getSize()) + " tensors");
  for (auto& i : inputs[0]) same_shape(out, i, "reduce_scatter");
  Reduction r = reduction_for(out, opts.reduceOp, "reduce_scatter");
  std::vector<at::Tensor> all = inputs[0];
  all.push_back(out);
  auto st = stage(all, "reduce_scatter");
  double s = seconds(opts.timeout);
  std::vector<at::Tensor> ins = staged_in(st.get(), inputs[0]);
  at::Tensor hout = st ? st->out(out) : out;
  return enqueue(
      c10d::OpType::REDUCE_SCATTER, "reduce_scatter", {out},
      [=](dc::ProcessGroup& pg) {
        at::Tensor buf = concat(ins, r.wire);
        at::Tensor o = at::empty({hout.numel()}, buf.options());
        pg.reduce_scatter(buf.data_ptr(), o.data_ptr(), static_cast<size_t>(o.numel()), r.dtype,
                          r.op, s);
        if (hout.numel()) hout.copy_(o.view(hout.sizes()));
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> DcBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != inputs.size() || inputs.empty())
    bad("reduce_scatter_tensor", "unequal numbers of tensors");
  std::vector<Reduction> rs;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].numel() != outputs[k].numel() * getSize() ||
        outputs[k].scalar_type() != inputs[k].scalar_type())
      bad("reduce_scatter_tensor", "the input must hold world size times the output");
    rs.push_back(reduction_for(inputs[k], opts.reduceOp, "reduce_scatter_tensor"));
  }
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  auto st = stage(all, "reduce_scatter_tensor");
  double s = seconds(opts.timeout);
  bool as_is = true;  // every tensor reduced in its own dtype (not int8/bool in a wider one)
  for (size_t k = 0; k < inputs.size(); ++k) as_is = as_is && rs[k].wire == inputs[k].scalar_type();
  if (on_device(st, all) && as_is) {
    DeviceStage* d = st.get();
    std::vector<at::Tensor> gi = natives(d, inputs), go = natives(d, outputs);
    return enqueue(
        c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", outputs,
        [=](dc::ProcessGroup& pg) {
          for (size_t k = 0; k < gi.size(); ++k)
            pg.reduce_scatter_device(gi[k].data_ptr(), go[k].data_ptr(),
                                     static_cast<size_t>(go[k].numel()), rs[k].dtype, rs[k].op,
                                     d->stream(), s);
        },
        false, st, s);
  }
  std::vector<at::Tensor> outs = staged_out(st.get(), outputs), ins = staged_in(st.get(), inputs);
  return enqueue(
      c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", outputs,
      [=](dc::ProcessGroup& pg) {
    for (size_t k = 0; k < ins.size(); ++k) {
      at::Tensor i = flat(ins[k]).to(rs[k].wire);
      // Into the output itself where it is contiguous and of the reduced type.
      at::Tensor o = outs[k].scalar_type() == rs[k].wire ? flat(outs[k])
                                                         : at::empty({outs[k].numel()}, i.options());
      pg.reduce_scatter(i.data_ptr(), o.data_ptr(), static_cast<size_t>(o.numel()),
                        rs[k].dtype, rs[k].op, s);
      copy_back(outs[k], o);
    }
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                        std::vector<int64_t>& output_splits,
                                                        std::vector<int64_t>& input_splits,
                                                        const c10d::AllToAllOptions& opts) {
  if (output.scalar_type() != input.scalar_type()) bad("alltoall_base", "different dtypes");
  auto sb = split_bytes(input, input_splits, getSize(), "alltoall_base");
  auto rb = split_bytes(output, output_splits, getSize(), "alltoall_base");
  auto st = stage({input, output}, "alltoall_base");
  double s = seconds(opts.timeout);
  at::Tensor in = st ? st->in(input) : input, out = st ? st->out(output) : output;
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, "alltoall_base", {output},
      [=](dc::ProcessGroup& pg) {
        at::Tensor i = flat(in), o = flat(out);
        pg.alltoall(i.data_ptr(), sb.data(), o.data_ptr(), rb.data(), s);
        copy_back(out, o);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::AllToAllOptions& opts) {
  size_t n = static_cast<size_t>(getSize());
  if (outputs.size() != n || inputs.size() != n)
    bad("alltoall", "expected " + std::to_string(n) + " input and output tensors");
  std::vector<size_t> sb, rb;
  for (size_t r = 0; r < n; ++r) {
    if (inputs[r].scalar_type() != outputs[0].scalar_type() ||
        outputs[r].scalar_type() != outputs[0].scalar_type())
      bad("alltoall", "tensors of different dtypes");
    sb.push_back(bytes_of(inputs[r]));
    rb.push_back(bytes_of(outputs[r]));
  }
  std::vector<at::Tensor> all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  auto st = stage(all, "alltoall");
  double s = seconds(opts.timeout);
  std::vector<at::Tensor> ins = staged_in(st.get(), inputs), outs = staged_out(st.get(), outputs);
  return enqueue(
      c10d::OpType::ALLTOALL, "alltoall", outputs,
      [=](dc::ProcessGroup& pg) {
        at::Tensor i = concat(ins, ins[0].scalar_type());
        at::Tensor o = concat(outs, outs[0].scalar_type());
        pg.alltoall(i.data_ptr(), sb.data(), o.data_ptr(), rb.data(), s);
        split_into(o, outs);
      },
      false, st);
}

c10::intrusive_ptr<c10d::Work> DcBackend::barrier(const c10d::BarrierOptions& opts) {
  double s = seconds(opts.timeout);
  return enqueue(c10d::OpType::BARRIER, "barrier", {},
                 [=](dc::ProcessGroup& pg) { pg.barrier(s); });
}

c10::intrusive_ptr<c10d::Work> DcBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                               int tag) {
  return message(true, tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> DcBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                               int tag) {
  return message(false, tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> DcBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                        int tag) {
  return message(false, tensors, dc::Mailbox::kAnySource, tag);
}

c10::intrusive_ptr<c10d::Work> DcBackend::message(bool send, const std::vector<at::Tensor>& tensors,
                                                  int peer, int tag) {
  const char* name = send ? "send" : "recv";
  const at::Tensor& t = single(tensors, name);
  if (peer == getRank() || peer < dc::Mailbox::kAnySource || peer >= getSize() ||
      (send && peer == dc::Mailbox::kAnySource))
    bad(name, "rank " + std::to_string(peer) + " is not another rank of this group of " +
                  std::to_string(getSize()));
  if (tag < 0) bad(name, "tags are 0 or more, not " + std::to_string(tag));
  // A CUDA tensor goes through host memory: sent as it is once the caller's stream got there
  // (copied at once); received into a pinned host tensor, which the mailbox thread copies to it
  // on the backend's stream after the caller's stream got to the recv (the stage's events, as a
  // collective's: wait() makes the caller's current stream wait for the copy).
  std::shared_ptr<DeviceStage> st = t.is_cuda() && !send ? stage({t}, name) : nullptr;
  if (st) st->native(t);  // written on the backend's stream: recordStream()ed there
  auto work = c10::make_intrusive<DcWork>(getRank(), send ? c10d::OpType::SEND
                                          : peer < 0       ? c10d::OpType::RECVANYSOURCE
                                                           : c10d::OpType::RECV,
                                          name, std::vector<at::Tensor>{t}, st, order_);
  at::Tensor wire =
      !t.is_cuda() ? flat(t)
      : send       ? t.reshape({-1}).to(at::kCPU)
                   : at::empty({t.numel()}, t.options().device(at::kCPU).pinned_memory(true));
  Message m{Task{work, name, nullptr, {}, st, std::nullopt}, send, t, wire, peer, tag};
  std::vector<Task> done;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stop_) bad(name, "the process group was shut down");
    messages_.push_back(std::move(m));
    sends_open_ += send;
    done.swap(done_);
  }
  wake_mailbox_thread();
  return work;  // `done` goes here, on the caller's thread
}

void DcBackend::wake_mailbox_thread() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
}

void DcBackend::post(Message& m) {
  size_t bytes = bytes_of(m.wire);
  m.id = m.send ? mailbox_->isend(m.wire.data_ptr(), bytes, m.peer, m.tag, timeout_s_)
                : mailbox_->irecv(m.wire.data_ptr(), bytes, m.peer, m.tag, timeout_s_);
}

void DcBackend::finish(Message& m, std::exception_ptr e, int source) {
  DeviceStage* st = m.task.stage.get();
  if (!e && !m.send) {
    at::AutoDispatchBelowADInplaceOrView below;  // the recv's copy (see run_task)
    try {
      if (!st) {
        copy_back(m.user, m.wire);
      } else if (m.user.numel()) {  // enqueued, not waited for (see message())
        st->on_stream([&] {
          st->begin(-1, gpu_failed_);  // nothing to copy in: only the wait for the caller's stream
          m.user.copy_(m.wire.view(m.user.sizes()), /*non_blocking=*/true);
          st->end();
        });
      }
    } catch (const std::exception& x) {
      e = failure(m.task.name, x);
    }
  }
  // Completed by a worker: a callback of its Future may wait for another message, which this
  // thread must be free to move.
  m.task.keep = {std::move(m.user), std::move(m.wire)};
  std::condition_variable* wake;
  {
    std::lock_guard<std::mutex> l(m_);
    completions_.push_back(Completion{std::move(m.task), e, source});
    sends_open_ -= m.send;
    wake = wake_one_locked();
  }
  if (wake) wake->notify_one();
  if (m.send) settled_cv_.notify_all();  // a drain or a shutdown may wait for the sends
}

// The mailbox thread: posts what callers queued, moves every message in flight, completes what
// is done.  Between, it sleeps in poll() on the connections and wake_fd_.
void DcBackend::p2p_loop() {
  std::deque<Message> open;
  for (;;) {
    std::deque<Message> fresh;
    bool stop;
    {
      std::lock_guard<std::mutex> l(m_);
      fresh.swap(messages_);
      stop = stop_;
    }
    uint64_t n;
    while (::read(wake_fd_, &n, sizeof n) > 0) {
    }
    for (auto& m : fresh) {
      try {
        post(m);
        open.push_back(std::move(m));
      } catch (const std::exception& e) {
        finish(m, failure(m.task.name, e));
      }
    }
    if (stop) {
      for (auto& m : open)
        finish(m, std::make_exception_ptr(std::runtime_error(
                      std::string("pytorch_dc: ") + m.task.name +
                      " not completed: the process group was shut down")));
      return;
    }
    bool moved = false;
    try {
      moved = mailbox_->progress();
    } catch (const std::exception&) {  // the requests' own tests below say what failed
    }
    for (auto it = open.begin(); it != open.end();) {
      int source = -1;
      try {
        if (!mailbox_->test(it->id, &source)) {
          ++it;
          continue;
        }
        finish(*it, nullptr, source);
      } catch (const std::exception& e) {
        finish(*it, failure(it->task.name, e));
      }
      it = open.erase(it);
      moved = true;
    }
    if (!moved) mailbox_->idle(100, wake_fd_);
  }
}

}  // namespace pytorch_dc
