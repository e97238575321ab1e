// The private directories that a PMIx server makes ($TMPDIR/pytorch_exec.XXXXXX and
// /dev/shm/pytorch_exec.XXXXXX) carry a mark of the process that made them.  The server removes
// them when it ends, and the orphan guard removes them when pytorch_exec or pytorch_execd dies.
// When the guard dies with them (a SIGKILL of every process of a job or a node), a later server
// on the machine removes them: remove_stale() takes the marked directories whose maker is gone.
// The mark has the maker's pid, its start time, its PID namespace and the machine's boot id.
// A directory counts as stale only when the boot id and the namespace match the caller's, the
// directory is the caller's user's, and no process with that pid and start time exists.  So
// nothing is taken from another machine that shares the directory, from another container, or
// from a live job.  Directories without a mark (made by an older version) are left alone, and
// nothing is marked or removed where /proc is not this PID namespace's.  The maker is the
// node's agent (pytorch_exec or pytorch_execd): ranks that outlive it and its orphan guard (both
// killed, the ranks not) lose the directories at the next job, as they lost their PMIx server.
#pragma once

#include <string>

namespace pe {

// Writes the mark of the calling process into `dir`.  Returns false if it cannot; nothing else
// depends on the mark.
bool mark_owner(const std::string& dir);
// Removes the stale marked directories pytorch_exec.* directly under `parent`; returns how many.
// Errors are ignored.
int remove_stale(const std::string& parent);

}  // namespace pe
