// This machine's hwloc topology, kept as XML between launches.  Discovering it reads every PCI
// device's configuration space, which a virtual machine traps access by access (about 1 ms per
// device here, 8 to 12 ms per launch on a 2-processor VM with 6 PCI functions; more with every
// GPU and NIC); the XML loads in a fraction of a millisecond.  The file is the full machine
// (disallowed processors included) and is loaded with hwloc's "this system, allowed resources"
// flags, so that each job still sees only the processors its cgroup allows.
//
// The file is named by a fingerprint of what the topology depends on: the boot (its id), the
// host name, the processors online and present, the PCI devices, network and InfiniBand
// interfaces and NVIDIA GPUs listed by the kernel, the hwloc version and every HWLOC_*
// variable.  Any of them changing gives another file; the others of this host are removed when
// a new one is written.
//
// Where: $PYTORCH_EXEC_TOPOLOGY_CACHE (a directory), else $XDG_CACHE_HOME/pytorch_exec, else
// $HOME/.cache/pytorch_exec; PYTORCH_EXEC_TOPOLOGY_CACHE=0 (or off) turns it off.  The
// directory is made 0700 and the file 0600, written to a temporary name and renamed.  Any
// failure (no home, a read-only file system, a file that does not load) falls back to
// discovering the machine as before.
#pragma once

#include <hwloc.h>

#include <string>

namespace pe::topo {

// The cache file for this machine as it is now, or "" when the cache is off or has nowhere to
// go.
std::string topology_cache_file();

// Discovers this machine in full (disallowed processors included) and writes it to `path`
// (atomically; other files of this host in its directory are removed).  False on any failure.
bool write_topology_cache(const std::string& path);

}  // namespace pe::topo
