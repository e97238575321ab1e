// DataChannel: collectives for training programs started by pytorch_exec (or srun, or mpirun).
//
//   auto pg = pytorch_exec::dc::ProcessGroup::init();         // PMIx or env:// bootstrap
//   pg->allreduce(grad.data(), grad.size(), dc::DType::F32, dc::Op::Sum);
//
// A process group connects its ranks with one transport per level: `shm` (POSIX shared memory)
// between ranks on the same node, `tcp` or `mpi` (MPI point-to-point calls only, never MPI's
// collectives) between nodes.  Large allreduces are rings (reduce-scatter + allgather, chunked so
// that reduction overlaps transfer), small ones recursive doubling; with ranks on several nodes,
// allreduce is hierarchical: reduce-scatter inside each node, a ring per shard across nodes,
// allgather inside the node.  Every operation has a timeout; a dead peer or mismatched calls raise
// dc::Error on every rank that notices instead of hanging; after an error the group is unusable.
// See pytorch_dc(3).
//
// Thread safety: a ProcessGroup is used by one thread at a time; collectives on one group are
// called in the same order by all of its ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pytorch_exec::dc {

enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U8 };
enum class Op : uint8_t { Sum, Prod, Min, Max, Avg };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* op_name(Op o);

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class TimeoutError : public Error {
 public:
  using Error::Error;
};

struct Options {
  // Transports: "shm", "tcp" or "mpi" inside a node, "tcp" or "mpi" across nodes.  Empty:
  // PYTORCH_DC_INTRA / PYTORCH_DC_INTER, else PYTORCH_DC_TRANSPORT (both levels; "shm" means shm
  // inside and tcp across), else shm inside, tcp across.  Every name that is set, also one that a
  // more specific setting overrides, must be one of these: otherwise init fails with an Error
  // naming the field or variable.  Collectives other than allreduce, and send/recv, use the
  // inter-node transport between all ranks.
  std::string intra;
  std::string inter;
  // Default timeout of every operation, seconds (PYTORCH_DC_TIMEOUT; default 300).
  double timeout = 0;
  // Allreduces of at most this many bytes use recursive doubling (PYTORCH_DC_SMALL; 32 KiB).
  size_t small_bytes = 0;
  // Hierarchical allreduce, reduce_scatter, allgather and broadcast when ranks share nodes
  // (PYTORCH_DC_HIERARCHICAL=0 turns it off).
  int hierarchical = -1;
  // Carry f32 as bf16 between nodes (PYTORCH_DC_BF16_WIRE=1): half the bytes, a relative error
  // of up to 2^-8 per hop.  Off by default.
  int bf16_wire = -1;
};

// A key-value exchange that the caller provides for the bootstrap (e.g. torch's c10d::Store):
// init(rank, size, exchange) finds the other ranks through it instead of PMIx or env://.  `set`
// stores a value; `get` waits until the key exists and returns its value, throwing (anything) after
// `timeout` seconds.  Keys are unique within one init(); the ranks of one group share a namespace.
struct Exchange {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key, double timeout)> get;
  // Optional: adds `delta` to the counter `key` and returns the new value.  With it, several
  // init()s through one exchange (a group destroyed and made again) each use keys of their own.
  std::function<int64_t(const std::string& key, int64_t delta)> add;
  // This rank's node: empty = PYTORCH_DC_NODE, else PYTORCH_EXEC_NODEID with PYTORCH_EXEC_JOBID,
  // else this machine's identity (host name and boot id).  Ranks with the same node share memory.
  std::string node;
  // A host the other ranks reach (MASTER_ADDR, the store's host): this rank publishes its address
  // toward it.  Empty: MASTER_ADDR, else this host's name.
  std::string toward;
};

class Mailbox;

class ProcessGroup {
 public:
  // Bootstrap: from PMIx when the process is a PMIx client (under pytorch_exec, srun --mpi=pmix
  // or mpirun), else from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://; a small TCP
  // store on rank 0 at MASTER_PORT+1, or PYTORCH_DC_PORT).  The node of each rank is its host
  // name, or PYTORCH_DC_NODE when set (to simulate several nodes on one machine).
  static std::shared_ptr<ProcessGroup> init(const Options& opts = {});
  // `n` ranks as threads of this process, sharing an in-memory store (tests); nodes[i] is the
  // node of rank i (default: all on one node).
  static std::vector<std::shared_ptr<ProcessGroup>> threads(int n, const Options& opts = {},
                                                            std::vector<int> nodes = {});

