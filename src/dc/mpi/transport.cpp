#include "dc/mpi/transport.hpp"

// The C API only: the deprecated C++ bindings warn under -Wextra and need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <unordered_map>

namespace pytorch_exec::dc::mpi {
namespace {

constexpr int kDataTag = 1;
constexpr int kAbortTag = 2;
constexpr size_t kPiece = size_t{1} << 30;  // bytes per MPI message, below INT_MAX
constexpr int kNoticeBytes = 256;           // longest abort notice, with its terminating zero
constexpr unsigned kSpin = 200;      // tests before wait() starts yielding the CPU (busy_polling())
constexpr unsigned kPollEvery = 16;  // tests between looks at the clock and at notices

std::string number(int n) { return std::to_string(n); }

std::string failure(int rc, const std::string& what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return what + " failed: error " + number(rc);
  return what + " failed: " + std::string(text, len);
}

void check(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) throw Error("mpi transport: " + failure(rc, what));
}

bool finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

void finalize_at_exit() {
  if (!finalized()) MPI_Finalize();
}

// "world_rank world_size" of this process (initializing MPI), or "!" and why it cannot use MPI.
std::string identity() {
  int started = 0, r = 0, n = 0, provided = 0;
  MPI_Initialized(&started);
  if (started && finalized()) return "!MPI was finalized and cannot start again";
  if (!started) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return "!" + failure(rc, "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &r);  // errors on MPI_COMM_WORLD abort the job (its default)
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return number(r) + " " + number(n);
}

// The MPI_COMM_WORLD rank of each group rank; the same answer, or the same Error, on every rank.
std::vector<int> world_ranks(const std::vector<std::string>& ids, int size) {
  if (static_cast<int>(ids.size()) != size) throw Error("mpi transport: allgather miscounted");
  std::vector<int> world(size, -1);
  for (int i = 0; i < size; ++i) {
    if (!ids[i].empty() && ids[i][0] == '!')
      throw Error("mpi transport: rank " + number(i) + " cannot use MPI: " + ids[i].substr(1));
    int r = -1, n = -1;
    std::istringstream(ids[i]) >> r >> n;
    if (n != size)
      throw Error("mpi transport: rank " + number(i) + " is in an MPI job of " + number(n) +
                  " processes, but the group has " + number(size) + "; start the ranks as one " +
                  "MPI job (pytorch_exec, mpirun, srun --mpi=pmix) or use the tcp transport");
    if (r < 0 || r >= size || std::count(world.begin(), world.end(), r))
      throw Error("mpi transport: two ranks claim MPI_COMM_WORLD rank " + number(r));
    world[i] = r;
  }
  return world;
}

class MpiTransport final : public Transport {
 public:
  MpiTransport(int rank, std::vector<int> world);
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  const char* name() const override { return "mpi"; }
  unsigned capabilities() const override { return kPointToPoint; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_.size()); }

  Request isend(int peer, const void* buf, size_t bytes) override {
    return post(peer, bytes, true, [&](size_t at, int n, MPI_Request* r) {
      auto* from = static_cast<const char*>(buf) + at;
      return MPI_Isend(from, n, MPI_BYTE, world_[peer], kDataTag, comm_, r);
    });
  }
  Request irecv(int peer, void* buf, size_t bytes) override {
    return post(peer, bytes, false, [&](size_t at, int n, MPI_Request* r) {
      auto* into = static_cast<char*>(buf) + at;
      return MPI_Irecv(into, n, MPI_BYTE, world_[peer], kDataTag, comm_, r);
    });
  }
  void wait(Request r, const Deadline& d) override;
  bool progress() override;
  bool done(Request r) override;
  void idle(int ms, int wake_fd) override;
  void abort(const std::string& why) override;

 private:
  struct Pending {
    int peer;
    bool send;
    size_t bytes;
    std::vector<MPI_Request> pieces;
    size_t done = 0;  // pieces completed, in order
  };
  using Table = std::unordered_map<uint64_t, Pending>;

  template <class Start>
  Request post(int peer, size_t bytes, bool send, Start start);
  Table::iterator find(Request r);
  bool progress(Pending& p);
  void usable() const;
  void poll_notice();
  void forget_pending();
  void drain_notices();
  std::string op(const Pending& p) const {
    return (p.send ? "a send to rank " : "a receive from rank ") + number(p.peer);
  }

  int rank_;
  std::vector<int> world_;  // MPI_COMM_WORLD (and comm_) rank of each group rank
  MPI_Comm comm_ = MPI_COMM_NULL;
  Table pending_;
  uint64_t next_id_ = 1;
  std::string failed_;  // why every call throws; empty while usable
  bool peers_told_ = false;
  char notice_in_[kNoticeBytes] = {};
  MPI_Request notice_recv_ = MPI_REQUEST_NULL;
  std::string notice_out_;
  std::vector<MPI_Request> notice_sends_;
};

MpiTransport::MpiTransport(int rank, std::vector<int> world)
    : rank_(rank), world_(std::move(world)) {
  check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
  int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS)
    rc = MPI_Irecv(notice_in_, kNoticeBytes - 1, MPI_CHAR, MPI_ANY_SOURCE, kAbortTag, comm_,
                   &notice_recv_);
  if (rc != MPI_SUCCESS) MPI_Comm_free(&comm_);
  check(rc, "setting up the communicator");
}

MpiTransport::~MpiTransport() {
  if (finalized()) return;
  forget_pending();
  drain_notices();
  if (notice_recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&notice_recv_);
    MPI_Wait(&notice_recv_, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&comm_);
}

