// Broadcast and barrier over a Comm.  Broadcast: a binomial tree for small buffers, a pipelined
// chain (chunks forwarded as they arrive) for large ones.  Barrier: dissemination, log2(n)
// rounds of a header-sized message.
#pragma once

#include "dc/comm.hpp"

namespace pytorch_exec::dc {

void tree_broadcast(const Comm& c, void* buf, size_t bytes, int root, const CallHeader& h,
                    const Deadline& d);
void dissemination_barrier(const Comm& c, const CallHeader& h, const Deadline& d);

}  // namespace pytorch_exec::dc
