// pytorch_execd: the per-node daemon of a multi-node pytorch_exec job.  It is started by
// pytorch_exec (through srun, ssh or a --launch-agent command), never by hand:
//   pytorch_execd --connect ADDR:PORT[,ADDR:PORT...] (--node NAME | --slurm) [--secret-stdin]
// The job's secret comes from PYTORCH_EXEC_SECRET (removed from the environment at once), from
// the first line of standard input (--secret-stdin), or from a 0600 file (--secret-file).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "exec/ctrl/messages.hpp"
#include "exec/daemon/daemon.hpp"
#include "exec/daemon/execd_options.hpp"
#include "pmix_rdzv/pmix_server.hpp"
#include "pytorch_exec/version.h"

namespace {

std::string read_secret_line(std::istream& in, const std::string& from) {
  std::string line;
  if (!std::getline(in, line)) throw pe::UsageError("no secret on " + from);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

// PYTORCH_EXEC_SECRET (wiped and removed from the environment at once), else --secret-stdin's
// line, else --secret-file's.
std::string read_secret(const pe::ExecdRawOptions& raw) {
  if (const char* s = std::getenv("PYTORCH_EXEC_SECRET")) {
    std::string hex = s;
    std::memset(const_cast<char*>(s), 0, hex.size());
    ::unsetenv("PYTORCH_EXEC_SECRET");
    return hex;
  }
  if (raw.secret_stdin) return read_secret_line(std::cin, "standard input");
  if (raw.secret_file && !raw.secret_file->empty()) return pe::auth::secret_from_file(*raw.secret_file);
  throw pe::UsageError("no job secret (PYTORCH_EXEC_SECRET, --secret-stdin or --secret-file)");
}

// The options; nullopt when --help or --version was answered.
std::optional<pe::DaemonOptions> parse(int argc, char** argv) {
  pe::ExecdRawOptions raw = pe::parse_execd_command_line(argc, argv);
  if (raw.help) {
    std::cout << pe::execd_help_text();
    return std::nullopt;
  }
  if (raw.version) {
    std::cout << "pytorch_execd " << PYTORCH_EXEC_VERSION_STRING << " (control protocol "
              << pe::ctrl::kProtocolVersion << ")\n";
    return std::nullopt;
  }
  const char* slurmd_node = std::getenv("SLURMD_NODENAME");
  pe::DaemonOptions o = pe::validate_execd_options(
      raw, slurmd_node && *slurmd_node ? slurmd_node : pe::local_hostname());
  o.secret = pe::auth::from_hex(read_secret(raw));
  if (o.secret.size() != pe::auth::kSecretBytes)
    throw pe::UsageError("the job secret has the wrong length");
  return o;
}

int fail(const std::string& node, const std::string& msg, int status) {
  std::string s =
      "pytorch_execd" + (node.empty() ? std::string() : " (" + node + ")") + ": " + msg + "\n";
  pe::write_all(2, s.data(), s.size());
  return status;
}

int run_main(int argc, char** argv) {
  std::string node;
  try {
    pe::open_closed_stdio();
    const char* spec = std::getenv("PYTORCH_EXEC_LOG");
    pe::init_logging(0, spec ? spec : "", pe::local_hostname());
    pe::raise_fd_limit();
    std::optional<pe::DaemonOptions> o = parse(argc, argv);
    if (!o) return 0;
    node = o->node;
    // The process ends with the daemon: its PMIx server is left running, and main() ends the
    // process with _exit.
    pe::pmix::PmixServer::end_with_process();
    pe::Daemon d(std::move(*o));
    return d.run();
  } catch (const pe::UsageError& e) {
    return fail(node, e.what(), 2);
  } catch (const std::exception& e) {
    return fail(node, e.what(), 1);
  } catch (...) {
    return fail(node, "unexpected internal error", 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rc = run_main(argc, argv);
  // PMIx's threads still run (PmixServer::end_with_process): no static destructors beside them.
  if (pe::pmix::PmixServer::ends_with_process()) pe::flush_and_exit(rc);
  return rc;
}
