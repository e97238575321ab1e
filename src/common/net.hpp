// Small socket helpers.
#pragma once

#include <string>

namespace pe {

// A TCP port that is free on `addr` right now (bind to port 0, read it back, close).  The
// program that is given the port binds it a moment later, as torchrun's workers do.
int find_free_port(const std::string& addr);

std::string local_hostname();

}  // namespace pe
