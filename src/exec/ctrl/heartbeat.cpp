#include "exec/ctrl/heartbeat.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/strings.hpp"

namespace pe::ctrl {

std::string silence(double seconds) { return "no heartbeat for " + seconds_text(seconds) + " s"; }

Heartbeats::Heartbeats(EventLoop& loop, HeartbeatSettings s, SendFn send, SilentFn on_silent,
                       ClockFn clock)
    : loop_(loop),
      s_(s),
      send_(std::move(send)),
      on_silent_(std::move(on_silent)),
      clock_(std::move(clock)) {
  timer_ = loop_.timer([this] {
    tick();
    timer_.arm(std::min(s_.interval, s_.timeout) / 10);
  });
  last_tick_ = last_sent_ = clock_();
  timer_.arm(std::min(s_.interval, s_.timeout) / 10);
}

Heartbeats::~Heartbeats() = default;

double Heartbeats::steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Heartbeats::watch(int id, double timeout) {
  heard_[id] = Watched{clock_(), timeout > 0 ? timeout : s_.timeout};
}

void Heartbeats::heard(int id) {
  auto it = heard_.find(id);
  if (it != heard_.end()) it->second.at = std::max(it->second.at, clock_());
}

void Heartbeats::settle(int id) {
  auto it = heard_.find(id);
  if (it == heard_.end()) return;
  it->second.at = std::max(it->second.at, clock_());
  it->second.timeout = s_.timeout;
}

void Heartbeats::forget(int id) { heard_.erase(id); }

void Heartbeats::hold(int id, bool held) {
  auto it = heard_.find(id);
  if (it == heard_.end()) return;
  it->second.held = held;
  it->second.at = std::max(it->second.at, clock_());
}

void Heartbeats::beat() {
  double now = clock_();
  if (now - last_sent_ < s_.interval) return;
  last_sent_ = now;
  std::vector<int> ids;
  for (const auto& [id, t] : heard_) ids.push_back(id);
  for (int id : ids) send_(id);  // may forget links (a failed write)
}

// A late tick judges nobody: what arrived meanwhile is read before the next tick (the loop
// serves sockets before timers).  Only one tick in a row is let off, so that a process that
// is late all the time still finds silent neighbours.
void Heartbeats::tick() {
  double now = clock_();
  bool stalled = now - last_tick_ >= s_.timeout / 2 && !let_off_;
  let_off_ = stalled;
  last_tick_ = now;
  if (stalled) last_sent_ = 0;
  beat();
  if (stalled) return;
  std::vector<int> silent;
  for (const auto& [id, w] : heard_)
    if (!w.held && now - w.at >= w.timeout) silent.push_back(id);
  for (int id : silent) {
    if (!heard_.erase(id)) continue;
    on_silent_(id);  // may watch or forget others
  }
}

}  // namespace pe::ctrl
