#include "dc/shm/engine.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "dc/bootstrap.hpp"
#include "dc/reduce.hpp"
#include "dc/ring.hpp"

namespace pytorch_exec::dc::shm {
namespace {

constexpr uint64_t kMagic = 0x73686d2d64637035;  // "shm-dcp5"
// Lanes (engine.hpp): an allreduce takes one per this many bytes.
constexpr size_t kLaneBytes = 1 << 20;
// Two local ranks reduce small pieces both (one hand-over); larger ones are split in shards.
constexpr size_t kPairBytes = 2048;
// An owner writes its shard of a round with a cross-node step straight into the other local
// ranks' buffers (process_vm_writev: one copy instead of two, through its slot and out of it)
// when the shard has at least this many bytes; below, the system call costs more than the copy.
constexpr size_t kDirectBytes = 16 << 10;

// A call inside a node: its header without the part (a step across nodes), 24 bytes.
struct NodeCall {
  uint32_t magic;
  uint8_t kind, dtype, op, root;
  uint64_t count, seq;
  NodeCall& operator=(const CallHeader& h) {
    magic = h.magic, kind = h.kind, dtype = h.dtype, op = h.op, root = h.root;
    count = h.count, seq = h.seq;
    return *this;
  }
  operator CallHeader() const {
    CallHeader h;
    h.magic = magic, h.kind = kind, h.dtype = dtype, h.op = op, h.root = root;
    h.count = count, h.seq = seq;
    return h;
  }
};

// A sequence counter on its own cache line; `in` carries the call of its round on the same
// line, so that an owner learns both from one transfer.  The call is kept per round parity, like
// the slots: a rank may already be one round ahead while the others still check this one.
struct alignas(64) Counter {
  std::atomic<uint64_t> v;
  NodeCall call[2];
};
static_assert(sizeof(Counter) == 64);
struct alignas(64) RankState {
  Counter in, out, read;
  std::atomic<uint32_t> failed;
  int32_t pid;
  uint64_t pid_ns;  // the inode of its PID namespace (0: unknown); `pid` means nothing elsewhere
  uint32_t life_lock;  // it holds its life lock (Segment::hold_life_lock) while it lives
  uint64_t buf[2];     // the caller's buffer of the round (by parity), published with `in`
  uint32_t shift[2];   // where its piece of the round starts in its slot (set_shift), with `in`
  uint32_t direct[2];  // this owner wrote its shard into every other rank's buffer (with `out`)
  // A random number at an address of this rank's own memory: a rank that reads it there through
  // `pid` knows that `pid` names this rank (not another process, as it could in another PID
  // namespace) before it writes into its buffers.
  uint64_t cookie, cookie_at;
};
struct Header {
  uint64_t magic;
  uint64_t local_size;
  uint64_t asked_slot;  // the slot every local rank asked for (PYTORCH_DC_SHM_BYTES or default)
  uint64_t slot_bytes;  // the slot local rank 0 made: smaller where /dev/shm had no room
  uint64_t lanes;       // the node's segments (lane 0's header counts)
};

// Shard j of a piece of `total` elements cut in `n` (even_blocks without the vector).
struct Shards {
  size_t total;
  int n;
  size_t first(int j) const { return even_first(total, n, j); }
  size_t count(int j) const { return first(j + 1) - first(j); }
};

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Forks of this process so far, as its children count them (a pthread_atfork handler, set up
// with the first engine): one load tells a round whether it runs in a child of the process that
// published its pid.
std::atomic<uint64_t> g_forks{0};

uint64_t forks() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork(nullptr, nullptr, [] { g_forks.fetch_add(1, std::memory_order_relaxed); });
  });
  return g_forks.load(std::memory_order_relaxed);
}

// This process's PID namespace, as the inode of /proc/self/ns/pid (0 when it cannot be read).
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// A process that has exited is gone even while its parent has not reaped it yet (a zombie).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char buf[512] = {};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');
  return n > 0 && paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

