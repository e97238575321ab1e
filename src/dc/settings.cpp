#include <config.h>

#include "dc/settings.hpp"

#include <cstdlib>

#include "dc/bootstrap.hpp"

namespace pytorch_exec::dc {
namespace {

bool have_mpi() {
#ifdef HAVE_MPI
  return true;
#else
  return false;
#endif
}

void check_transport(const std::string& t, const std::string& level, bool shm_ok) {
  if (t == "tcp" || (t == "shm" && shm_ok)) return;
  if (t == "mpi") {
    if (!have_mpi()) throw Error(level + " transport 'mpi': this libpytorch_dc was built without MPI");
    return;
  }
  throw Error(level + " transport '" + t + "' is unknown (" + (shm_ok ? "shm, tcp or mpi" : "tcp or mpi") + ")");
}

int flag(int opt, const char* name, bool def) {
  if (opt >= 0) return opt != 0;
  std::string v = env_or(name, "");
  if (v.empty()) return def;
  if (v == "1" || v == "yes" || v == "true" || v == "on") return 1;
  if (v == "0" || v == "no" || v == "false" || v == "off") return 0;
  throw Error(std::string(name) + "=" + v + ": expected 1 or 0");
}

}  // namespace

Settings resolve_settings(const Options& o) {
  Settings s;
  std::string both = env_or("PYTORCH_DC_TRANSPORT", "");
  s.intra = !o.intra.empty() ? o.intra : env_or("PYTORCH_DC_INTRA", both.empty() ? "shm" : both);
  s.inter = !o.inter.empty() ? o.inter : env_or("PYTORCH_DC_INTER", !both.empty() && both != "shm" ? both : "tcp");
  check_transport(s.intra, "intra-node", true);
  check_transport(s.inter, "inter-node", false);
  s.timeout = o.timeout > 0 ? o.timeout : env_number("PYTORCH_DC_TIMEOUT", 300);
  if (s.timeout <= 0) throw Error("PYTORCH_DC_TIMEOUT must be more than 0 seconds");
  s.small_bytes = o.small_bytes > 0 ? o.small_bytes : static_cast<size_t>(env_number("PYTORCH_DC_SMALL", 32 << 10));
  s.hierarchical = flag(o.hierarchical, "PYTORCH_DC_HIERARCHICAL", true);
  s.bf16_wire = flag(o.bf16_wire, "PYTORCH_DC_BF16_WIRE", false);
  if (!env_or("PYTORCH_DC_SHM_BYTES", "").empty()) {
    s.shm_bytes = static_cast<size_t>(env_number("PYTORCH_DC_SHM_BYTES", 0));
    if (s.shm_bytes < 4096) throw Error("PYTORCH_DC_SHM_BYTES must be at least 4096");
  }
  return s;
}

}  // namespace pytorch_exec::dc
