// The "dc" backend of torch.distributed: a c10d::Backend over a DataChannel ProcessGroup.
//
// The group is bootstrapped through the c10d::Store that init_process_group (or new_group) hands
// the backend, under that store's prefix: ProcessGroup::init(rank, size, Exchange).  Every
// collective is queued to the backend's own thread, which runs them one after the other in the
// order they were issued (the DataChannel is used by one thread); the returned Work completes, and
// its Future is marked with the output tensors, when the thread is done with it.  Errors (a dead
// peer, mismatched calls, a timeout) complete the Work with an exception naming the collective and
// this rank; after one, the group raises on every call.  Sends and receives (tags, any source)
// go through a dc::Mailbox on a second thread, independent of the collectives.
//
// CUDA tensors (built with PYTORCH_DC_CUDA: torch has CUDA and libpytorch_dc the GPU path), with
// the stream semantics of ProcessGroupNCCL: see DeviceStage (device.cpp).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pytorch_exec/dc.hpp"

namespace pytorch_dc {

namespace dc = pytorch_exec::dc;

// Whether this build takes CUDA tensors: compiled with CUDA support, libpytorch_dc has the GPU
// path, and PYTORCH_DC_CUDA is not 0 (device.cpp).
bool cuda_support();
// The device of a collective's tensors (all on one device: the CPU, or one GPU where
// cuda_support()); otherwise throws naming `what`.
at::Device device_of(const std::vector<at::Tensor>& ts, const char* what);
at::Device checked_device(at::Device d, const char* what);  // the same for one device

// The stream side of one collective on CUDA tensors (device.cpp), with ProcessGroupNCCL's
// semantics.  Made on the caller's thread at issue: it records an event on the caller's current
// stream.  Where the collective runs (a worker, or the caller's thread for a synchronous call
// with nothing queued), in issue order: begin() makes the backend's stream of that GPU wait for
// that event, makes it current, and copies what the collective reads from the GPU into pinned
// host tensors (in(), inout()); the host collective runs on those; end() copies the
// results back (out(), inout()) and records the end event, all on the backend's stream.  A
// collective the library runs on device memory itself uses the GPU tensors as they are (native())
// and enqueues its work on stream() between begin() and end().  The Work then makes the caller's
// stream wait for the end event (wait(), synchronize()), not the host.  The tensors are
// recordStream()ed on the backend's stream, so the caching allocator keeps them until it is done.
class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  // The tensor the collective works on in place of `t`: a pinned host copy of a GPU tensor.
  // in: read by the collective (copied in); out: written (copied back); inout: both.
  virtual at::Tensor in(const at::Tensor& t) = 0;
  virtual at::Tensor out(const at::Tensor& t) = 0;
  virtual at::Tensor inout(const at::Tensor& t) = 0;
  // `t` itself, on the GPU, for a collective the library runs on device memory.
  virtual at::Tensor native(const at::Tensor& t) = 0;
  virtual void* stream() const = 0;  // the backend's cudaStream_t for this GPU
  // The cudaEvent_t that end() recorded (nullptr before, and for host stages).
  virtual void* end_event() const = 0;
  // Where the collective runs: before and after it.  begin() waits (at most `timeout` seconds,
  // < 0: none) for the copies to host, which follow the caller's pending work; it gives up,
  // throwing, once `failed` is set (the watcher found an earlier collective's GPU work failed:
  // the copies may wait behind it).
  virtual void begin(double timeout, const std::atomic<bool>& failed) = 0;
  virtual void end() = 0;
  // Runs `f` with the backend's stream current (marking the Future records its events there).
  virtual void on_stream(const std::function<void()>& f) = 0;
  // The caller's side: its current stream waits for the end event; whether the GPU is done.
  virtual void block_current_stream() = 0;
  virtual bool query() = 0;
};
std::vector<at::Tensor> staged_in(DeviceStage* d, const std::vector<at::Tensor>& ts);
std::vector<at::Tensor> staged_out(DeviceStage* d, const std::vector<at::Tensor>& ts);
// The backend's streams, one per GPU, made at first use (device.cpp).
class DeviceStreams;
// nullptr for the CPU.
std::shared_ptr<DeviceStage> device_stage(const std::shared_ptr<DeviceStreams>& streams,
                                          at::Device d, const char* what);
std::shared_ptr<DeviceStreams> device_streams();

