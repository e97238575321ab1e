// The mpi transport: bytes between the ranks of one MPI job (pytorch_exec with PMIx, mpirun,
// srun --mpi=pmix), moved by MPI point-to-point calls only.  The DataChannel's collectives run
// on top of it; MPI's own collectives are never used.
//
// It works on its own duplicate of MPI_COMM_WORLD (so its messages never match the program's)
// with MPI_ERRORS_RETURN: every MPI error becomes a dc::Error carrying MPI's error string.  All
// data travels with one tag, so the MPI ordering rule keeps each (peer, direction) in posting
// order; a message above 1 GiB goes as consecutive 1 GiB pieces (counts are ints in MPI), which
// both sides cut alike.  Zero-byte operations complete at once and send nothing.
// abort() tells every peer with a short message under a second tag; a peer waiting on this
// transport then throws dc::Error("mpi transport: rank R aborted: why") instead of timing out.
// Requests outstanding at abort() are cancelled (receives) or left to MPI (sends): MPI may still
// read or write their buffers until the process ends.
//
// The group must be the whole MPI job: DataChannel rank r may be any MPI_COMM_WORLD rank, but
// MPI_COMM_WORLD must hold exactly the group's `size` processes (MPI_Comm_dup involves all).
//
// Threads: create() and every method of the transport are called by the one thread that runs
// the group's operations; the transport has no locks.  MPI is initialized with at least
// MPI_THREAD_SERIALIZED when create() initializes it; a program that initialized MPI itself with
// less must use the transport from its MPI thread.  Either way the program must not make MPI
// calls from another thread while an operation of the group runs, unless it asked for
// MPI_THREAD_MULTIPLE.
//
// Lifetime: when create() initialized MPI, MPI_Finalize runs at exit (std::atexit) unless the
// program finalized MPI itself.  A transport used after MPI_Finalize throws dc::Error, and one
// destroyed after it makes no MPI calls.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dc/transport.hpp"

namespace pytorch_exec::dc::mpi {

// All `size` ranks of the group call this together.  `allgather(mine)` returns every rank's
// string in rank order (through PMIx or the bootstrap's store); it tells each rank where the others
// are in MPI_COMM_WORLD.  Initializes MPI if the program has not.  Throws dc::Error with a sentence
// when MPI cannot be used (e.g. every rank is an MPI singleton, or MPI_COMM_WORLD is not the
// group), on every rank alike.  No deadline: the allgather has its own timeout, and a rank that
// checked one after it could leave the others in MPI_Comm_dup for ever.
using Allgather = std::function<std::vector<std::string>(const std::string&)>;
std::unique_ptr<Transport> create(int rank, int size, const Allgather& allgather);

}  // namespace pytorch_exec::dc::mpi
