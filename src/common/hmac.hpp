// The cryptographic pieces both authentications use (the control plane's, common/auth.hpp, and
// the DataChannel's, dc/auth.hpp): HMAC-SHA256 over length-prefixed parts, random bytes, and a
// constant-time comparison.  Compiled into libpe_common and into libpytorch_dc (which is
// installed on its own), so it depends on OpenSSL's libcrypto only (loaded at run time, when a
// key is first used) and reports failure by
// returning "" instead of throwing one library's error type.
//
// Threads: pure functions, callable from any thread.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>

namespace pe::crypto {

// HMAC-SHA256(key, |p1| p1 |p2| p2 ...): every part is prefixed with its 32-bit length, so that
// no two different lists of parts make the same message.  "" if OpenSSL fails or its libcrypto
// cannot be loaded (it is loaded at the first call).
std::string hmac_parts(const std::string& key, std::initializer_list<const std::string*> parts);
// The sentence for an hmac_parts that returned "": which library could not be loaded, if that
// was it.
std::string hmac_failure();
// `n` random bytes from the OS; "" if there are none.
std::string random_bytes(size_t n);
// a == b, in time that depends on the length only.
bool equal_constant_time(const std::string& a, const std::string& b);

}  // namespace pe::crypto
