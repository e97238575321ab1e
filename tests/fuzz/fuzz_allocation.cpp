// libFuzzer target for the allocation parsers: SLURM hostlists and task counts, Open MPI
// hostfiles and -H lists.  The first byte picks the parser.  A UsageError is a correct answer
// to bad input; anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/error.hpp"
#include "exec/frontend/allocation.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        for (const auto& h : pe::expand_hostlist(text))
          if (h.empty()) std::abort();  // an expanded host is never empty
        break;
      case 1:
        for (int c : pe::expand_counts("SLURM_TASKS_PER_NODE", text))
          if (c < 0) std::abort();
        break;
      case 2: {
        std::istringstream in(text);
        for (const auto& h : pe::parse_hostfile(in, "fuzz"))
          if (h.host.empty() || h.slots < 0) std::abort();
        break;
      }
      case 3:
        for (const auto& h : pe::parse_host_list(text))
          if (h.host.empty() || h.slots < 0) std::abort();
        break;
    }
  } catch (const pe::UsageError&) {
  }
  return 0;
}
