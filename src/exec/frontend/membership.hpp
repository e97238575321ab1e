// Elastic membership (--nnodes MIN:MAX) as the front end decides it, with no processes and no
// clock of its own: which nodes the job has, which of them form the next generation, and which
// hosts are kept out.  JobController feeds it what happens (a node source offers a host, a
// node's daemon is ready, a node is lost) and acts on its answers; unit tests drive it through
// scripted sequences.
//
// - Slots: every node has a slot, its place in the job's map of nodes and in the control plane.
//   A lost node's slot is used again (by the same host first), new slots are added up to
//   `slot_limit` (the nodes that can talk to the front end directly).
// - Order: the next generation is the nodes of the current one that are left, in their order,
//   then other ready nodes in the order they were admitted, at most MAX in all (the others wait
//   as spares), a multiple of --nnodes-multiple (the nodes beyond it stand by as spares too).  So survivors keep their order and new nodes come after them; a host that comes
//   back after a loss is a new node.
// - Cool-down: a host whose node was lost is not admitted again for `cooldown` seconds, doubled
//   on each further loss of that host.  A node retired on purpose (its host no longer listed)
//   has none.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace pe {

struct MembershipSettings {
  int max_nodes = 1;     // --nnodes MAX
  int slot_limit = 32;   // slots there can be (--tree-radix)
  double cooldown = 10;  // seconds a lost host is kept out the first time
  int multiple = 1;      // --nnodes-multiple: a generation has a multiple of this many nodes
};

class Membership {
 public:
  enum class State { Starting, Ready, Lost };
  struct Node {
    std::string host;
    int ranks = 0;
    State state = State::Starting;
    long order = 0;        // admission: smaller first
    bool initial = false;     // one of the job's first nodes (counts while it starts)
    bool spawn_only = false;  // for MPI_Comm_spawn's processes: never in a generation
  };
  // What to do with an offered host: start its daemon in `slot`, or nothing (`why`: "" when
  // the host is in the job already, else the reason it is kept out).
  struct Offer {
    int slot = -1;
    std::string why;
    bool full = false;  // refused for want of room (the front end's node limit), not a cool-down
  };

  explicit Membership(MembershipSettings s) : s_(s) {}

  // One of the job's first nodes, in order; they are in slots 0, 1, ...
  void add_initial(const std::string& host, int ranks);
  // `order`: the node's place among the others (a fixed node rank, join mode's static
  // rendezvous), else -1: after every node admitted so far.
  Offer offer(const std::string& host, int ranks, double now, bool spawn_only = false,
              long order = -1);
  void ready(int slot);
  // One of the first nodes, still starting when the job begins without it: from now on it is
  // an arrival (it joins a later generation once ready).
  void late(int slot);
  // The node in `slot` is lost (or never came up); returns the seconds its host is kept out.
  double lost(int slot, double now);
  // The node in `slot` leaves on purpose (its node source no longer lists its host): gone like
  // a lost one, but its host is not kept out (it may be listed again at once).
  void retire(int slot);

  // The generation that runs now (the slots, in its order).
  void set_generation(const std::vector<int>& slots);
  // Whether `slots` hold the nodes of that generation, in its order (a lost node's slot taken
  // by another node is not).
  bool is_generation(const std::vector<int>& slots) const;
  // The slots of the next generation: the current one's that are left, then ready nodes (and
  // first nodes still starting) in admission order, at most MAX.
  std::vector<int> next_generation() const;
  // The nodes that count toward --nnodes MIN: the same, without the limit (a multiple of
  // --nnodes-multiple, as the generation).
  int left() const;
  // Nodes offered while the job runs whose daemons are not ready yet.
  int starting() const;
  // The slot of `host` while its node is not lost, else -1.
  int find(const std::string& host) const;
  const Node& node(int slot) const { return nodes_.at(static_cast<size_t>(slot)); }
  size_t size() const { return nodes_.size(); }

 private:
  struct History {
    int losses = 0;
    double until = 0;  // kept out until then
  };
  bool counts(const Node& n) const {
    return !n.spawn_only &&
           (n.state == State::Ready || (n.state == State::Starting && n.initial));
  }
  int free_slot(const std::string& host) const;

  MembershipSettings s_;
  std::vector<Node> nodes_;
  std::vector<long> generation_;  // its nodes by admission number (a slot may be taken again)
  std::map<std::string, History> history_;
  long next_order_ = 0;
};

}  // namespace pe
