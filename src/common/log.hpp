// Logging: one named spdlog logger per subsystem, created in one place (init_logging).
//
// Level: warn by default; -v gives info, -vv debug, -vvv trace.  PYTORCH_EXEC_LOG overrides per
// subsystem, e.g. "debug" or "info,agent=trace,stdio=off".  All loggers write to stderr with a
// pattern that carries the host and, in a worker-facing process, the rank.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace pe {

// The subsystems that have a logger.
inline constexpr const char* kLogSubsystems[] = {"exec", "agent", "stdio", "pmix",
                                                 "rdzv", "topo",  "ctrl"};

// Creates every logger.  `verbosity` counts -v flags (-1: -q, errors only).  `spec` is
// PYTORCH_EXEC_LOG (may be empty); a malformed spec throws UsageError.  Safe to call more than
// once (levels are reset).
void init_logging(int verbosity, const std::string& spec, const std::string& host);

// The logger of a subsystem; init_logging() need not have run (a default one is created).
std::shared_ptr<spdlog::logger> logger(const char* subsystem);
// Writes out std::cout, the loggers and C's streams, then ends the process with _exit(status)
// (no static destructors: where threads of a library still run, pmix::PmixServer).
[[noreturn]] void flush_and_exit(int status);

}  // namespace pe
