#include "dc/transport.hpp"

#include <algorithm>
#include <atomic>

namespace pytorch_exec::dc {

namespace {
std::atomic<bool> g_busy_polling{true};
thread_local bool t_no_spinning = false;  // set_thread_spinning(false) on this thread
}  // namespace

bool busy_polling() { return !t_no_spinning && g_busy_polling.load(std::memory_order_relaxed); }
void set_thread_spinning(bool spin) { t_no_spinning = !spin; }
void no_busy_polling() { g_busy_polling.store(false, std::memory_order_relaxed); }

namespace {
// Seconds from now; a timeout beyond kMaxTimeout (infinity too) is kMaxTimeout, so that the
// time point does not overflow (1e10 s of nanoseconds did, and the call timed out at once).

Clock::time_point in(double seconds) {
  if (!(seconds > 0)) seconds = 0;  // NaN too: callers map it to their default first
  if (seconds > kMaxTimeout) seconds = kMaxTimeout;
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}
}  // namespace

Deadline Deadline::after(double seconds, std::string label) {
  Deadline d;
  d.at = in(seconds);
  d.label = std::move(label);
  return d;
}

Deadline Deadline::call(double seconds, const char* op, uint64_t count, int dtype, int reduction,
                        int peer) {
  Deadline d;
  d.at = in(seconds);
  d.op = op;
  d.count = count;
  d.dtype = dtype;
  d.reduction = reduction;
  d.peer = peer;
  return d;
}

std::string Deadline::describe() const {
  if (!op) return label;
  std::string s = std::string(op) + " of " + std::to_string(count);
  s +=
      dtype >= 0 ? std::string(" ") + dtype_name(static_cast<DType>(dtype)) : std::string(" bytes");
  if (reduction >= 0) s += std::string(" (") + op_name(static_cast<Op>(reduction)) + ")";
  if (peer >= 0)
    s += std::string(dtype >= 0 ? " from root " : " with rank ") + std::to_string(peer);
  return s;
}

int Deadline::millis_left(int cap) const {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap));
}

void Deadline::expire(const std::string& waiting_for) const {
  throw TimeoutError(describe() + ": timed out waiting for " + waiting_for);
}

void send(Transport& t, int peer, const void* buf, size_t bytes, const Deadline& d) {
  t.wait(t.isend(peer, buf, bytes), d);
}

void recv(Transport& t, int peer, void* buf, size_t bytes, const Deadline& d) {
  t.wait(t.irecv(peer, buf, bytes), d);
}

void sendrecv(Transport& t, int to, const void* sbuf, size_t sbytes, int from, void* rbuf,
              size_t rbytes, const Deadline& d) {
  Request r = t.irecv(from, rbuf, rbytes);
  Request s = t.isend(to, sbuf, sbytes);
  t.wait(r, d);
  t.wait(s, d);
}

}  // namespace pytorch_exec::dc
