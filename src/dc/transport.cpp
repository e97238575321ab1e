#include "dc/transport.hpp"

#include <algorithm>

namespace pytorch_exec::dc {

Deadline Deadline::after(double seconds, std::string what) {
  auto d = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  return Deadline{Clock::now() + d, std::move(what)};
}

int Deadline::millis_left(int cap) const {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap));
}

void Deadline::expire(const std::string& waiting_for) const {
  throw TimeoutError(what + ": timed out waiting for " + waiting_for);
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
