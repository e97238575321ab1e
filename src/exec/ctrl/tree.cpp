#include "exec/ctrl/tree.hpp"

namespace pe::ctrl {

int tree_parent(int node, int radix) { return node < radix ? -1 : (node - radix) / radix; }

std::vector<int> tree_children(int node, int radix, int nnodes) {
  std::vector<int> out;
  for (long c = radix + static_cast<long>(node) * radix;
       c < nnodes && c < radix + (node + 1L) * radix; ++c)
    out.push_back(static_cast<int>(c));
  return out;
}

bool in_subtree(int root, int node, int radix) {
  for (; node >= 0; node = tree_parent(node, radix))
    if (node == root) return true;
  return false;
}

int tree_top(int node, int radix) {
  while (tree_parent(node, radix) >= 0) node = tree_parent(node, radix);
  return node;
}

namespace {

std::string routed(uint32_t node, uint16_t type, std::string_view payload) {
  Routed r;
  r.node = node;
  r.inner.type = type;
  r.inner.payload = std::string(payload);
  return encode(r);
}

}  // namespace

TreeRoot::TreeRoot(int nnodes, int radix, Callbacks cb)
    : radix_(radix), cb_(std::move(cb)), nodes_(static_cast<size_t>(nnodes)) {}

TreeRoot::~TreeRoot() = default;

void TreeRoot::attach(int node, std::unique_ptr<Link> link) {
  Node& n = nodes_.at(static_cast<size_t>(node));
  if (tree_parent(node, radix_) >= 0) {
    n.waiting = std::move(link);
    redirect_waiting();
    return;
  }
  n.link = std::move(link);
  n.attached = true;
}

void TreeRoot::relay_ready(int node, std::vector<std::string> addrs, int port) {
  Node& n = nodes_.at(static_cast<size_t>(node));
  n.relays = true;
  n.where.addrs = std::move(addrs);
  n.where.port = port;
  redirect_waiting();
}

void TreeRoot::redirect_waiting() {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    if (!n.waiting) continue;
    const Node& parent = nodes_[static_cast<size_t>(tree_parent(static_cast<int>(i), radix_))];
    if (!parent.relays) continue;
    n.waiting->send(parent.where);
    n.waiting->finish();
    n.waiting.reset();
    n.attached = true;
  }
}

void TreeRoot::frame_from(int node, wire::Frame& f) {
  if (lost(node) || waiting(node)) return;  // its "joined" counts when it reaches its parent
  if (f.type != static_cast<uint16_t>(Msg::Routed)) return cb_.on_frame(node, f);
  Routed r = decode<Routed>(f.payload);
  if (r.node >= nodes_.size() || !in_subtree(node, static_cast<int>(r.node), radix_))
    throw wire::WireError("routed frame from node " + std::to_string(r.node) + ", not below node " +
                          std::to_string(node));
  int from = static_cast<int>(r.node);
  if (r.inner.type == static_cast<uint16_t>(Msg::Lost))
    return lose(from, decode<Lost>(r.inner.payload).why);
  if (!lost(from)) cb_.on_frame(from, r.inner);
}

void TreeRoot::link_closed(int node, const std::string& why) {
  if (lost(node)) return;
  lose(node, "lost contact with its daemon (" + why + ")");
}

void TreeRoot::lose(int node, const std::string& why) {
  if (lost(node)) return;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& m = nodes_[i];
    if (m.lost || !in_subtree(node, static_cast<int>(i), radix_)) continue;
    m.lost = true;
    m.relays = false;
    m.link.reset();
    m.waiting.reset();
  }
  cb_.on_lost(node, why);
}

int TreeRoot::add_node() {
  nodes_.emplace_back();
  return static_cast<int>(nodes_.size()) - 1;
}

void TreeRoot::revive(int node) {
  Node& n = nodes_.at(static_cast<size_t>(node));
  if (!n.lost || tree_parent(node, radix_) >= 0)
    throw wire::WireError("node " + std::to_string(node) + " cannot be started again");
  n = Node{};
}

void TreeRoot::send(int node, uint16_t type, std::string_view payload) {
  Node& n = nodes_.at(static_cast<size_t>(node));
  if (n.link) return n.link->send(type, payload);
  Node& top = nodes_[static_cast<size_t>(tree_top(node, radix_))];
  if (top.link)
    top.link->send(static_cast<uint16_t>(Msg::Routed),
                   routed(static_cast<uint32_t>(node), type, payload));
}

void TreeRoot::broadcast(uint16_t type, std::string_view payload) {
  std::string all = routed(kAllNodes, type, payload);
  for (auto& n : nodes_)
    if (n.link) n.link->send(static_cast<uint16_t>(Msg::Routed), all);
}

TreeRelay::TreeRelay(int self, int nnodes, int radix, std::string host, Callbacks cb)
    : self_(self), nnodes_(nnodes), radix_(radix), host_(std::move(host)), cb_(std::move(cb)) {}

TreeRelay::~TreeRelay() = default;

std::string TreeRelay::check_child(int node) const {
  if (tree_parent(node, radix_) != self_) return "is not a child of this node";
  if (children_.count(node)) return "is already connected";
  return "";
}

void TreeRelay::add_child(int node, std::unique_ptr<Link> link) {
  if (held_) link->pause_reading(true);
  children_[node] = std::move(link);
}

std::vector<int> TreeRelay::children() const {
  std::vector<int> ids;
  for (const auto& [id, c] : children_) ids.push_back(id);
  return ids;
}

void TreeRelay::hold_children(bool held) {
  if (held == held_) return;
  held_ = held;
  for (auto& [id, c] : children_) c->pause_reading(held);
}

// From upstream: for us, for every node (passed down and handled here), or for a node below.
void TreeRelay::from_upstream(wire::Frame& f) {
  if (f.type != static_cast<uint16_t>(Msg::Routed)) return cb_.on_frame(f);
  Routed r = decode<Routed>(f.payload);
  if (r.node == kAllNodes) {
    for (auto& [id, c] : children_) c->send(f.type, f.payload);
    return cb_.on_frame(r.inner);
  }
  if (static_cast<int>(r.node) == self_) return cb_.on_frame(r.inner);
  for (auto& [id, c] : children_)
    if (in_subtree(id, static_cast<int>(r.node), radix_)) return c->send(f.type, f.payload);
  // A node below us that is gone: its loss has been reported.
}

// From a child: its own frame goes up wrapped with its id; a relayed one as it is.
void TreeRelay::from_child(int node, wire::Frame& f) {
  if (!up_) return;
  if (f.type != static_cast<uint16_t>(Msg::Routed))
    return up_->send(static_cast<uint16_t>(Msg::Routed),
                     routed(static_cast<uint32_t>(node), f.type, f.payload));
  Routed r = decode<Routed>(f.payload);
  if (r.node >= static_cast<uint32_t>(nnodes_) ||
      !in_subtree(node, static_cast<int>(r.node), radix_))
    throw wire::WireError("routed frame from a node not below this child");
  up_->send(f.type, f.payload);
}

void TreeRelay::child_closed(int node, const std::string& why) {
  if (!children_.erase(node) || !up_) return;
  Lost l{"lost contact with its daemon (" + why + ", seen by node " + host_ + ")"};
  up_->send(static_cast<uint16_t>(Msg::Routed),
            routed(static_cast<uint32_t>(node), static_cast<uint16_t>(Msg::Lost), encode(l)));
}

}  // namespace pe::ctrl
