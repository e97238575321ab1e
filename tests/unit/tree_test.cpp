// The control-plane tree with in-memory links: a root (the front end) and seven relays (daemons)
// with fan-out 2.  Frames reach exactly the node they are for, broadcasts reach every node once,
// frames from below reach the root with their source, deeper nodes are redirected to their
// parent once it relays, and a lost relay loses its whole subtree.
#include <gtest/gtest.h>

#include <csignal>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "exec/ctrl/tree.hpp"

using namespace pe;
using namespace pe::ctrl;

namespace {

constexpr int kNodes = 7, kRadix = 2;  // 0,1 under the root; 2,3 under 0; 4,5 under 1; 6 under 2

// Frames are queued and delivered by pump(), as an event loop would.
struct Net {
  std::deque<std::function<void()>> queue;
  void pump() {
    while (!queue.empty()) {
      auto f = std::move(queue.front());
      queue.pop_front();
      f();
    }
  }
};

class MemLink : public Link {
 public:
  using Deliver = std::function<void(wire::Frame&)>;
  MemLink(Net& net, Deliver d, std::vector<wire::Frame>* sent = nullptr)
      : net_(net), deliver_(std::move(d)), sent_(sent) {}
  void send(uint16_t type, std::string_view payload) override {
    wire::Frame f{type, 0, std::string(payload)};
    if (sent_) sent_->push_back(f);
    if (deliver_) net_.queue.push_back([d = deliver_, f]() mutable { d(f); });
  }
  using Link::send;
  void finish() override { finished = true; }
  bool finished = false;

 private:
  Net& net_;
  Deliver deliver_;
  std::vector<wire::Frame>* sent_;
};

struct Got {
  int node;
  uint16_t type;
  std::string payload;
};

struct Bed {
  Net net;
  std::vector<Got> at_root;  // frames the root received, by source
  std::vector<std::pair<int, std::string>> lost;
  std::vector<std::vector<wire::Frame>> at_node{kNodes};     // frames each relay kept for itself
  std::vector<std::vector<wire::Frame>> first_link{kNodes};  // what a node's first link got
  std::vector<MemLink*> waiting{kNodes, nullptr};
  TreeRoot root{kNodes,
                kRadix,
                {[this](int n, wire::Frame& f) {
                   at_root.push_back({n, f.type, f.payload});
                 },
                 [this](int n, const std::string& why) { lost.emplace_back(n, why); }}};
  std::vector<std::unique_ptr<TreeRelay>> relays;
  std::vector<std::unique_ptr<MemLink>> ups;
  std::vector<MemLink*> up_of{kNodes, nullptr};  // each daemon's link toward the root

  Bed() {
    for (int i = 0; i < kNodes; ++i)
      relays.push_back(std::make_unique<TreeRelay>(
          i, kNodes, kRadix, "host" + std::to_string(i),
          TreeRelay::Callbacks{[this, i](wire::Frame& f) { at_node[i].push_back(f); }}));
  }
  // Node i's daemon gets through the handshake with the root.
  void connect_to_root(int i) {
    bool direct = tree_parent(i, kRadix) < 0;
    auto down = std::make_unique<MemLink>(
        net,
        direct ? MemLink::Deliver([this, i](wire::Frame& f) { relays[i]->from_upstream(f); })
               : MemLink::Deliver(),
        &first_link[i]);
    if (!direct) waiting[i] = down.get();
    if (direct) {
      ups.push_back(
          std::make_unique<MemLink>(net, [this, i](wire::Frame& f) { root.frame_from(i, f); }));
      relays[i]->set_upstream(ups.back().get());
      up_of[i] = ups.back().get();
    }
    root.attach(i, std::move(down));
  }
  // Node c, redirected, connects to its parent p.
  void connect_to_parent(int c) {
    int p = tree_parent(c, kRadix);
    ASSERT_EQ(relays[p]->check_child(c), "");
    relays[p]->add_child(c, std::make_unique<MemLink>(
                                net, [this, c](wire::Frame& f) { relays[c]->from_upstream(f); }));
    ups.push_back(std::make_unique<MemLink>(
        net, [this, p, c](wire::Frame& f) { relays[p]->from_child(c, f); }));
    relays[c]->set_upstream(ups.back().get());
    up_of[c] = ups.back().get();
  }
  void build() {
    for (int i = 0; i < kNodes; ++i) connect_to_root(i);
    for (int i = 0; i < kNodes; ++i) root.relay_ready(i, {"10.0.0." + std::to_string(i)}, 4000 + i);
    for (int i = kRadix; i < kNodes; ++i) connect_to_parent(i);
    net.pump();
  }
  void clear() {
    at_root.clear();
    for (auto& v : at_node) v.clear();
  }
};

int signal_of(const wire::Frame& f) { return decode<Signal>(f.payload).sig; }

}  // namespace

TEST(TreeTest, DeeperNodesAreRedirectedToTheirParentOnceItRelays) {
  Bed b;
  for (int i = 0; i < kNodes; ++i) b.connect_to_root(i);
  EXPECT_TRUE(b.root.attached(0));
  EXPECT_TRUE(b.root.waiting(6));
  EXPECT_TRUE(b.first_link[6].empty());
  b.root.relay_ready(2, {"10.0.0.2", "192.168.0.2"}, 4002);
  ASSERT_EQ(b.first_link[6].size(), 1u);
  Redirect r = decode<Redirect>(b.first_link[6][0].payload);
  EXPECT_EQ(r.addrs, (std::vector<std::string>{"10.0.0.2", "192.168.0.2"}));
  EXPECT_EQ(r.port, 4002);
  EXPECT_TRUE(b.root.attached(6));
  EXPECT_FALSE(b.root.waiting(6));
  EXPECT_TRUE(b.first_link[5].empty());  // its parent (1) does not relay yet
  EXPECT_TRUE(b.root.waiting(5));
}