// A shared memory segment: created with `bytes`, or opened (bytes 0) at the size it has.
class Segment {
 public:
  Segment(const std::string& name, size_t bytes, bool create) : name_(name), bytes_(bytes) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0)
      throw Error("shm: cannot " + std::string(create ? "create" : "open") + " shared memory " +
                  name + ": " + std::strerror(errno));
    if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw Error("shm: cannot size shared memory " + name + " to " + std::to_string(bytes) +
                  " bytes: " + std::strerror(e));
    }
    struct stat st {};
    if (!create && (::fstat(fd, &st) != 0 || st.st_size < 4096)) {
      ::close(fd);
      throw Error("shm: shared memory " + name + " is not a segment of this group");
    }
    if (!create) bytes_ = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      if (create) ::shm_unlink(name.c_str());
      throw Error("shm: cannot map shared memory " + name + ": " + std::strerror(e));
    }
    base_ = static_cast<char*>(p);
    fd_ = fd;
    owner_ = create;
  }
  ~Segment() {
    ::munmap(base_, bytes_);
    ::close(fd_);
    if (owner_ && !unlinked_) ::shm_unlink(name_.c_str());
  }
  // The life lock of local rank r: a write lock on byte r of the segment, held through this
  // rank's own open file description (F_OFD_SETLK), which the kernel drops when the process
  // ends however it ends.  Unlike a pid, it means the same in every PID namespace that shares
  // /dev/shm.  False if the system does not have such locks.
  bool hold_life_lock(int r) {
    struct flock l = life_lock(r);
    return ::fcntl(fd_, F_OFD_SETLK, &l) == 0;
  }
  // Whether the life lock of local rank r is gone: it was taken (both sides could) and nobody
  // holds it now.  (A child that the rank forked shares its open file description, and so its
  // lock, until it exits too.)
  bool life_lock_gone(int r) {
    struct flock l = life_lock(r);
    return ::fcntl(fd_, F_OFD_GETLK, &l) == 0 && l.l_type == F_UNLCK;
  }
  // Reserves the segment's pages in /dev/shm now, so that none is found missing later (SIGBUS):
  // 0, or the error (ENOSPC, ENOMEM: no room).
  int allocate() {
    int e = EINTR;
    for (int tries = 0; e == EINTR && tries < 100; ++tries)
      e = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes_));
    return e;
  }
  // Whether the file system of the segment (/dev/shm) keeps at least half of its size free
  // after `more` bytes more (other programs need it too: data loaders, NCCL).
  bool leaves_room(size_t more) const {
    struct statvfs v {};
    if (::fstatvfs(fd_, &v) != 0) return false;
    if (v.f_blocks == 0) return true;  // a tmpfs of no set size
    double avail = static_cast<double>(v.f_bavail) * static_cast<double>(v.f_frsize);
    double size = static_cast<double>(v.f_blocks) * static_cast<double>(v.f_frsize);
    return avail - static_cast<double>(more) >= size / 2;
  }
  void unlink() {
    ::shm_unlink(name_.c_str());
    unlinked_ = true;
  }
  char* base() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  static struct flock life_lock(int r) {
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    l.l_start = r;
    l.l_len = 1;
    return l;
  }

  std::string name_;
  size_t bytes_;
  char* base_ = nullptr;
  int fd_ = -1;
  bool owner_ = false, unlinked_ = false;
};

class EngineImpl : public AllreduceEngine {
 public:
  EngineImpl(std::unique_ptr<Segment> seg, int me, int n, size_t slot, std::vector<int> ranks)
      : seg_(std::move(seg)), me_(me), n_(n), slot_(slot), ranks_(std::move(ranks)) {
    states_ = reinterpret_cast<RankState*>(seg_->base() + 4096);
    data_ = seg_->base() + data_offset(n);
    states_[me_].pid = ::getpid();
    forks_ = forks();
    states_[me_].pid_ns = pid_namespace();
    states_[me_].life_lock = seg_->hold_life_lock(me_);
    cookie_ = random64() | 1;
    states_[me_].cookie = cookie_;
    states_[me_].cookie_at = reinterpret_cast<uintptr_t>(&cookie_);
    verified_.assign(static_cast<size_t>(n), false);
  }

  static size_t data_offset(int n) {
    return round_up(4096 + sizeof(RankState) * static_cast<size_t>(n), 4096);
  }
  // Each slot has kUnaliasSlack bytes more than its pieces take: a rank's piece of a round starts
  // where unaliased_offset() says for its buffer (comm.hpp: 4K aliasing).
  static size_t bytes(int n, size_t slot) {
    return data_offset(n) + 2 * static_cast<size_t>(n) * (slot + kUnaliasSlack);
  }

  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override {
    h_ = &h;
    size_t es = dtype_size(t), piece = slot_ / es;
    char* b = static_cast<char*>(buf);
    for (size_t off = 0; off < count; off += piece)
      round(b + off * es, std::min(piece, count - off), t, op, owners, cross, avg_divisor, d);
  }

