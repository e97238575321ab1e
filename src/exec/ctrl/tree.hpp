// The control-plane tree.  Nodes 0 ... radix-1 talk to the front end (the root); node p relays
// for nodes radix + p*radix ... radix + p*radix + radix-1, and so on down.  A frame for a node
// that is not a child of the sender travels inside a Routed envelope, hop by hop; a frame from
// below reaches the root wrapped with the node it came from.
//
// TreeRoot is the front end's side, TreeRelay a daemon's.  Both work over Links (a Connection in
// production, in-memory pairs in tests); whoever owns a link's socket feeds its frames and its
// close to the tree.  Neither knows what the messages mean: frames for the node itself go to a
// callback.
//
// Threading: everything runs on the event-loop thread.  Links are destroyed by the tree at any
// time, also inside a callback of theirs: a Link must allow that (ConnLink posts it).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire.hpp"
#include "exec/ctrl/messages.hpp"

namespace pe::ctrl {

int tree_parent(int node, int radix);  // -1: the front end
std::vector<int> tree_children(int node, int radix, int nnodes);
bool in_subtree(int root, int node, int radix);  // node is root or below it
int tree_top(int node, int radix);               // the child of the root above node

// One end of a connection to a neighbour in the tree.
class Link {
 public:
  virtual ~Link() = default;
  virtual void send(uint16_t type, std::string_view payload) = 0;
  // Sends what is queued, then closes.
  virtual void finish() = 0;
  // Stops (true) or resumes taking frames from the neighbour (backpressure); a link that is no
  // socket has nothing to hold back.
  virtual void pause_reading(bool) {}
  template <class M>
  void send(const M& m) {
    send(static_cast<uint16_t>(M::kType), encode(m));
  }
};

class TreeRoot {
 public:
  struct Callbacks {
    std::function<void(int node, wire::Frame& f)> on_frame;         // node's own frame
    std::function<void(int node, const std::string& why)> on_lost;  // node and all below it
  };
  TreeRoot(int nnodes, int radix, Callbacks cb);
  ~TreeRoot();

  // A daemon got through the handshake.  A child of the root is kept; a deeper node waits
  // until its parent relays, and is then redirected to it.
  void attach(int node, std::unique_ptr<Link> link);
  // Node `node` relays: its children connect to `addrs` at `port`.
  void relay_ready(int node, std::vector<std::string> addrs, int port);
  // What arrived on the link of `node` (attached, or waiting), and its close.
  void frame_from(int node, wire::Frame& f);
  void link_closed(int node, const std::string& why);
  // Marks `node` and every node below it lost, drops their links, reports once.
  void lose(int node, const std::string& why);
  // Elastic arrivals, for children of the root only: a new node (returns its index), or a lost
  // node's place taken again (a new daemon connects for it).
  int add_node();
  void revive(int node);

  void send(int node, uint16_t type, std::string_view payload);
  void broadcast(uint16_t type, std::string_view payload);
  template <class M>
  void send(int node, const M& m) {
    send(node, static_cast<uint16_t>(M::kType), encode(m));
  }
  template <class M>
  void broadcast(const M& m) {
    broadcast(static_cast<uint16_t>(M::kType), encode(m));
  }

  bool attached(int node) const { return nodes_.at(static_cast<size_t>(node)).attached; }
  bool lost(int node) const { return nodes_.at(static_cast<size_t>(node)).lost; }
  bool waiting(int node) const { return nodes_.at(static_cast<size_t>(node)).waiting != nullptr; }
  int radix() const { return radix_; }
  int size() const { return static_cast<int>(nodes_.size()); }

 private:
  struct Node {
    std::unique_ptr<Link> link;     // children of the root
    std::unique_ptr<Link> waiting;  // a deeper node's first connection, until redirected
    bool attached = false;          // got through the handshake (here or at its parent)
    bool lost = false;
    bool relays = false;
    Redirect where;  // where its children connect
  };
  void redirect_waiting();

  int radix_;
  Callbacks cb_;
  std::vector<Node> nodes_;
};

class TreeRelay {
 public:
  struct Callbacks {
    std::function<void(wire::Frame& f)> on_frame;  // this node's own frames from upstream
  };
  TreeRelay(int self, int nnodes, int radix, std::string host, Callbacks cb);
  ~TreeRelay();

  void set_upstream(Link* up) { up_ = up; }
  // "" when `node` may connect here as a child, else why not.
  std::string check_child(int node) const;
  void add_child(int node, std::unique_ptr<Link> link);
  void from_upstream(wire::Frame& f);
  void from_child(int node, wire::Frame& f);
  void child_closed(int node, const std::string& why);
  bool has_children() const { return !tree_children(self_, radix_, nnodes_).empty(); }
  size_t connected_children() const { return children_.size(); }
  std::vector<int> children() const;  // connected ones
  // Stops (true) or resumes reading every child's link, also of children that connect
  // meanwhile: what they send waits in their own queues.
  void hold_children(bool held);
  // The link to a connected child, else null (heartbeats go to neighbours only).
  Link* child(int node) const {
    auto it = children_.find(node);
    return it == children_.end() ? nullptr : it->second.get();
  }

 private:
  int self_, nnodes_, radix_;
  std::string host_;
  Callbacks cb_;
  Link* up_ = nullptr;
  std::map<int, std::unique_ptr<Link>> children_;
  bool held_ = false;
};

}  // namespace pe::ctrl