TEST(TreeTest, FramesReachExactlyTheirNode) {
  Bed b;
  b.build();
  for (int target = 0; target < kNodes; ++target) {
    b.clear();
    b.root.send(target, Signal{SIGUSR1});
    b.net.pump();
    for (int i = 0; i < kNodes; ++i) {
      ASSERT_EQ(b.at_node[i].size(), i == target ? 1u : 0u) << "target " << target << " node " << i;
      if (i == target) EXPECT_EQ(signal_of(b.at_node[i][0]), SIGUSR1);
    }
  }
  b.clear();
  b.root.broadcast(Signal{SIGTERM});
  b.net.pump();
  for (int i = 0; i < kNodes; ++i) {
    ASSERT_EQ(b.at_node[i].size(), 1u) << i;
    EXPECT_EQ(signal_of(b.at_node[i][0]), SIGTERM);
  }
}

TEST(TreeTest, FramesFromBelowReachTheRootWithTheirSource) {
  Bed b;
  b.build();
  b.clear();
  for (int i : {6, 1, 4}) b.up_of[i]->send(Port{6000 + i});
  b.net.pump();
  ASSERT_EQ(b.at_root.size(), 3u);
  for (const auto& g : b.at_root) {
    EXPECT_EQ(g.type, static_cast<uint16_t>(Msg::Port));
    EXPECT_EQ(decode<Port>(g.payload).port, 6000 + g.node);
  }
}

TEST(TreeTest, ALostRelayLosesItsSubtree) {
  Bed b;
  b.build();
  // Node 2 sees its child 6 go: the root hears it once, with 2's view of it.
  b.relays[2]->child_closed(6, "connection reset");
  b.net.pump();
  ASSERT_EQ(b.lost.size(), 1u);
  EXPECT_EQ(b.lost[0].first, 6);
  EXPECT_NE(b.lost[0].second.find("connection reset, seen by node host2"), std::string::npos);
  EXPECT_TRUE(b.root.lost(6));
  EXPECT_FALSE(b.root.lost(2));
  // The root loses its connection to node 0: 0 and everything below it (2, 3, 6) are lost,
  // reported once, for node 0; node 1's side goes on.
  b.lost.clear();
  b.root.link_closed(0, "eof");
  b.root.link_closed(0, "eof");
  ASSERT_EQ(b.lost.size(), 1u);
  EXPECT_EQ(b.lost[0].first, 0);
  for (int i : {0, 2, 3, 6}) EXPECT_TRUE(b.root.lost(i)) << i;
  for (int i : {1, 4, 5}) EXPECT_FALSE(b.root.lost(i)) << i;
  b.clear();
  b.root.broadcast(Signal{SIGTERM});
  b.root.send(3, Signal{SIGINT});
  b.net.pump();
  for (int i = 0; i < kNodes; ++i)
    EXPECT_EQ(b.at_node[i].size(), (i == 1 || i == 4 || i == 5) ? 1u : 0u) << i;
  // Frames of lost nodes that were still on their way are dropped.
  b.clear();
  b.up_of[6]->send(Port{1});
  b.net.pump();
  EXPECT_TRUE(b.at_root.empty());
}

TEST(TreeTest, ARelayCannotSpeakForNodesOutsideItsSubtree) {
  Bed b;
  b.build();
  Routed r;
  r.node = 5;  // below node 1, not node 0
  r.inner.type = static_cast<uint16_t>(Msg::Port);
  r.inner.payload = encode(Port{1});
  wire::Frame f{static_cast<uint16_t>(Msg::Routed), 0, encode(r)};
  EXPECT_THROW(b.root.frame_from(0, f), wire::WireError);
  EXPECT_THROW(b.relays[2]->from_child(6 - 3, f), wire::WireError);
  EXPECT_EQ(b.relays[0]->check_child(4), "is not a child of this node");
  EXPECT_EQ(b.relays[0]->check_child(2), "is already connected");
}

namespace {
class PausableLink : public Link {
 public:
  explicit PausableLink(bool* paused) : paused_(paused) {}
  void send(uint16_t, std::string_view) override {}
  using Link::send;
  void finish() override {}
  void pause_reading(bool p) override { *paused_ = p; }

 private:
  bool* paused_;
};
}  // namespace

TEST(TreeTest, ARelayHoldsItsChildrenAlsoThoseThatConnectWhileHeld) {
  TreeRelay r(0, 7, 2, "a", TreeRelay::Callbacks{[](wire::Frame&) {}});  // children: 2 and 3
  bool two = false, three = false;
  r.add_child(2, std::make_unique<PausableLink>(&two));
  r.hold_children(true);
  EXPECT_TRUE(two);
  r.add_child(3, std::make_unique<PausableLink>(&three));  // connects while held
  EXPECT_TRUE(three);
  EXPECT_EQ(r.children(), (std::vector<int>{2, 3}));
  r.hold_children(false);
  EXPECT_FALSE(two);
  EXPECT_FALSE(three);
}