  void reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t, Op op,
                      int avg_divisor, const CallHeader& h, const Deadline& d) override {
    h_ = &h;
    size_t es = dtype_size(t);
    rounds(block, groups, es * static_cast<size_t>(n_), [&](Pieces p) {
      scatter_round(static_cast<const char*>(in), static_cast<char*>(out), block, p, t, op,
                    avg_divisor, d);
    });
  }

  void allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                 const CallHeader& h, const Deadline& d) override {
    h_ = &h;
    size_t es = dtype_size(t);
    rounds(block, groups, es, [&](Pieces p) {
      gather_round(static_cast<const char*>(in), static_cast<char*>(out), block, p, es, d);
    });
  }

  void broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                 const Deadline& d) override {
    h_ = &h;
    char* b = static_cast<char*>(buf);
    for (size_t off = 0; off < bytes; off += slot_)
      broadcast_round(b + off, std::min(slot_, bytes - off), root, d);
  }

  void barrier(const CallHeader& h, const Deadline& d) override {
    uint64_t seq = ++seq_;
    if (seq > 2) wait_all(n_, &RankState::read, seq - 2, d, "to finish an earlier round");
    states_[me_].in.call[seq & 1] = h;
    states_[me_].in.v.store(seq, std::memory_order_release);
    wait_all(n_, &RankState::in, seq, d, "to reach the barrier");
    for (int r = 0; r < n_; ++r)
      if (r != me_) check_header(h, states_[r].in.call[seq & 1], r);
    states_[me_].read.v.store(seq, std::memory_order_release);
  }

  void abort() override { states_[me_].failed.store(1, std::memory_order_release); }
  void check_others() override {
    for (int q = 0; q < n_; ++q)
      if (q != me_ && states_[q].failed.load(std::memory_order_acquire))
        throw Error("shm: " + who(q) + " failed or gave up");
  }
  size_t slot() const override { return slot_; }

 private:
  // The piece of local rank r in round `seq`: in its slot, after its shift (published with its
  // `in` of the round, before anybody looks here).
  char* slot(uint64_t seq, int r) const {
    size_t i = (seq & 1) * static_cast<size_t>(n_) + static_cast<size_t>(r);
    return data_ + i * (slot_ + kUnaliasSlack) + states_[r].shift[seq & 1];
  }
  // Where this rank's piece at `buf` starts in its slot of round `seq`.
  void set_shift(uint64_t seq, const char* buf) {
    size_t i = (seq & 1) * static_cast<size_t>(n_) + static_cast<size_t>(me_);
    states_[me_].shift[seq & 1] =
        static_cast<uint32_t>(unaliased_offset(data_ + i * (slot_ + kUnaliasSlack), buf));
  }

  void round(char* buf, size_t m, DType t, Op op, int owners, const Cross& cross, int avg_divisor,
             const Deadline& d) {
    size_t es = dtype_size(t);
    uint64_t seq = ++seq_;
    // The slots of this parity were last used two rounds ago: everyone must be done reading.
    if (seq > 2) wait_all(n_, &RankState::read, seq - 2, d, "to finish an earlier round");
    if (n_ == 2 && !cross && m * es <= kPairBytes)
      return pair_round(buf, m, t, op, avg_divisor, seq, d);
    Shards blk{m, owners};
    set_shift(seq, buf);
    // The owners need every shard but their own from this rank.
    for (int j = 0; j < owners; ++j)
      if (j != me_) copy(slot(seq, me_), buf, blk, j, es);
    states_[me_].in.call[seq & 1] = *h_;
    states_[me_].buf[seq & 1] = reinterpret_cast<uintptr_t>(buf);
    // The process whose buffer that is: a child forked from the rank may have taken its place
    // (owners write into it with process_vm_writev; its memory holds the same cookie).
    if (forks() != forks_) {
      forks_ = forks();
      states_[me_].pid = ::getpid();
    }
    states_[me_].in.v.store(seq, std::memory_order_release);
    if (me_ < owners) {
      wait_all(n_, &RankState::in, seq, d, "to contribute");
      for (int r = 0; r < n_; ++r)
        if (r != me_) check_header(*h_, states_[r].in.call[seq & 1], r);
      size_t first = blk.first(me_), cnt = blk.count(me_);
      char* mine = buf + first * es;  // reduced in place in the caller's buffer, then published
      // Published a few KiB at a time, while the result is still in the first-level cache; with
      // a cross-node step in between, the whole shard at once.
      size_t step = cross ? std::max<size_t>(cnt, 1) : std::max<size_t>(1, (16 << 10) / es);
      bool direct = false;
      for (size_t o = 0; o < cnt; o += step) {
        size_t k = std::min(step, cnt - o);
        char* part = mine + o * es;
        for (int r = 0; r < n_; ++r)
          if (r != me_) reduce_into(part, slot(seq, r) + (first + o) * es, k, t, op);
        if (cross) cross(part, k);
        if (op == Op::Avg) finish_avg(part, k, t, avg_divisor);
        direct = cross && k * es >= kDirectBytes &&
                 write_others(seq, part, (first + o) * es, k * es);
        if (!direct) std::memcpy(slot(seq, me_) + (first + o) * es, part, k * es);
      }
      states_[me_].direct[seq & 1] = direct;
      states_[me_].out.v.store(seq, std::memory_order_release);
    }
    wait_all(owners, &RankState::out, seq, d, "to reduce its shard");
    for (int j = 0; j < owners; ++j)
      if (j != me_ && !states_[j].direct[seq & 1]) copy(buf, slot(seq, j), blk, j, es);
    states_[me_].read.v.store(seq, std::memory_order_release);
  }

  // The pieces of a reduce-scatter or allgather round: elements [off, off + m) of the blocks of
  // groups [g0, g0 + gs).
  struct Pieces {
    size_t g0, gs, off, m;
  };

  // Calls round(p) for pieces that cover `groups` groups of blocks of `block` elements, each
  // round as large as the slot allows when a piece of one group takes `unit` bytes per element
  // (create() makes the slot hold at least one element of every local rank): whole blocks of
  // several groups at once when they fit, else parts of one group's.
  template <typename F>
  void rounds(size_t block, size_t groups, size_t unit, F&& round) {
    size_t room = slot_ / unit;  // elements of one group that fit, >= 1
    size_t gs = block > 0 && block <= room ? std::min(groups, room / block) : 1;
    size_t m = std::min(room, block);
    for (size_t g0 = 0; g0 < groups; g0 += gs)
      for (size_t off = 0; off < block; off += m)
        round(Pieces{g0, std::min(gs, groups - g0), off, std::min(m, block - off)});
  }

  // One round of reduce-scatter.  Every rank copies its pieces of the others' blocks into its
  // slot (group g's piece of rank r at ((g - g0) * n + r) * m) and reduces the pieces of its own
  // blocks, its own from `in` and the others' from their slots, straight into `out` a few KiB at
  // a time; nothing is copied back.
  void scatter_round(const char* in, char* out, size_t block, Pieces p, DType t, Op op,
                     int avg_divisor, const Deadline& d) {
    size_t es = dtype_size(t), n = static_cast<size_t>(n_), me = static_cast<size_t>(me_);
    uint64_t seq = ++seq_;
    if (seq > 2) wait_all(n_, &RankState::read, seq - 2, d, "to finish an earlier round");
    auto in_at = [&](size_t g, size_t r) { return in + (((p.g0 + g) * n + r) * block + p.off) * es; };
    auto slot_at = [&](int r, size_t g, size_t k) {
      return slot(seq, r) + ((g * n + k) * p.m) * es;
    };
    set_shift(seq, out + (p.g0 * block + p.off) * es);
    for (size_t g = 0; g < p.gs; ++g)
      for (size_t r = 0; r < n; ++r)
        if (r != me) std::memcpy(slot_at(me_, g, r), in_at(g, r), p.m * es);
    states_[me_].in.call[seq & 1] = *h_;
    states_[me_].in.v.store(seq, std::memory_order_release);
    wait_all(n_, &RankState::in, seq, d, "to contribute");
    for (int r = 0; r < n_; ++r)
      if (r != me_) check_header(*h_, states_[r].in.call[seq & 1], r);
    size_t step = std::max<size_t>(1, (16 << 10) / es);
    for (size_t g = 0; g < p.gs; ++g) {
      char* dst = out + ((p.g0 + g) * block + p.off) * es;
      const char* own = in_at(g, me);
      for (size_t o = 0; o < p.m; o += step) {
        size_t k = std::min(step, p.m - o);
        if (dst != own) std::memcpy(dst + o * es, own + o * es, k * es);
        for (int r = 0; r < n_; ++r)
          if (r != me_) reduce_into(dst + o * es, slot_at(r, g, me) + o * es, k, t, op);
        if (op == Op::Avg) finish_avg(dst + o * es, k, t, avg_divisor);
      }
    }
    states_[me_].read.v.store(seq, std::memory_order_release);
  }

  // One round of allgather: every rank copies its pieces (group g's at (g - g0) * m) into its
  // slot, then everyone's into their places in `out`.
  void gather_round(const char* in, char* out, size_t block, Pieces p, size_t es,
                    const Deadline& d) {
    size_t n = static_cast<size_t>(n_);
    uint64_t seq = ++seq_;
    if (seq > 2) wait_all(n_, &RankState::read, seq - 2, d, "to finish an earlier round");
    auto out_at = [&](size_t g, size_t r) {
      return out + (((p.g0 + g) * n + r) * block + p.off) * es;
    };
    // This rank's piece of group g: from `in`, or in its place in `out`.
    auto own = [&](size_t g) {
      return in ? in + ((p.g0 + g) * block + p.off) * es : out_at(g, static_cast<size_t>(me_));
    };
    set_shift(seq, own(0));
    for (size_t g = 0; g < p.gs; ++g) std::memcpy(slot(seq, me_) + g * p.m * es, own(g), p.m * es);
    states_[me_].in.call[seq & 1] = *h_;
    states_[me_].in.v.store(seq, std::memory_order_release);
    wait_all(n_, &RankState::in, seq, d, "to contribute");
    for (int r = 0; r < n_; ++r)
      if (r != me_) check_header(*h_, states_[r].in.call[seq & 1], r);
    for (size_t g = 0; g < p.gs; ++g)
      for (size_t r = 0; r < n; ++r) {
        const char* from = r == static_cast<size_t>(me_)
                               ? own(g)
                               : slot(seq, static_cast<int>(r)) + g * p.m * es;
        if (out_at(g, r) != from) std::memcpy(out_at(g, r), from, p.m * es);
      }
    states_[me_].read.v.store(seq, std::memory_order_release);
  }

  // One round of broadcast: the root's piece of `m` bytes at `buf` through its slot.  Every rank
  // publishes its call; the others check the root's, and the root, once it has published its
  // piece, everyone's (so that ranks that disagree about the root, or a root whose peers are in
  // another call, raise instead of returning).
  void broadcast_round(char* buf, size_t m, int root, const Deadline& d) {
    uint64_t seq = ++seq_;
    if (seq > 2) wait_all(n_, &RankState::read, seq - 2, d, "to finish an earlier round");
    if (me_ == root) {
      set_shift(seq, buf);
      std::memcpy(slot(seq, me_), buf, m);
    }
    states_[me_].in.call[seq & 1] = *h_;
    states_[me_].in.v.store(seq, std::memory_order_release);
    if (me_ == root) {
      wait_all(n_, &RankState::in, seq, d, "to contribute");
      for (int r = 0; r < n_; ++r)
        if (r != me_) check_header(*h_, states_[r].in.call[seq & 1], r);
    } else {
      wait_one(root, &RankState::in, seq, d, "to contribute");
      check_header(*h_, states_[root].in.call[seq & 1], root);
      std::memcpy(buf, slot(seq, root), m);
    }
    states_[me_].read.v.store(seq, std::memory_order_release);
  }

  // Two local ranks and a small piece: each reduces the whole piece itself from its own buffer
  // and the other's slot, so that a round has one hand-over instead of two and no copy back
  // (for large pieces the halved work of shards wins).  x + y and y + x
  // are the same bits, so both ranks still get identical results.
  void pair_round(char* buf, size_t m, DType t, Op op, int avg_divisor, uint64_t seq,
                  const Deadline& d) {
    size_t es = dtype_size(t);
    int peer = 1 - me_;
    set_shift(seq, buf);
    std::memcpy(slot(seq, me_), buf, m * es);
    states_[me_].in.call[seq & 1] = *h_;
    states_[me_].in.v.store(seq, std::memory_order_release);
    wait_all(n_, &RankState::in, seq, d, "to contribute");
    check_header(*h_, states_[peer].in.call[seq & 1], peer);
    reduce_into(buf, slot(seq, peer), m, t, op);
    if (op == Op::Avg) finish_avg(buf, m, t, avg_divisor);
    states_[me_].read.v.store(seq, std::memory_order_release);
  }

  // The owner's reduced shard (`bytes` at `from`, at byte `offset` of the piece) written into the
  // buffer of every other local rank of the round (its address came with its `in`; it waits for
  // this owner's `out` before it looks at it), one copy from process to process.  False when
  // the system does not allow it (no CMA, another user, a seccomp policy, a pid that is not the
  // rank's: never tried again) or a write was short; the caller then publishes the shard through
  // its slot, which every rank copies over what may have been written.
  bool write_others(uint64_t seq, const char* from, size_t offset, size_t bytes) {
    if (!direct_ok_) return false;
    for (int r = 0; r < n_; ++r) {
      if (r == me_) continue;
      if (!verified_[static_cast<size_t>(r)] && !(direct_ok_ = is_rank(r))) return false;
      verified_[static_cast<size_t>(r)] = true;
      struct iovec local {
        const_cast<char*>(from), bytes
      };
      struct iovec remote {
        reinterpret_cast<void*>(static_cast<uintptr_t>(states_[r].buf[seq & 1]) + offset), bytes
      };
      ssize_t n = ::process_vm_writev(states_[r].pid, &local, 1, &remote, 1, 0);
      if (n == static_cast<ssize_t>(bytes)) continue;
      if (n < 0 && (errno == EPERM || errno == ENOSYS || errno == EACCES || errno == ESRCH))
        direct_ok_ = false;
      return false;
    }
    return true;
  }

  // Whether local rank r's pid reaches its memory: its cookie, read from where it says it is.
  bool is_rank(int r) const {
    uint64_t seen = 0;
    struct iovec local {
      &seen, sizeof seen
    };
    struct iovec remote {
      reinterpret_cast<void*>(static_cast<uintptr_t>(states_[r].cookie_at)), sizeof seen
    };
    return ::process_vm_readv(states_[r].pid, &local, 1, &remote, 1, 0) ==
               static_cast<ssize_t>(sizeof seen) &&
           seen == states_[r].cookie;
  }

  // Copies shard j of a piece from one buffer to the other.
  static void copy(char* to, const char* from, const Shards& blk, int j, size_t es) {
    size_t first = blk.first(j) * es;
    std::memcpy(to + first, from + first, blk.count(j) * es);
  }

  // Waits until counter `which` of local ranks 0 .. upto-1 reaches `seq`: spins for a few
  // microseconds (not on an oversubscribed node), then yields the processor, then sleeps in short
  // steps; every millisecond it looks whether the rank it waits for is still there and whether
  // the deadline passed.
  void wait_all(int upto, Counter RankState::*which, uint64_t seq, const Deadline& d,
                const char* what) {
    for (int r = 0; r < upto; ++r)
      if (r != me_) wait_one(r, which, seq, d, what);
  }
  // The same for local rank r alone.
  void wait_one(int r, Counter RankState::*which, uint64_t seq, const Deadline& d,
                const char* what) {
    unsigned spins = busy_polling() ? 4000 : 0;
    auto& c = (states_[r].*which).v;
    auto start = Clock::now(), next_check = start + std::chrono::milliseconds(1);
    for (unsigned i = 0; c.load(std::memory_order_acquire) < seq; ++i) {
      if (i < spins) {
        pause();
        continue;
      }
      auto now = Clock::now();
      if (now >= next_check) {
        check_peer(r, d, what);
        next_check = now + std::chrono::milliseconds(1);
      }
      if (now - start < std::chrono::milliseconds(2))
        ::sched_yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  // Local rank r as errors name it: by its rank in the group where that differs.
  std::string who(int r) const {
    std::string local = "local rank " + std::to_string(r);
    if (r >= static_cast<int>(ranks_.size()) || ranks_[static_cast<size_t>(r)] == r) return local;
    return "rank " + std::to_string(ranks_[static_cast<size_t>(r)]) + " (" + local + ")";
  }

  void check_peer(int r, const Deadline& d, const char* what) {
    // Another lane of this rank failed (or the group gave up): this one stops waiting too.
    if (states_[me_].failed.load(std::memory_order_acquire))
      throw Error("shm: this rank gave up while waiting for " + who(r));
    // Any local rank that failed: the one waited for may itself wait for another node, whose
    // ranks wait for this one (2 nodes whose calls differ: only some ranks can tell).
    check_others();
    RankState& s = states_[r];
    // Its life lock is gone once it ended, in whatever PID namespace it runs (a container of
    // its own that shares /dev/shm); its pid, which names nothing or another process from another
    // namespace, is looked at in this one's only (and catches a rank whose forked child still
    // holds its lock).
    uint64_t ns = states_[me_].pid_ns;
    bool same_ns = ns != 0 && s.pid_ns == ns;
    if ((s.life_lock && states_[me_].life_lock && seg_->life_lock_gone(r)) ||
        (s.pid > 0 && same_ns && s.pid != ::getpid() && process_gone(s.pid)))
      throw Error("shm: " + who(r) + " (pid " + std::to_string(s.pid) +
                  (same_ns ? "" : " in another PID namespace") + ") died");
    if (d.passed()) d.expire(who(r) + " " + what);
  }

  std::unique_ptr<Segment> seg_;
  int me_, n_;
  size_t slot_;
  RankState* states_;
  char* data_;
  uint64_t seq_ = 0;
  std::vector<int> ranks_;  // the group rank of each local rank (empty: not known)
  const CallHeader* h_ = nullptr;
  uint64_t forks_ = 0;          // forks() when this process published its pid
  bool direct_ok_ = true;       // process_vm_writev into the other local ranks works
  std::vector<bool> verified_;  // by local rank: is_rank() said yes
  uint64_t cookie_ = 0;
};

// The lanes of a node (engine.hpp): lane 0 runs on the calling thread, lane l > 0 on helper
// thread l, which sleeps between the calls that use it.  The first error of a call aborts every
// lane of this rank, so that its other lanes stop waiting and so do the other ranks' (they see
// this rank fail); the call then raises that error once every lane has returned.  Lanes without
// a helper (the system would not start one; a child forked from this process, which has none)
// run on the calling thread after lane 0, one after another: each lane is a round protocol of
// its own, so the other ranks' lanes just wait for them a little longer.
class LanedEngine : public AllreduceEngine {
 public:
  explicit LanedEngine(std::vector<std::unique_ptr<EngineImpl>> lanes)
      : lanes_(std::move(lanes)), pool_(std::make_unique<Pool>()), pid_(::getpid()) {
    for (size_t l = 1; l < lanes_.size(); ++l) {
      try {
        std::string name = "dc-shm-lane" + std::to_string(l);
        pool_->helpers.emplace_back([this, l] { serve(l); });
        ::pthread_setname_np(pool_->helpers.back().native_handle(), name.c_str());
      } catch (const std::exception&) {  // no more threads: the rest run on the caller
        break;
      }
    }
  }
  ~LanedEngine() override {
    // A forked child: the helpers, and the waiters that the mutex and condition variables count,
    // are the parent's; neither joining, detaching nor destroying them is safe here.
    if (::getpid() != pid_) {
      (void)pool_.release();
      return;
    }
    {
      std::lock_guard<std::mutex> g(pool_->m);
      pool_->stop = true;
    }
    pool_->start.notify_all();
    for (auto& t : pool_->helpers) t.join();
  }

  void allreduce(void* buf, size_t count, DType t, Op op, int owners, const Cross& cross,
                 int avg_divisor, const CallHeader& h, const Deadline& d) override {
    size_t es = dtype_size(t), n = cross ? 1 : std::min(lanes_.size(), count * es / kLaneBytes);
    if (n <= 1)
      return lanes_[0]->allreduce(buf, count, t, op, owners, cross, avg_divisor, h, d);
    // Slices of whole pages (n * kLaneBytes <= count * es: each has many); the last has the rest.
    size_t unit = 4096 / es, per = count / n / unit * unit;
    char* b = static_cast<char*>(buf);
    run(n, [&](size_t l) {
      size_t first = l * per, cnt = l + 1 == n ? count - first : per;
      lanes_[l]->allreduce(b + first * es, cnt, t, op, owners, cross, avg_divisor, h, d);
    });
  }
  void reduce_scatter(const void* in, void* out, size_t block, size_t groups, DType t, Op op,
                      int avg_divisor, const CallHeader& h, const Deadline& d) override {
    lanes_[0]->reduce_scatter(in, out, block, groups, t, op, avg_divisor, h, d);
  }
  void allgather(const void* in, void* out, size_t block, size_t groups, DType t,
                 const CallHeader& h, const Deadline& d) override {
    lanes_[0]->allgather(in, out, block, groups, t, h, d);
  }
  void broadcast(void* buf, size_t bytes, int root, const CallHeader& h,
                 const Deadline& d) override {
    lanes_[0]->broadcast(buf, bytes, root, h, d);
  }
  void barrier(const CallHeader& h, const Deadline& d) override { lanes_[0]->barrier(h, d); }
  void abort() override {
    for (auto& l : lanes_) l->abort();
  }
  void check_others() override { lanes_[0]->check_others(); }  // abort() marks every lane
  int lanes() const override { return static_cast<int>(lanes_.size()); }
  size_t slot() const override { return lanes_[0]->slot(); }
  AllreduceEngine& lane(int l) override { return *lanes_[static_cast<size_t>(l)]; }
  void run_lanes(size_t n, const std::function<void(size_t)>& f) override { run(n, f); }

 private:
  // The helpers and what they share with the caller, on the heap: a forked child leaves it be.
  struct Pool {
    std::vector<std::thread> helpers;  // helpers[i] runs lane i + 1
    std::mutex m;
    std::condition_variable start, done;
    const std::function<void(size_t)>* job = nullptr;
    size_t active = 0, pending = 0;  // lanes of the call; helpers still at work
    uint64_t gen = 0;                // calls that used helpers
    bool stop = false, spin = true;  // spin: the caller's busy_polling()
    std::mutex error_m;
    std::exception_ptr error;  // the call's first error (under error_m)
  };

  // Runs f(0) here and f(1) ... f(n - 1) on the helpers (the lanes that have none here, after
  // f(0)); returns when all have (each lane's waits end by the call's deadline at the latest).
  void run(size_t n, const std::function<void(size_t)>& f) {
    Pool& p = *pool_;
    size_t helped = ::getpid() == pid_ ? std::min(n - 1, p.helpers.size()) : 0;
    if (helped > 0) {
      {
        std::lock_guard<std::mutex> g(p.m);
        p.job = &f;
        p.active = helped + 1;
        p.pending = helped;
        p.spin = busy_polling();  // the caller's (set_thread_spinning), for its helpers too
        ++p.gen;
      }
      p.start.notify_all();
    }
    lane(0, f);
    for (size_t l = helped + 1; l < n; ++l) lane(l, f);
    if (helped > 0) {
      std::unique_lock<std::mutex> g(p.m);
      p.done.wait(g, [&] { return p.pending == 0; });
      p.job = nullptr;
    }
    std::exception_ptr e;
    std::swap(e, p.error);  // no lane runs now
    if (e) std::rethrow_exception(e);
  }
  // Runs lane l; its error becomes the call's unless another lane's came first, and aborts
  // every lane.
  void lane(size_t l, const std::function<void(size_t)>& f) {
    try {
      f(l);
    } catch (...) {
      {
        std::lock_guard<std::mutex> g(pool_->error_m);
        if (!pool_->error) pool_->error = std::current_exception();
      }
      abort();
    }
  }
  void serve(size_t l) {
    Pool& p = *pool_;
    uint64_t seen = 0;
    std::unique_lock<std::mutex> g(p.m);
    for (;;) {
      p.start.wait(g, [&] { return p.stop || p.gen != seen; });
      if (p.stop) return;
      seen = p.gen;
      if (l >= p.active) continue;
      const auto* f = p.job;
      set_thread_spinning(p.spin);
      g.unlock();
      lane(l, *f);
      g.lock();
      if (--p.pending == 0) p.done.notify_one();
    }
  }

  std::vector<std::unique_ptr<EngineImpl>> lanes_;
  std::unique_ptr<Pool> pool_;
  pid_t pid_;  // the process whose threads the helpers are
};

// A lane beyond the first (local rank 0 creates it), or nullptr: lanes are an optimization, and
// each is added only while /dev/shm keeps half of its room after it (`first`, lane 0, is
// reserved already); its pages are reserved now, not found missing later (SIGBUS).
std::unique_ptr<Segment> extra_lane(const std::string& name, size_t bytes, const Segment& first) {
  if (!first.leaves_room(bytes)) return nullptr;
  try {
    auto seg = std::make_unique<Segment>(name, bytes, true);
    if (seg->allocate() == 0) return seg;
  } catch (const Error&) {  // no room or no descriptor: fewer lanes
  }
  return nullptr;
}

// Lane 0 (local rank 0 creates it) with the largest slot, from `slot` down by halves to
// `least`, whose pages /dev/shm has room for, reserved now; `slot` becomes the one it has (said
// on stderr, once a process).  An Error where even `least` has no room.  (A file system that
// cannot reserve pages at all: the segment as asked, its pages taken as they are used.)
std::unique_ptr<Segment> first_lane(const std::string& name, int n, size_t& slot, size_t least) {
  size_t asked = slot;
  for (;;) {
    auto seg = std::make_unique<Segment>(name, EngineImpl::bytes(n, slot), true);
    int e = seg->allocate();
    if (e != ENOSPC && e != ENOMEM) {  // ENOMEM: a memory cgroup's limit
      static std::atomic<bool> said{false};  // once a process: each group of it would say it
      if (slot != asked && !said.exchange(true))
        std::fprintf(stderr,
                     "pytorch_dc: /dev/shm has no room for this node's %zu KiB shared-memory "
                     "slots: %zu KiB instead (slower with large messages; a larger /dev/shm, "
                     "e.g. docker run --shm-size, avoids this)\n",
                     asked >> 10, slot >> 10);
      return seg;
    }
    if (slot <= least)
      throw Error("shm: /dev/shm has no room for this node's shared memory (" +
                  std::to_string(EngineImpl::bytes(n, slot)) + " bytes at least for " +
                  std::to_string(n) + " local ranks: " + std::strerror(e) +
                  "): enlarge it (e.g. docker run --shm-size) or set PYTORCH_DC_INTRA=tcp");
    slot = std::max(least, slot / 2 / 4096 * 4096);
  }
}

}  // namespace

