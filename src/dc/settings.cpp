#include <config.h>

#include "dc/settings.hpp"

#include <cstdlib>
#include <optional>

#include "dc/bootstrap.hpp"
#include "dc/socket.hpp"

namespace pytorch_exec::dc {
namespace {

// The transport that `source` (an option or a variable) names for a level; nullopt when unset.
std::optional<TransportKind> transport(const std::string& name, const std::string& source,
                                       bool inside_node) {
  if (name.empty()) return std::nullopt;
  auto fail = [&](const std::string& why) {
    return Error(source + "=" + name + ": the transport '" + name + "' " + why + "; " + source +
                 " takes " + transport_names(inside_node));
  };
  auto k = transport_kind(name);
  if (!k) throw fail("is unknown");
  if (!transport_built(*k)) throw fail("is not available: this libpytorch_dc was built without it");
  if (!inside_node && !transport_point_to_point(*k)) throw fail("works only inside a node");
  return k;
}

std::optional<TransportKind> env_transport(const char* name, bool inside_node) {
  return transport(env_or(name, ""), name, inside_node);
}

// PYTORCH_DC_TRANSPORT names both levels; "shm" means shm inside and tcp across.
void resolve_transports(const Options& o, Settings& s) {
  auto both = env_transport("PYTORCH_DC_TRANSPORT", true);
  auto intra = env_transport("PYTORCH_DC_INTRA", true);
  auto inter = env_transport("PYTORCH_DC_INTER", false);
  auto o_intra = transport(o.intra, "Options::intra", true);
  auto o_inter = transport(o.inter, "Options::inter", false);
  s.intra = o_intra ? *o_intra : intra ? *intra : both.value_or(TransportKind::Shm);
  if (both == TransportKind::Shm) both = TransportKind::Tcp;
  s.inter = o_inter ? *o_inter : inter ? *inter : both.value_or(TransportKind::Tcp);
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
  resolve_transports(o, s);
  s.timeout = o.timeout > 0 ? o.timeout : env_number("PYTORCH_DC_TIMEOUT", 300);
  if (s.timeout <= 0) throw Error("PYTORCH_DC_TIMEOUT must be more than 0 seconds");
  s.small_bytes = o.small_bytes > 0 ? o.small_bytes
                                    : static_cast<size_t>(env_number("PYTORCH_DC_SMALL", 32 << 10));
  s.hierarchical = flag(o.hierarchical, "PYTORCH_DC_HIERARCHICAL", true);
  s.bf16_wire = flag(o.bf16_wire, "PYTORCH_DC_BF16_WIRE", false);
  if (!env_or("PYTORCH_DC_SHM_BYTES", "").empty()) {
    s.shm_bytes = static_cast<size_t>(env_number("PYTORCH_DC_SHM_BYTES", 0));
    if (s.shm_bytes < 4096) throw Error("PYTORCH_DC_SHM_BYTES must be at least 4096");
  }
  std::string threads = env_or("PYTORCH_DC_SHM_THREADS", "auto");
  if (threads != "auto") {
    double v = env_number("PYTORCH_DC_SHM_THREADS", 0);
    if (!(v >= 1 && v <= 16) || v != static_cast<int>(v))
      throw Error("PYTORCH_DC_SHM_THREADS=" + threads + " is not auto or a whole number from 1 to 16");
    s.shm_threads = static_cast<int>(v);
  }
  s.pipeline_bytes = static_cast<size_t>(env_number("PYTORCH_DC_PIPELINE_BYTES", 0));
  s.tcp_congestion = env_or("PYTORCH_DC_TCP_CONGESTION", "auto");
  check_congestion_name(s.tcp_congestion, "PYTORCH_DC_TCP_CONGESTION");
  return s;
}

}  // namespace pytorch_exec::dc