  // Rank `rank` of `size`, bootstrapped through `exchange` (kv_bootstrap.cpp).
  static std::shared_ptr<ProcessGroup> init(int rank, int size, const Exchange& exchange,
                                            const Options& opts = {});

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  int node() const;  // index of this rank's node (0 ... nodes-1, in order of first rank)
  int nodes() const;
  int local_rank() const;
  int local_size() const;
  // The locality domain of this rank, or of rank `rank`, on its node: PYTORCH_EXEC_DOMAIN, which
  // pytorch_exec sets from the machine's topology (the GPUs and NICs of one PCIe root complex or
  // NVLink island, or a NUMA node), exchanged at init like the node; 0 where it is unset.
  int domain() const;
  int domain_of(int rank) const;
  const std::string& intra_transport() const;
  const std::string& inter_transport() const;
  // The lanes of this node's shared memory (PYTORCH_DC_SHM_THREADS): the threads of each rank
  // for a large allreduce (across nodes: the fewest of any node, each lane with tcp connections
  // of its own between nodes); 0 when the group uses none on this node (one rank here, or not
  // shm).
  int shm_lanes() const;
  // The default timeout of its operations, seconds (Options::timeout or PYTORCH_DC_TIMEOUT).
  double timeout() const;

  // timeout < 0: the group's default.  `count` is in elements.
  void allreduce(void* buf, size_t count, DType t, Op op, double timeout = -1);
  void allreduce(const void* in, void* out, size_t count, DType t, Op op, double timeout = -1);
  // in: size()*count elements; out: count elements, this rank's block.
  void reduce_scatter(const void* in, void* out, size_t count, DType t, Op op, double timeout = -1);
  // in: count elements; out: size()*count, rank r's block at r*count.  in may alias its block.
  void allgather(const void* in, void* out, size_t count, DType t, double timeout = -1);
  void broadcast(void* buf, size_t count, DType t, int root, double timeout = -1);
  void barrier(double timeout = -1);
  void send(const void* buf, size_t bytes, int peer, double timeout = -1);
  void recv(void* buf, size_t bytes, int peer, double timeout = -1);
  // Personalized exchanges (exchange.cpp), in bytes.  alltoall: send_bytes[r] bytes go to rank r,
  // taken in order from `in`; recv_bytes[r] come from rank r, placed in order into `out` (both
  // size() entries, this rank's block copied locally).  gather: every rank's `bytes` land at
  // out + r*bytes on `root` (out: size()*bytes there, ignored elsewhere).  scatter: the reverse,
  // from `in` on root.
  void alltoall(const void* in, const size_t* send_bytes, void* out, const size_t* recv_bytes,
                double timeout = -1);
  void gather(const void* in, void* out, size_t bytes, int root, double timeout = -1);
  void scatter(const void* in, void* out, size_t bytes, int root, double timeout = -1);
  // Device memory (the GPU path, when configure found CUDA and NCCL; without it each call throws
  // Error saying so).  Buffers: CUDA memory on the current device, the same device on every call
  // of the group; `stream`: a cudaStream_t (nullptr: the legacy default stream); `count` and the
  // buffer layouts as the host calls above.  The calls are stream-ordered like NCCL: work after
  // them on `stream` sees the result; allreduce_device_sync, or device_synchronize(stream), also
  // waits for it, at most `timeout`.  The first call, on every rank, creates the group's NCCL
  // communicator; it is cached, and aborted on an error or timeout, after which the calls throw.
  // Destroying the group aborts it too (a finalize could wait for a dead peer): synchronize the
  // streams first, or work still enqueued is cut off without an error.
  // No GPU visible: an Error on this rank before anything is exchanged.
  // On one node: plain NCCL over all ranks.  Across nodes: NCCL among the node's ranks, each of
  // which owns a shard that goes across nodes over the group's host ring (tcp or mpi) through
  // pinned host buffers, in chunks (PYTORCH_DC_PIPELINE_BYTES, default 4 MiB) whose copies
  // overlap the wire; these calls return once the cross-node step is done (the copies back and
  // the gathers inside the node are enqueued).  Across nodes whose ranks are as many on every
  // node and numbered node by node, reduce_scatter_device, allgather_device and broadcast_device
  // go level by level as the host calls (NCCL's reduce-scatter, allgather and broadcast inside
  // the node, the ring or tree across); other layouts run them as allreduces of a scratch buffer
  // (about twice the traffic).  Avg across nodes takes f32 or f64.  A stream being captured into
  // a CUDA graph is an Error (the calls cannot be captured).  Where every node has the same locality domains
  // (domain()) of the same size, at least two of at least two ranks, local ranks numbered domain
  // by domain: NCCL inside each domain, then across the domains of the node (rail p: the p-th
  // rank of each), then the ring across nodes; other layouts: NCCL spans the node.
  static bool has_gpu_path();
  void allreduce_device(void* buf, size_t count, DType t, Op op, void* stream, double timeout = -1);
  void allreduce_device_sync(void* buf, size_t count, DType t, Op op, void* stream,
                             double timeout = -1);
  void reduce_scatter_device(const void* in, void* out, size_t count, DType t, Op op, void* stream,
                             double timeout = -1);
  void allgather_device(const void* in, void* out, size_t count, DType t, void* stream,
                        double timeout = -1);
  void broadcast_device(void* buf, size_t count, DType t, int root, void* stream,
                        double timeout = -1);
  // Waits until `stream`'s work is done, at most `timeout`; an NCCL error or the timeout aborts
  // the group's communicator and throws.
  void device_synchronize(void* stream, double timeout = -1);
  // The same for a cudaEvent_t recorded after this group's device calls (the work up to it on
  // its stream, not what came later on that stream).
  void device_wait_event(void* event, double timeout = -1);
  // Whether that work is done, without waiting (for a thread that watches several); an NCCL
  // error aborts the communicator and throws, as device_wait_event.
  bool device_event_done(void* event);
  // Collective over this group: ranks with the same color form a new group, ordered by (key,
  // rank).  A negative color returns nullptr.
  std::shared_ptr<ProcessGroup> split(int color, int key = 0, double timeout = -1);
  // Collective over this group: the ranks' Mailboxes (below), connected to each other; it
  // returns once every rank's are connected.  They outlive the group if kept.
  std::unique_ptr<Mailbox> mailbox(double timeout = -1);

  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// Tagged point-to-point messages between the ranks of a group, any number of them in flight at
// once (mailbox.cpp), as torch.distributed's isend/irecv and MPI's.  isend/irecv post and return
// at once; progress() moves what can move without waiting, test() says whether a request is
// complete, wait() does both until it is.  A receive takes the earliest message from `peer` (kAnySource: from any
// rank) with its tag that no earlier posted receive took; messages from one sender with one tag
// arrive in the order they were sent.  A message that arrives before its receive is posted is
// kept in memory until one is.  A message of another size than its receive fails that receive
// (and only it).  The messages travel over tcp connections of their own, never mixed with the
// group's collectives or send()/recv(), so a Mailbox may be used by another thread than the one
// that runs the group's collectives.
//
// Errors: a lost peer (it exited, died, or destroyed its group) fails what involves it: its
// requests not yet complete, a receive from any rank whose message from it was coming in, and
// every later isend to it and irecv from it throw Error naming it, except a receive of a message
// that had come whole before (a peer that sent and then exited: what it sent is still
// received); messages between the other ranks go on, as with gloo.  A request that was in flight
// when its deadline passed leaves its stream in an unknown place: that makes the mailbox
// unusable, every request not yet complete and every later isend, irecv and test throwing
// Error naming the cause.  A receive still waiting for its message when its deadline passes only
// fails itself (TimeoutError).  Thread safety: one thread at a time.
class Mailbox {
 public:
  static constexpr int kAnySource = -1;
  struct Impl;
  explicit Mailbox(std::unique_ptr<Impl> impl);
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Request ids are never 0.  `timeout` < 0: the group's default, counted from the post.
  uint64_t isend(const void* buf, size_t bytes, int peer, int tag, double timeout = -1);
  uint64_t irecv(void* buf, size_t bytes, int peer, int tag, double timeout = -1);
  // One pass of nonblocking progress over every request (and the messages that arrive for
  // receives not posted yet); true if anything moved.
  bool progress();
  // Whether request `id` is complete, without I/O (then it is forgotten: ask no more); the rank
  // it came from in *source (receives).  Throws the request's error.
  bool test(uint64_t id, int* source = nullptr);
  // progress() until `id` is complete (its deadline bounds it).
  void wait(uint64_t id, int* source = nullptr);
  // Sleeps until a posted request may move, `ms` milliseconds at most; returns early when
  // `wake_fd` (e.g. an eventfd; -1: none) becomes readable.
  void idle(int ms, int wake_fd = -1);

 private:
  std::unique_ptr<Impl> impl_;
};

// How the calling thread waits for other ranks.  By default a wait spins for a few microseconds
// before it yields and sleeps (small messages come back without a wake-up), except where a
// machine runs more ranks than it has processors.  A thread that runs collectives beside the
// program's own work, such as a framework's communication thread while the main thread computes
// (the torch backend's), calls this with false: its waits yield and sleep at once, leaving the
// processors to the computation.  Per thread; true restores the default.
void set_thread_spinning(bool spin);

}  // namespace pytorch_exec::dc
