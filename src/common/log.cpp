#include "common/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <mutex>

#include "common/error.hpp"
#include "common/strings.hpp"

namespace pe {
namespace {

std::mutex g_mutex;
std::string g_pattern = "[%H:%M:%S.%e] pytorch_exec %n %l: %v";

spdlog::level::level_enum parse_level(const std::string& s) {
  auto lvl = spdlog::level::from_str(s);
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (lvl == spdlog::level::off && s != "off")
    throw UsageError("PYTORCH_EXEC_LOG: unknown level '" + s +
                     "' (use trace, debug, info, warn, error, critical or off)");
  return lvl;
}

std::shared_ptr<spdlog::logger> make_logger(const std::string& name) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto l = std::make_shared<spdlog::logger>(name, sink);
  l->set_pattern(g_pattern);
  l->set_level(spdlog::level::warn);
  spdlog::register_logger(l);
  return l;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger(const char* subsystem) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto l = spdlog::get(subsystem);
  return l ? l : make_logger(subsystem);
}

void init_logging(int verbosity, const std::string& spec, const std::string& host) {
  spdlog::level::level_enum base = spdlog::level::warn;
  if (verbosity < 0) base = spdlog::level::err;  // -q
  if (verbosity == 1) base = spdlog::level::info;
  if (verbosity == 2) base = spdlog::level::debug;
  if (verbosity >= 3) base = spdlog::level::trace;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_pattern = "[%H:%M:%S.%e] pytorch_exec@" + host + " %n %l: %v";
  }
  for (const char* name : kLogSubsystems) {
    auto l = logger(name);
    l->set_pattern(g_pattern);
    l->set_level(base);
  }
  for (const auto& item : split(spec, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      auto lvl = parse_level(item);
      for (const char* name : kLogSubsystems) logger(name)->set_level(lvl);
      continue;
    }
    std::string name = item.substr(0, eq);
    bool known = false;
    for (const char* n : kLogSubsystems) known = known || name == n;
    if (!known) throw UsageError("PYTORCH_EXEC_LOG: unknown subsystem '" + name + "'");
    logger(name.c_str())->set_level(parse_level(item.substr(eq + 1)));
  }
}

void flush_and_exit(int status) {
  std::cout.flush();
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  std::fflush(nullptr);
  ::_exit(status);
}

}  // namespace pe
