// The DataChannel's job token and the challenge-response proofs of the key-value store and the
// tcp transport.
//
// The token is a secret shared by the ranks of one job: pytorch_exec gives every generation a
// fresh one in the workers' environment (PYTORCH_DC_TOKEN); with a plain env:// launch the user
// may set it.  Every store and transport connection proves knowledge of it against a nonce the
// other side chose (HMAC-SHA256 over length-prefixed parts), so a stranger cannot read or write
// the store or join the mesh, and a recorded exchange cannot be replayed.  Without a token the
// same exchange runs with an empty key: it then proves nothing, and the listeners bind to the
// interface facing MASTER_ADDR only (socket.hpp).
//
// Threads: pure functions, callable from any thread.
#pragma once

#include <cstddef>
#include <string>

namespace pytorch_exec::dc {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;

// PYTORCH_DC_TOKEN, or "" when it is unset.
std::string job_token();
// Fresh random bytes from the OS.  Throws Error if there are none.
std::string random_bytes(size_t n);
// HMAC-SHA256(key, label | a | b | c), each part length-prefixed.
std::string proof(const std::string& key, const std::string& label, const std::string& a,
                  const std::string& b, const std::string& c = "");
// Constant-time comparison of a received proof with the expected one.
bool proof_matches(const std::string& expected, const std::string& received);

}  // namespace pytorch_exec::dc
