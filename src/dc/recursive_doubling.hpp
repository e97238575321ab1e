// Recursive doubling allreduce for small messages: log2(n) exchanges of the whole buffer with
// partners at doubling distances (ranks beyond the largest power of two first fold into a
// neighbour and get the result back at the end).  Each message carries the call header, so a
// mismatch is caught without an extra round trip.  The result is bitwise the same on every
// rank.
#pragma once

#include "dc/comm.hpp"

namespace pytorch_exec::dc {

void recursive_doubling_allreduce(const Comm& c, void* buf, size_t count, DType t, Op op,
                                  const CallHeader& h, const Deadline& d);

}  // namespace pytorch_exec::dc
