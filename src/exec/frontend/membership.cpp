#include "exec/frontend/membership.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pe {

void Membership::add_initial(const std::string& host, int ranks) {
  Node n;
  n.host = host;
  n.ranks = ranks;
  n.order = next_order_++;
  n.initial = true;
  nodes_.push_back(std::move(n));
}

// The lost slot `host` had, else the first lost one, else a new one (-1: none is left).
int Membership::free_slot(const std::string& host) const {
  int first = -1;
  for (size_t i = 0; i < nodes_.size() && static_cast<int>(i) < s_.slot_limit; ++i) {
    if (nodes_[i].state != State::Lost) continue;
    if (nodes_[i].host == host) return static_cast<int>(i);
    if (first < 0) first = static_cast<int>(i);
  }
  if (first >= 0) return first;
  return static_cast<int>(nodes_.size()) < s_.slot_limit ? static_cast<int>(nodes_.size()) : -1;
}

Membership::Offer Membership::offer(const std::string& host, int ranks, double now,
                                    bool spawn_only, long order) {
  if (find(host) >= 0) return {};
  auto h = history_.find(host);
  if (h != history_.end() && now < h->second.until) {
    char why[96];
    std::snprintf(why, sizeof why, "lost %d time(s): kept out for another %.1f s (cool-down)",
                  h->second.losses, h->second.until - now);
    return {-1, why};
  }
  int slot = free_slot(host);
  if (slot < 0)
    return {-1,
            "no room: the front end takes " + std::to_string(s_.slot_limit) +
                " nodes (--tree-radix)",
            true};
  Node n;
  n.host = host;
  n.ranks = ranks;
  n.order = order >= 0 ? order : next_order_;
  next_order_ = std::max(next_order_, n.order + 1);
  n.spawn_only = spawn_only;
  if (slot == static_cast<int>(nodes_.size()))
    nodes_.push_back(std::move(n));
  else
    nodes_[static_cast<size_t>(slot)] = std::move(n);
  return {slot, ""};
}

void Membership::ready(int slot) {
  Node& n = nodes_.at(static_cast<size_t>(slot));
  if (n.state == State::Starting) n.state = State::Ready;
}

void Membership::late(int slot) { nodes_.at(static_cast<size_t>(slot)).initial = false; }

double Membership::lost(int slot, double now) {
  Node& n = nodes_.at(static_cast<size_t>(slot));
  if (n.state == State::Lost) return 0;
  n.state = State::Lost;
  History& h = history_[n.host];
  ++h.losses;
  double keep_out = s_.cooldown * std::ldexp(1.0, std::min(h.losses - 1, 16));
  h.until = now + keep_out;
  return keep_out;
}

void Membership::retire(int slot) { nodes_.at(static_cast<size_t>(slot)).state = State::Lost; }

void Membership::set_generation(const std::vector<int>& slots) {
  generation_.clear();
  for (int s : slots) generation_.push_back(node(s).order);
}

bool Membership::is_generation(const std::vector<int>& slots) const {
  if (slots.size() != generation_.size()) return false;
  for (size_t i = 0; i < slots.size(); ++i)
    if (node(slots[i]).order != generation_[i]) return false;
  return true;
}

std::vector<int> Membership::next_generation() const {
  std::vector<int> out, others;
  for (long o : generation_)
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].order == o && counts(nodes_[i])) out.push_back(static_cast<int>(i));
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (counts(nodes_[i]) && std::find(out.begin(), out.end(), static_cast<int>(i)) == out.end())
      others.push_back(static_cast<int>(i));
  std::stable_sort(others.begin(), others.end(),
                   [this](int a, int b) { return node(a).order < node(b).order; });
  out.insert(out.end(), others.begin(), others.end());
  if (s_.max_nodes > 0 && out.size() > static_cast<size_t>(s_.max_nodes))
    out.resize(static_cast<size_t>(s_.max_nodes));
  out.resize(out.size() - out.size() % static_cast<size_t>(std::max(1, s_.multiple)));
  return out;
}

int Membership::left() const {
  int n = static_cast<int>(
      std::count_if(nodes_.begin(), nodes_.end(), [this](const Node& n) { return counts(n); }));
  return n - n % std::max(1, s_.multiple);
}

int Membership::starting() const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) {
    return n.state == State::Starting && !n.initial && !n.spawn_only;
  }));
}

int Membership::find(const std::string& host) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].host == host && nodes_[i].state != State::Lost) return static_cast<int>(i);
  return -1;
}

}  // namespace pe
