// The options of a process group, resolved: explicit Options first, then the PYTORCH_DC_*
// environment variables, then the defaults.  Pure, so that it is unit-tested.
#pragma once

#include <string>

#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {

struct Settings {
  std::string intra = "shm";  // shm, tcp or mpi
  std::string inter = "tcp";  // tcp or mpi
  double timeout = 300;
  size_t small_bytes = 32 << 10;
  bool hierarchical = true;
  bool bf16_wire = false;
  size_t shm_bytes = 0;  // PYTORCH_DC_SHM_BYTES; 0: by layout (ProcessGroup::Impl::shm_bytes)

  bool uses(const std::string& transport) const { return intra == transport || inter == transport; }
};

// Throws Error naming the option or variable that is wrong.
Settings resolve_settings(const Options& o);

}  // namespace pytorch_exec::dc
