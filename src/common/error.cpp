#include "common/error.hpp"

#include <cstring>

namespace pe {

SystemError::SystemError(const std::string& what, int err)
    : Error(what + ": " + std::strerror(err)), code_(err) {}

}  // namespace pe
