#include "dc/comm.hpp"

#include <memory>

namespace pytorch_exec::dc {

char* scratch_buffer(size_t bytes) {
  thread_local std::unique_ptr<char[]> buf;
  thread_local size_t size = 0;
  if (bytes > size) {
    buf.reset(new char[bytes]);
    size = bytes;
  }
  return buf.get();
}

CallHeader make_header(Kind k, uint64_t count, DType t, Op op, uint64_t seq, int root) {
  CallHeader h;
  h.kind = static_cast<uint8_t>(k);
  h.dtype = static_cast<uint8_t>(t);
  h.op = static_cast<uint8_t>(op);
  h.root = static_cast<uint8_t>(root);
  h.count = count;
  h.seq = seq;
  return h;
}

std::string describe(const CallHeader& h) {
  static const char* kinds[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier",
                                "send",      "split",          "alltoall",  "gather",    "scatter"};
  if (h.magic != CallHeader{}.magic || h.kind > static_cast<uint8_t>(Kind::Scatter) ||
      h.dtype > static_cast<uint8_t>(DType::U8) || h.op > static_cast<uint8_t>(Op::Avg))
    return "something that is not a collective call (unmatched send/recv?)";
  std::string s =
      std::string(kinds[h.kind]) + " #" + std::to_string(h.seq) + " of " + std::to_string(h.count);
  auto k = static_cast<Kind>(h.kind);
  if (k == Kind::Barrier) return std::string("barrier #") + std::to_string(h.seq);
  if (k == Kind::Send) return "send of " + std::to_string(h.count) + " bytes";
  if (k == Kind::Split) return s;
  if (k == Kind::Alltoall) return s + " bytes";
  if (k == Kind::Gather || k == Kind::Scatter)
    return s + " bytes " + (k == Kind::Gather ? "to" : "from") + " root " + std::to_string(h.root);
  s += std::string(" ") + dtype_name(static_cast<DType>(h.dtype));
  if (k == Kind::Allreduce || k == Kind::ReduceScatter)
    s += std::string(" (") + op_name(static_cast<Op>(h.op)) + ")";
  if (k == Kind::Broadcast) s += " from root " + std::to_string(h.root);
  if (h.part) s += ", a step of " + std::to_string(h.part) + " across nodes";
  return s;
}

void check_header(const CallHeader& mine, const CallHeader& theirs, int from_rank) {
  if (mine.magic == theirs.magic && mine.kind == theirs.kind && mine.dtype == theirs.dtype &&
      mine.op == theirs.op && mine.root == theirs.root && mine.count == theirs.count &&
      mine.seq == theirs.seq && mine.part == theirs.part)
    return;
  // Only a receiver checks a send's header: this rank's call is a recv.
  bool recv = mine.kind == static_cast<uint8_t>(Kind::Send);
  throw Error("mismatched calls: rank " + std::to_string(from_rank) + " called " +
              describe(theirs) + ", this rank " +
              (recv ? "recv of " + std::to_string(mine.count) + " bytes" : describe(mine)));
}

void recv_header(const Comm& c, int from, const CallHeader& mine, const Deadline& d) {
  CallHeader theirs;
  c.wait(c.irecv(from, &theirs, sizeof theirs), d);
  check_header(mine, theirs, c.rank_of(from));
}

void check_ring_headers(const Comm& c, const CallHeader& mine, const Deadline& d) {
  if (c.size() < 2) return;
  Request sent = c.isend(c.me + 1, &mine, sizeof mine);
  recv_header(c, c.me - 1, mine, d);
  c.wait(sent, d);
}

}  // namespace pytorch_exec::dc
