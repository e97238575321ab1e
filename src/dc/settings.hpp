// The options of a process group, resolved: explicit Options first, then the PYTORCH_DC_*
// environment variables, then the defaults.  Transport names become kinds here, once (an unknown
// name is an Error); later code compares kinds.  Pure, so that it is unit-tested.
#pragma once

#include <string>

#include "dc/registry.hpp"
#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {

struct Settings {
  TransportKind intra = TransportKind::Shm;  // shm, tcp or mpi
  TransportKind inter = TransportKind::Tcp;  // tcp or mpi
  double timeout = 300;
  size_t small_bytes = 32 << 10;
  bool hierarchical = true;
  bool bf16_wire = false;
  size_t shm_bytes = 0;  // PYTORCH_DC_SHM_BYTES; 0: by layout (ProcessGroup::Impl::shm_bytes)
  // PYTORCH_DC_SHM_THREADS: the lanes of a node's shm engine (shm/engine.hpp); 0: by the
  // processors (ProcessGroup::Impl::shm_lanes).
  int shm_threads = 0;
  // PYTORCH_DC_PIPELINE_BYTES: the chunk of the pipelined cross-node step of a hierarchical
  // allreduce (engines.hpp); 0: one chunk per shard (host memory's default: it goes on the wire
  // in place, there is no copy to overlap).
  size_t pipeline_bytes = 0;
  // PYTORCH_DC_TCP_CONGESTION: the TCP congestion control of the tcp transport's connections
  // ("auto", "system" or a kernel's algorithm name; see set_congestion_control in socket.hpp).
  std::string tcp_congestion = "auto";

  bool uses(TransportKind k) const { return intra == k || inter == k; }
};

// The processors' worth of time that the cgroups of a process allow it: the least CFS quota on
// the path from its cgroup up to the root (cgroup v2 cpu.max; v1 cpu.cfs_quota_us over
// cpu.cfs_period_us), 0 when none limits it.  `proc_cgroup`: the text of /proc/<pid>/cgroup;
// `root`: where the cgroup file systems are (/sys/fs/cgroup).  A container's own limit is at the
// root of its view.  Files that are not there or do not parse limit nothing.
double cgroup_cpu_limit(const std::string& proc_cgroup, const std::string& root);
// The processors this process can use at once: those it may run on (its affinity), no more
// than its cgroups' quota allows (rounded up), at least 1.  machine_cpus: the same of all the
// machine's processors (what the processes of the machine share, whatever their affinity).
double usable_cpus();
double machine_cpus();

// Throws Error naming the option or variable that is wrong.  Every transport name that is set is
// checked, also one that a more specific setting overrides.
Settings resolve_settings(const Options& o);

}  // namespace pytorch_exec::dc
