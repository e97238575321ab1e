// This machine's hwloc topology, kept as XML between launches.  Discovering it reads every PCI
// device's configuration space, which a virtual machine traps access by access (about 1 ms per
// device here, 8 to 12 ms per launch on a 2-processor VM with 6 PCI functions; more with every
// GPU and NIC); the XML loads in a fraction of a millisecond.  The file is the full machine
// (disallowed processors included) and is loaded with hwloc's "this system, allowed resources"
// flags, so that each job still sees only the processors its cgroup allows.
//
// The file is named by a fingerprint of what the topology depends on: the boot (its id), the
// host name, the processors online and present, the PCI devices, network and InfiniBand
// interfaces and NVIDIA GPUs listed by the kernel, the hwloc version, every HWLOC_* variable,
// the GPUs the job may see (CUDA_VISIBLE_DEVICES and the like) and the process's cgroups (so a
// job with a device cgroup of its own has its own file).  Any of them changing gives another
// file; of a host's files the newest 16 are kept.  With HWLOC_XMLFILE, HWLOC_SYNTHETIC,
// HWLOC_FSROOT, HWLOC_THISSYSTEM, HWLOC_CPUID_PATH or HWLOC_COMPONENTS set there is no cache.
//
// Where: $PYTORCH_EXEC_TOPOLOGY_CACHE (a directory), else $XDG_CACHE_HOME/pytorch_exec, else
// $HOME/.cache/pytorch_exec (absolute paths only); PYTORCH_EXEC_TOPOLOGY_CACHE=0 (or off)
// turns it off.  The directory is made 0700 and the file 0600, written to a temporary name and
// renamed; a file is read only from a directory of ours that nobody else may write in, and only
// if it is a regular file of ours.  Any failure (no home, a read-only file system, a file that
// does not load) falls back to discovering the machine, once per launch.
#pragma once

#include <hwloc.h>

#include <string>

namespace pe::topo {

// The cache file for this machine as it is now, or "" when the cache is off or has nowhere to
// go.
std::string topology_cache_file();

// The cache file's XML, or "" when it is not a regular file of ours (not a link, not writable
// by others, in a directory of ours that nobody else may write in) of sensible size.
std::string read_topology_cache(const std::string& path);

// This machine discovered in full (disallowed processors included), as XML ("" on failure).
std::string discover_topology_xml();

// Writes `xml` to `path` (atomically; of this host's files in its directory, the newest 16 are
// kept).  False on any failure.
bool write_topology_cache(const std::string& path, const std::string& xml);

}  // namespace pe::topo
