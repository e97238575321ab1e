// Error hierarchy used inside pytorch_exec.  main() catches these and turns them into one
// sentence and an exit status; nothing a user can cause ends in a stack trace or an abort.
#pragma once

#include <stdexcept>
#include <string>

namespace pe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A mistake on the command line or in the user's input: exit status 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

// The program to run cannot be run.  exit_status() is 127 (not found) or 126 (not executable),
// as a shell would report it.
class ProgramError : public Error {
 public:
  ProgramError(const std::string& what, int exit_status) : Error(what), status_(exit_status) {}
  int exit_status() const { return status_; }

 private:
  int status_;
};

// A failed system call; what() carries the call, the object and strerror(errno).
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int err);
  int code() const { return code_; }

 private:
  int code_;
};

// A peer (worker pipe, daemon connection) went away.
class IoError : public Error {
 public:
  explicit IoError(const std::string& what) : Error(what) {}
};

class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

// Throws SystemError("<what>: <strerror(errno)>") when `cond` is false.  Use right after the call
// so errno still belongs to it.
#define PE_CHECK_ERRNO(cond, what)                       \
  do {                                                   \
    if (!(cond)) throw ::pe::SystemError((what), errno); \
  } while (0)

}  // namespace pe