template <class Start>
Request MpiTransport::post(int peer, size_t bytes, bool send, Start start) {
  usable();
  if (peer < 0 || peer >= size()) throw Error("mpi transport: no rank " + std::to_string(peer));
  if (bytes == 0) return Request{};
  uint64_t id = next_id_++;
  // In the table before the first piece is posted, so that abort() finds every posted piece.
  Pending& p = pending_.emplace(id, Pending{peer, send, bytes, {}}).first->second;
  p.pieces.reserve((bytes + kPiece - 1) / kPiece);
  for (size_t at = 0; at < bytes; at += kPiece) {
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = start(at, static_cast<int>(std::min(kPiece, bytes - at)), &r);
    check(rc, (send ? "MPI_Isend to rank " : "MPI_Irecv from rank ") + number(peer));
    p.pieces.push_back(r);
  }
  return Request{id};
}

MpiTransport::Table::iterator MpiTransport::find(Request r) {
  if (r.id >= next_id_) throw Error("mpi transport: unknown request " + std::to_string(r.id));
  return pending_.find(r.id);  // end(): completed already (or r.id == 0)
}

bool MpiTransport::progress(Pending& p) {
  for (; p.done < p.pieces.size(); ++p.done) {
    int flag = 0, got = 0;
    MPI_Status st;
    check(MPI_Test(&p.pieces[p.done], &flag, &st), "MPI_Test of " + op(p));
    if (!flag) return false;
    size_t want = std::min(kPiece, p.bytes - p.done * kPiece);
    if (!p.send && (MPI_Get_count(&st, MPI_BYTE, &got) != MPI_SUCCESS || size_t(got) != want))
      throw Error("mpi transport: " + op(p) + " got " + number(got) + " bytes where " +
                  std::to_string(want) + " were expected (the ranks' operations do not match)");
  }
  return true;
}

void MpiTransport::usable() const {
  if (!failed_.empty()) throw Error("mpi transport: " + failed_);
  if (finalized()) throw Error("mpi transport: used after MPI_Finalize");
}

void MpiTransport::wait(Request r, const Deadline& d) {
  usable();
  auto it = find(r);
  if (it == pending_.end()) return;
  for (unsigned i = 1;; ++i) {
    if (progress(it->second)) break;
    if (i % kPollEvery == 0) {
      poll_notice();
      if (d.passed()) d.expire("rank " + number(it->second.peer));
    }
    if (i > kSpin || !busy_polling()) sched_yield();
  }
  pending_.erase(it);
}

bool MpiTransport::progress() {
  usable();
  poll_notice();
  bool moved = false;
  for (auto& [id, p] : pending_) {
    size_t before = p.done;
    progress(p);
    moved |= p.done != before;
  }
  return moved;
}

bool MpiTransport::done(Request r) {
  auto it = find(r);
  if (it == pending_.end()) return true;
  if (it->second.done < it->second.pieces.size()) return false;
  pending_.erase(it);
  return true;
}

// MPI has no descriptor to sleep on: a short nap, cut short by wake_fd.
void MpiTransport::idle(int ms, int wake_fd) {
  struct pollfd w = {wake_fd, POLLIN, 0};
  ::poll(&w, wake_fd >= 0 ? 1 : 0, std::min(ms, 1));
}

void MpiTransport::poll_notice() {
  int flag = 0;
  MPI_Status st;
  if (notice_recv_ == MPI_REQUEST_NULL) return;
  check(MPI_Test(&notice_recv_, &flag, &st), "MPI_Test of the abort notice");
  if (!flag) return;
  auto from = std::find(world_.begin(), world_.end(), st.MPI_SOURCE) - world_.begin();
  failed_ = "rank " + number(static_cast<int>(from)) + " aborted: " + notice_in_;
  peers_told_ = true;  // the aborting rank told everyone
  throw Error("mpi transport: " + failed_);
}

void MpiTransport::abort(const std::string& why) {
  if (failed_.empty()) failed_ = "aborted: " + why;
  if (finalized()) return;
  forget_pending();
  if (peers_told_) return;
  peers_told_ = true;
  notice_out_ = why.substr(0, kNoticeBytes - 1);
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    notice_sends_.push_back(MPI_REQUEST_NULL);
    MPI_Isend(notice_out_.data(), static_cast<int>(notice_out_.size()), MPI_CHAR, world_[p],
              kAbortTag, comm_, &notice_sends_.back());
  }
}

// Receives are cancelled; sends cannot be (Open MPI ignores MPI_Cancel of a send) and are left
// to complete in the background.
void MpiTransport::forget_pending() {
  for (auto& [id, p] : pending_) {
    for (size_t i = p.done; i < p.pieces.size(); ++i) {
      if (p.pieces[i] == MPI_REQUEST_NULL) continue;
      if (!p.send) MPI_Cancel(&p.pieces[i]);
      MPI_Request_free(&p.pieces[i]);
    }
  }
  pending_.clear();
}

// Gives the abort notices a moment to leave before notice_out_ goes away.
void MpiTransport::drain_notices() {
  auto until = Clock::now() + std::chrono::milliseconds(200);
  for (MPI_Request& r : notice_sends_) {
    int flag = 0;
    while (r != MPI_REQUEST_NULL && Clock::now() < until &&
           MPI_Test(&r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag)
      sched_yield();
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  notice_sends_.clear();
}

}  // namespace

// The allgather (bounded by its own timeout) proves every rank present and gives all of
// them the same answer, so they all reach MPI_Comm_dup, which no deadline can bound, or none does.
std::unique_ptr<Transport> create(int rank, int size, const Allgather& allgather) {
  std::vector<int> world = world_ranks(allgather(identity()), size);
  return std::make_unique<MpiTransport>(rank, std::move(world));
}

}  // namespace pytorch_exec::dc::mpi
