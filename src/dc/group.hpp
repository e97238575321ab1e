// ProcessGroup::Impl: who is in the group, where they are (nodes, local ranks), and the
// transports, Comms and shm engine of each level, which it owns.  Built by init()/threads() from
// a World, and by split().  It chooses the algorithm of each call and hands it the Comms and
// options it uses (the algorithms never see the Impl).  Threads: the one that uses the group; in
// a hierarchical allreduce in lanes, the lanes' threads read it, each using its own lane's Comm
// and shm lane, while the caller waits for them in run_lanes().
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dc/bootstrap.hpp"
#include "dc/comm.hpp"
#include "dc/hierarchical.hpp"
#include "dc/settings.hpp"
#include "dc/shm/engine.hpp"
#include "dc/socket.hpp"
#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {

namespace gpu {
struct DeviceState;  // the GPU path's communicators (gpu/device.cpp); incomplete here
}  // namespace gpu

struct ProcessGroup::Impl {
  Settings s;
  std::string key;  // unique name of this group (shm segment names)
  bool threads = false;
  int rank = 0, size = 1;
  std::vector<int> world;      // world rank (transport peer) of every group rank
  std::vector<int> node_of;    // node index of every group rank, numbered in order of first rank
  std::vector<int> domain_of;  // locality domain of every group rank on its node
  int node = 0, nodes = 1, local_rank = 0, local_size = 1;
  int min_local = 1, max_local = 1;  // fewest / most ranks on one node
  bool shared_cpus =
      false;  // a machine of the group runs more ranks than it has processors (agreed)
  // The shm slot, and the piece of a hierarchical allreduce: PYTORCH_DC_SHM_BYTES, else 512 KiB
  // on one node (a round then fits a 2 MiB L2 cache: 1.3x faster than 4 MiB there) and 4 MiB
  // across nodes (each owner's cross-node allreduce gets a larger shard); across nodes no larger
  // than the smallest slot of a node (lay_out: one whose /dev/shm had no room has a smaller one).
  size_t shm_bytes = 512 << 10;
  std::shared_ptr<Transport> inter_t,
      intra_t;  // intra_t: the point-to-point transport inside a node
  std::unique_ptr<shm::AllreduceEngine> engine;  // the node's shared memory (intra-node shm)
  Comm world_c, local_c, cross_c;  // cross_c: the ranks with this local rank on every node
  // The lanes of a hierarchical allreduce (collectives.cpp): the fewest shm lanes of any node
  // (1 where a node has no shm engine or the transport across nodes is not tcp); lane l > 0 goes
  // across nodes over lane_c[l - 1], a tcp mesh of its own among cross_c's ranks (lane_t).
  int cross_lanes = 1;
  std::vector<std::unique_ptr<Transport>> lane_t;
  std::vector<Comm> lane_c;
  Comm flat_c;                     // all ranks, over the intra-node transport on a single node
  // Every node has local_size ranks and the ranks go node by node (k * local_size + j: local
  // rank j of node k), as hierarchical_reduce_scatter and hierarchical_allgather need.
  bool node_major = false;
  std::vector<char> work;  // reduce_scatter's work buffer, kept between calls (up to 256 MiB)
  uint64_t seq = 0;
  int splits = 0;
  std::shared_ptr<gpu::DeviceState> gpu;  // made by the first device-memory call
  std::string failed;
  std::string tcp_host;  // the address of this rank's tcp listener ("": none), for mailbox()

  // Fills the layout and the Comms from world, node_of, shared_cpus and rank; creates the shm
  // segment, and the lanes' connections across nodes.
  void lay_out(const Deadline& d);
  // Opens `n` listeners on this rank's tcp interface and tells every rank of the group where
  // (a collective; in `ls`); returns every rank's addresses (rank r's i-th at r * n + i) and
  // sets `session` to rank 0's random number (the key of the connections' hellos).
  std::vector<std::string> publish_listeners(std::vector<Listener>& ls, int n, uint64_t& session,
                                             const Deadline& d);
  // Makes lanes 1 ... cross_lanes - 1 of this rank's local rank across nodes (lay_out).
  void connect_lanes(const std::vector<int>& cross_ranks, const Deadline& d);
  // Every transport of the group (lanes too) aborted, after an error.
  void abort_transports(const std::string& why);
  // The processes on this rank's machine (from node_of), and whether they are more than its
  // processors.
  double processes_here() const;
  bool machine_oversubscribed() const;
  // The lanes of the node's shm engine this rank asks for (local rank 0's count): 1 across
  // nodes where lanes cannot cross (not tcp, not hierarchical), else the setting, else its
  // processors per process on the machine, 1 to 4.
  int shm_lanes() const;
  // Runs f; on an error the group (and the transports it shares) is aborted, so that the other
  // ranks get an error too instead of waiting for their timeout.  The error names the call (d).
  template <typename F>
  void guarded(const Deadline& d, F&& f);
  Deadline deadline(double timeout, const std::string& what) const;
  double seconds(double timeout) const { return timeout >= 0 ? timeout : s.timeout; }  // NaN too
  // guarded() for code outside process_group.cpp.
  void run_guarded(const Deadline& d, const std::function<void()>& f);
  // The allreduce of the group, in place, by level and size (collectives.cpp).
  void allreduce(void* buf, size_t count, DType t, Op op, const Deadline& d);
  // Reduce-scatter and allgather of `count` elements per rank (collectives.cpp), by level.
  void reduce_scatter(const void* in, void* out, size_t count, DType t, Op op, const Deadline& d);
  void allgather(const void* in, void* out, size_t count, DType t, const Deadline& d);
  // Whether reduce_scatter and allgather go level by level (hierarchical_reduce_scatter): the
  // ranks are node_major, more than one on each node, and there are levels to use (several
  // nodes, PYTORCH_DC_HIERARCHICAL not off; or one node with shm).
  bool blocks_by_level() const;
  // Runs `run` with the levels of this group on the host engines (blocks_by_level).
  void host_blocks(const std::function<void(const BlockLevels&)>& run);
};

// Checks one buffer argument of a call, before anything is sent: dc::Error for a null buffer
// with a non-zero count, or for a count of `elem`-byte elements, `blocks` times (a buffer with
// every rank's block), whose size in bytes does not fit in size_t (process_group.cpp).
void need_buffer(const void* p, size_t count, const char* op, size_t elem = 1, size_t blocks = 1);

// A group of the ranks of `w` (process_group.cpp); `listener`: this rank's tcp listener, whose
// address `w` published.
std::unique_ptr<ProcessGroup::Impl> make_impl(World w, const Settings& s, Listener* listener);

}  // namespace pytorch_exec::dc