// The order in which a backend's collectives complete: the order they ran, which is the order
// they were issued.  Each gets a ticket (1, 2, ...) when it runs; its completion waits for the
// one before to be marked completed (not for that one's callbacks to return), at most `limit`
// seconds (then it goes on out of order rather than hang).  Shared by a backend and its Works,
// it also holds the count of workers returning to the queue (the one thing of the pool that a
// Work must reach).
class CompletionOrder {
 public:
  explicit CompletionOrder(double limit) : limit_(limit) {}
  void wait_turn(uint64_t ticket);
  void done(uint64_t ticket);
  // Workers that completed a Work whose Future the program never took (so no callback of the
  // program runs on them) and are on their way back to the queue, from
  // just before the Work completed until they are back (counted down under the backend's
  // lock).  While there are any, a call queued meanwhile wakes no idle worker: one of these
  // finds it.
  std::atomic<int> returning{0};

 private:
  double limit_;
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t next_ = 1;
};

// One queued operation: completes with its output tensors (the Future's value) or an error.
class DcWork : public c10d::Work {
 public:
  DcWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
         std::shared_ptr<DeviceStage> stage, std::shared_ptr<CompletionOrder> order);
  std::vector<at::Tensor> result() override { return outputs_; }
  // GPU tensors: the host waits until the work is issued (or failed), the current stream until
  // the GPU has done it.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  void blockCurrentStream() override { synchronize(); }
  bool isCompleted() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    future_taken_.store(true);
    return future_;
  }
  // The rank a receive took its message from (recv from any source).
  int sourceRank() const override { return source_; }
  // Marks the Future (value or error), then the Work, before the Future's callbacks run.
  // ticket: a collective's place in the completion order (0: a message, in no order).
  // back: called on a worker that goes back to the queue right after.  Returns whether it
  // counted that worker in CompletionOrder::returning: `back`, and the Future was not taken, so
  // nothing but the Work's own completion ran on it.  The worker counts itself out once back.
  bool complete(std::exception_ptr error, int source, uint64_t ticket, bool back);

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<CompletionOrder> order_;
  uint64_t ticket_ = 0;
  std::shared_ptr<DeviceStage> stage_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_ = -1;
  // Set by complete(): the work is issued (its end event recorded).  Not the base class's
  // completed_: c10d::Work::wait() calls synchronize() holding the base class's mutex.
  std::mutex issued_m_;
  std::condition_variable issued_cv_;
  bool issued_ = false;
  std::atomic<bool> future_taken_{false};  // getFuture() was called: callbacks may be added
  bool back_ = false;  // complete()'s, until the first callback finds the Future taken
};