std::unique_ptr<AllreduceEngine> AllreduceEngine::create(const std::function<void()>& local_barrier,
                                                         const std::string& key, int local_rank,
                                                         int local_size, size_t slot_bytes,
                                                         int lanes, std::vector<int> ranks) {
  // A reduce-scatter round puts a piece of every local rank's block in a slot: at least 16
  // bytes each (wider than any element).
  size_t least = round_up(std::max<size_t>(4096, 16 * static_cast<size_t>(local_size)), 4096);
  size_t asked = round_up(std::max(slot_bytes, least), 4096), slot = asked;
  std::string name = "/pytorch_dc." + key;
  std::replace(name.begin() + 1, name.end(), '/', '_');
  auto lane_name = [&](int l) { return l == 0 ? name : name + ".lane" + std::to_string(l); };
  std::vector<std::unique_ptr<Segment>> segs;
  auto header = [](Segment& s) { return reinterpret_cast<Header*>(s.base()); };
  if (local_rank == 0) {
    lanes = std::clamp(lanes, 1, kMaxLanes);
    for (int l = 0; l < kMaxLanes; ++l)
      ::shm_unlink(lane_name(l).c_str());  // leftovers of a crashed job with the same key
    segs.push_back(first_lane(lane_name(0), local_size, slot, least));
    for (int l = 1; l < lanes; ++l) {
      auto seg = extra_lane(lane_name(l), EngineImpl::bytes(local_size, slot), *segs[0]);
      if (!seg) break;
      segs.push_back(std::move(seg));
    }
    lanes = static_cast<int>(segs.size());
    for (auto& s : segs) {
      *header(*s) = Header{kMagic, static_cast<uint64_t>(local_size), asked, slot,
                           static_cast<uint64_t>(lanes)};
      auto* st = reinterpret_cast<RankState*>(s->base() + 4096);
      for (int r = 0; r < local_size; ++r) new (&st[r]) RankState{};
    }
    local_barrier();  // created
    local_barrier();  // attached
    for (auto& s : segs) s->unlink();  // every local rank has them mapped: nothing can leak now
  } else {
    local_barrier();
    for (int l = 0; l == 0 || l < lanes; ++l) {
      segs.push_back(std::make_unique<Segment>(lane_name(l), 0, false));
      Header* h = header(*segs.back());
      if (h->magic != kMagic || h->local_size != static_cast<uint64_t>(local_size) ||
          h->asked_slot != asked || h->slot_bytes < least || h->slot_bytes > asked ||
          segs.back()->size() != EngineImpl::bytes(local_size, h->slot_bytes))
        throw Error("shm: segment " + lane_name(l) +
                    " does not match this group (different PYTORCH_DC_SHM_BYTES on the ranks, or "
                    "different versions of libpytorch_dc?)");
      if (l == 0) {  // local rank 0 decided how many, and the slot
        lanes = static_cast<int>(std::clamp<uint64_t>(h->lanes, 1, kMaxLanes));
        slot = h->slot_bytes;
      } else if (h->slot_bytes != slot) {
        throw Error("shm: segment " + lane_name(l) + " does not match lane 0's slot");
      }
    }
    local_barrier();
  }
  std::vector<std::unique_ptr<EngineImpl>> impls;
  for (auto& s : segs)
    impls.push_back(
        std::make_unique<EngineImpl>(std::move(s), local_rank, local_size, slot, ranks));
  if (impls.size() == 1) return std::move(impls[0]);
  return std::make_unique<LanedEngine>(std::move(impls));
}

}  // namespace pytorch_exec::dc::shm
