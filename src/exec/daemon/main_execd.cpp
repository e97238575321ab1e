// pytorch_execd: the per-node daemon of a multi-node pytorch_exec job.  It is started by
// pytorch_exec (through srun, ssh or a --launch-agent command), never by hand:
//   pytorch_execd --connect ADDR:PORT[,ADDR:PORT...] (--node NAME | --slurm) [--secret-stdin]
// The job's secret comes from PYTORCH_EXEC_SECRET (removed from the environment at once), from
// the first line of standard input (--secret-stdin), or from a 0600 file (--secret-file).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "common/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/strings.hpp"
#include "exec/daemon/daemon.hpp"
#include "pytorch_exec/version.h"

namespace {

constexpr const char* kUsage =
    "usage: pytorch_execd --connect ADDR:PORT[,ADDR:PORT...] (--node NAME | --slurm)\n"
    "                     [--secret-stdin | --secret-file FILE] [--connect-timeout SECONDS]\n"
    "pytorch_execd is started by pytorch_exec on every node of a multi-node job; see pytorch_exec(1).\n";

std::string read_secret_line(std::istream& in, const std::string& from) {
  std::string line;
  if (!std::getline(in, line)) throw pe::UsageError("no secret on " + from);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string secret_from_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw pe::SystemError("secret file " + path, errno);
  if ((st.st_mode & 077) != 0) throw pe::UsageError("secret file " + path + " is readable by others (needs mode 0600)");
  std::ifstream f(path);
  return read_secret_line(f, path);
}

pe::DaemonOptions parse(int argc, char** argv) {
  pe::DaemonOptions o;
  std::string connect, secret_hex, secret_file;
  bool secret_stdin = false, slurm = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw pe::UsageError("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--connect") connect = value();
    else if (a == "--node") o.node = value();
    else if (a == "--slurm") slurm = true;
    else if (a == "--secret-stdin") secret_stdin = true;
    else if (a == "--secret-file") secret_file = value();
    else if (a == "--connect-timeout") {
      std::string v = value();
      char* end = nullptr;
      o.connect_timeout = std::strtod(v.c_str(), &end);
      if (!end || *end || !(o.connect_timeout > 0 && o.connect_timeout <= 3600))
        throw pe::UsageError("--connect-timeout: '" + v + "' is not a number of seconds in (0, 3600]");
    } else if (a == "--version") {
      std::cout << "pytorch_execd " << PYTORCH_EXEC_VERSION_STRING << "\n";
      std::exit(0);
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw pe::UsageError("unknown argument '" + a + "'");
    }
  }
  if (connect.empty()) throw pe::UsageError("--connect is required");
  for (const auto& item : pe::split(connect, ',')) {
    auto colon = item.rfind(':');
    int port = colon == std::string::npos ? 0 : std::atoi(item.c_str() + colon + 1);
    if (colon == std::string::npos || colon == 0 || port <= 0 || port > 65535)
      throw pe::UsageError("--connect: '" + item + "' is not ADDR:PORT");
    o.connect.emplace_back(item.substr(0, colon), port);
  }
  if (slurm) {
    const char* n = std::getenv("SLURMD_NODENAME");
    o.node = n && *n ? n : pe::local_hostname();
  }
  if (o.node.empty()) throw pe::UsageError("--node NAME or --slurm is required");
  if (const char* s = std::getenv("PYTORCH_EXEC_SECRET")) {
    secret_hex = s;
    std::memset(const_cast<char*>(s), 0, secret_hex.size());
    ::unsetenv("PYTORCH_EXEC_SECRET");
  } else if (secret_stdin) {
    secret_hex = read_secret_line(std::cin, "standard input");
  } else if (!secret_file.empty()) {
    secret_hex = secret_from_file(secret_file);
  } else {
    throw pe::UsageError("no job secret (PYTORCH_EXEC_SECRET, --secret-stdin or --secret-file)");
  }
  o.secret = pe::auth::from_hex(secret_hex);
  if (o.secret.size() != pe::auth::kSecretBytes) throw pe::UsageError("the job secret has the wrong length");
  return o;
}

int fail(const std::string& node, const std::string& msg, int status) {
  std::string s = "pytorch_execd" + (node.empty() ? std::string() : " (" + node + ")") + ": " + msg + "\n";
  pe::write_all(2, s.data(), s.size());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::string node;
  try {
    const char* spec = std::getenv("PYTORCH_EXEC_LOG");
    pe::init_logging(0, spec ? spec : "", pe::local_hostname());
    pe::DaemonOptions o = parse(argc, argv);
    node = o.node;
    pe::Daemon d(std::move(o));
    return d.run();
  } catch (const pe::UsageError& e) {
    return fail(node, e.what(), 2);
  } catch (const std::exception& e) {
    return fail(node, e.what(), 1);
  } catch (...) {
    return fail(node, "unexpected internal error", 1);
  }
}