class DcBackend : public c10d::Backend {
 public:
  DcBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
            std::chrono::milliseconds timeout);
  ~DcBackend() override;

  const std::string getBackendName() const override { return "dc"; }
  // The DataChannel's transports ("shm/tcp") and layout, for users and tests.
  std::string describe() const;
  void shutdown() override;
  // dist.split_group: a new group of `ranks` (this group's ranks, sorted), bootstrapped through
  // `store`; nullptr where this rank is not among them.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  struct Task {
    c10::intrusive_ptr<DcWork> work;
    const char* name;
    std::function<void(dc::ProcessGroup&)> run;  // the library call, on the group below
    std::vector<at::Tensor> keep;  // a message's tensors, until the task is released
    std::shared_ptr<DeviceStage> stage;  // GPU tensors (else nullptr)
    // GPU work the library enqueued, to be watched (queue_watch): how long it may take, in
    // seconds (< 0: the group's default); none: nothing to watch.
    std::optional<double> watch;
    uint64_t ticket = 0;  // a collective's place in order_, given when it runs
    bool watched = false;  // queued for the watcher (else finish_task watches it)
    // A collective's library group, from enqueue() until the task is done: a worker lets go of
    // it after completing the task (its tensors wait for a caller's thread, see loop()), so a
    // group that was shut down meanwhile closes there.
    std::shared_ptr<dc::ProcessGroup> pg;
  };
  // A send or receive for the mailbox thread (p2p_loop).
  struct Message {
    Task task;
    bool send;
    at::Tensor user, wire;  // the caller's tensor and its flat contiguous form
    int peer, tag;
    uint64_t id = 0;  // the Mailbox request, once posted
  };
  // Queues `run` for the workers; the Work completes with `outputs`.
  // sync: the caller waits at once (async_op=False); run on its thread if nothing is queued.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* name,
                                         std::vector<at::Tensor> outputs,
                                         std::function<void(dc::ProcessGroup&)> run,
                                         bool sync = false,
                                         std::shared_ptr<DeviceStage> stage = nullptr,
                                         std::optional<double> watch = std::nullopt);
  // The stage of a collective on the tensors `ts` (nullptr on the CPU); throws naming `what`.
  std::shared_ptr<DeviceStage> stage(const std::vector<at::Tensor>& ts, const char* what);
  // A collective's part under busy_: the library call (and its staging); its error, if any.
  std::exception_ptr run_task(Task& t);
  // After busy_ is released: completes the Work (the Future's callbacks run here, and may issue
  // and wait for more collectives; `source`: a recv's sender).
  // worker: called by loop(), which goes back to the queue after (a caller's thread, also a
  // worker's in a callback that runs a collective inline, goes back to the program instead).
  // Returns whether the worker was counted in CompletionOrder::returning (DcWork::complete).
  bool finish_task(Task& t, std::exception_ptr error, int source, bool worker);
  // The GPU work of the collectives that ran, queued in issue order by run_task and watched by
  // one thread (started at the first), while the callers and workers go on: watch() polls a
  // Watch's end event (every 50 us at first, backing off to every millisecond), and asks the
  // library every millisecond, between collectives (lib_m_), whether an NCCL communicator
  // failed.  An error, or the end of its time, fails the group
  // (fail_gpu: every later collective raises it, and a collective waiting in
  // DeviceStage::begin gives up) and aborts its NCCL communicators.
  struct Watch {
    std::shared_ptr<DeviceStage> stage;  // its end event
    std::shared_ptr<dc::ProcessGroup> pg;  // asked, and aborted, while it is watched
    const char* name;
    double seconds;
    std::chrono::steady_clock::time_point deadline;
  };
  Watch watch_of(const Task& t) const;
  bool queue_watch(const Task& t);  // under lib_m_; false: no watcher thread takes it
  void watch_loop();
  void watch(const Watch& w);  // with the stage's GPU current
  void watch_on_its_gpu(const Watch& w);  // watch() with it current; never throws
  std::string gpu_failure();
  void fail_gpu(const std::string& why);  // the first failure is kept
  // A worker thread: runs the queued collectives one at a time, in order, and completes them
  // and the mailbox thread's messages.  A collective with more queued behind it is handed over
  // to be completed by another worker while this one goes on; a worker that runs or completes
  // anything (user callbacks, which may block and may issue collectives) first makes sure
  // another one is idle (spare_locked), so that neither the queue nor a message waits for it.
  // Works and their Futures complete in issue order (order_); the callbacks of several may run
  // at once, on different workers.  The workers are at least as many as callbacks block at
  // once, plus one (a few more start when many calls are queued at once: completions are
  // handed over; and when calls follow closely whose Futures were taken: it is not idle yet).
  // The worker that went to sleep last is woken first, and none is woken for a call queued
  // while a worker returns from a completion that ran no program code
  // (CompletionOrder::returning): that one takes it.  A worker asleep for
  // idle_limit_ while another is idle too ends (so a burst of blocking callbacks does not leave
  // its threads for the process's life); the others stay until shutdown.
  struct Sleeper;
  void loop(Sleeper* me);
  void spare_locked();
  // Joins the workers that ended (Sleeper::ended), `self` aside; their Sleepers are reused.
  void reap_locked(const Sleeper* self);
  // Before a worker completes a Work: a spare worker, completing_ counted, and the backend held
  // (see loop()).
  c10::intrusive_ptr<DcBackend> start_completing_locked();

 public:
  // Waits, at most `seconds`, until nothing is queued, running or being completed, and no send
  // is in flight (callbacks that issue more are waited for too; receives are not: nothing may
  // come); whether the backend is shut down.  drain_all() does it
  // for every backend alive, for pytorch_dc's atexit handler: a Future's Python callback that
  // ran while Python finalizes would end its thread mid-C++ (std::terminate), as with gloo.  Of
  // a backend shut down, it also waits for the workers that hold it (one may be about to destroy
  // it, releasing tensors that Python knows), not for references the program holds.
  bool drain(double seconds);
  static void drain_all();

 private:
  c10::intrusive_ptr<c10d::Work> message(bool send, const std::vector<at::Tensor>& tensors,
                                         int peer, int tag);
  void p2p_loop();
  void wake_mailbox_thread();
  void post(Message& m);
  // Copies a received tensor to its place and hands `m` to the workers to complete (an error:
  // e, else done).
  void finish(Message& m, std::exception_ptr e, int source = -1);
  std::exception_ptr failure(const char* name, const std::exception& e) const;
  double seconds(std::chrono::milliseconds t) const;
  c10::intrusive_ptr<c10d::Work> allreduce_one(const at::Tensor& t, c10d::ReduceOp op,
                                               std::chrono::milliseconds timeout, bool sync);

  // The library's group, until shutdown() lets go of it (under m_ from then on; each task holds
  // its own reference).
  std::shared_ptr<dc::ProcessGroup> pg_;
  std::shared_ptr<DeviceStreams> streams_;
  std::mutex failure_m_;
  std::string gpu_failure_;  // under failure_m_: a watch failed; every later collective raises it
  std::atomic<bool> gpu_failed_{false};  // set once gpu_failure_ is
  std::deque<Watch> watches_;  // under m_: the first is being watched
  bool stop_watcher_ = false;  // under m_: the watcher ends once watches_ is empty
  bool watcher_asleep_ = false;  // under m_: it waits on watch_cv_ (else it polls watches_)
  std::condition_variable watch_cv_;
  std::thread watcher_;
  double timeout_s_;
  // The library group is used by one thread at a time: a collective's run, a watch's check.
  std::mutex lib_m_;
  mutable std::mutex m_;  // (describe() reads pg_ under it)
  std::deque<Task> queue_;
  // A collective run or a message moved, for a worker to complete (finish_task).
  struct Completion {
    Task task;
    std::exception_ptr error;
    int source;
  };
  std::deque<Completion> completions_;
  std::vector<Task> done_;  // run by loop(), released by a caller's thread (see loop())
  bool stop_ = false;          // no more calls; the mailbox thread ends
  bool stop_workers_ = false;  // the workers end once nothing is left (after the mailbox thread)
  bool busy_ = false;  // a collective is running (on a worker, or inline on a caller's thread)
  uint64_t ran_ = 0;   // collectives run so far: the last ticket given
  std::shared_ptr<CompletionOrder> order_;
  uint64_t serial_ = 0;  // in the registry of backends alive (drain_all())
  // A worker: its thread, and its wait while idle.  The one that went to sleep last is woken
  // first (wake_one_locked): its caches are warm, and the others stay asleep as spares.  (One
  // condition variable for all would wake the one asleep longest: the workers took turns, which
  // cost a quarter more per small asynchronous call.)
  struct Sleeper {
    std::condition_variable cv;
    bool woken = false;  // under m_
    bool ended = false;  // under m_: it left loop() (idle too long); joined: free for reuse
    std::thread thread;
  };
  // Under m_ until stop_workers_, then only shutdown() touches it.  Never shrinks (a Sleeper
  // stays where it is for the backend's life): as many as workers were alive at once.
  std::deque<Sleeper> workers_;
  // PYTORCH_DC_WORKER_IDLE (seconds; default 10): how long a worker waits idle before it ends,
  // when another is idle too.
  double idle_limit_ = 10;
  std::vector<Sleeper*> asleep_;  // under m_: the idle workers waiting, the last asleep last
  // Under m_: takes the last worker asleep off asleep_; its condition variable, to be notified
  // (best after unlocking, where the caller unlocks next; nullptr: none asleep).
  std::condition_variable* wake_one_locked();
  void wake_all_locked();  // every worker asleep (shutdown, and workers ending after it)
  // Shut down, and nothing left to run or complete: the workers end.
  bool finished_locked() const { return stop_workers_ && queue_.empty() && completions_.empty(); }
  int idle_ = 0;        // workers waiting for something to do, or starting
  int completing_ = 0;  // workers completing a Work (running its Future's callbacks)
  std::condition_variable settled_cv_;  // for drain(): a collective or a completion ended
  // Sends and receives: their own connections (a dc::Mailbox) and thread, so that they run
  // while collectives do and several are in flight at once (an exchange, a pipeline).
  std::unique_ptr<dc::Mailbox> mailbox_;
  std::deque<Message> messages_;  // posted by callers, under m_
  int sends_open_ = 0;  // under m_: sends queued or in flight, not yet completed
  int wake_fd_ = -1;              // an eventfd: wakes the mailbox thread
  std::thread p2p_thread_;
};

// The tensor helpers of backend.cpp (tensors.cpp).
struct Reduction {
  dc::DType dtype;
  dc::Op op;
  at::ScalarType wire;  // the tensor type the DataChannel reduces (int8 goes as int32)
};
// The DataChannel's dtype and op for a reduction of `t` by `op`; throws naming `what`.
Reduction reduction_for(const at::Tensor& t, const c10d::ReduceOp& op, const char* what);
// Bytes of a tensor, and `t` as one contiguous flat tensor (a copy when it is not contiguous).
size_t bytes_of(const at::Tensor& t);
at::Tensor flat(const at::Tensor& t);
// Copies `src` (flat) back into `dst` where they are not the same memory.
void copy_back(const at::Tensor& dst, const at::Tensor& src);
// The one tensor of a per-device list; throws naming `what` when there are several or none, or
// it is on a device the backend does not take.
const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* what);

}  // namespace pytorch_dc
