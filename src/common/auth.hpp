// Mutual challenge-response authentication of control-plane connections with a per-job secret.
//
// The front end creates a random 32-byte secret per job; daemons get it through their
// environment or a 0600 file, never a command line or a log.  On every connection:
//   front end -> daemon   challenge: nonce_f (32 random bytes)
//   daemon -> front end   hello: node id, nonce_d, HMAC-SHA256(secret, "pe-daemon" | nonce_f |
//   nonce_d | node id) front end -> daemon   welcome: HMAC-SHA256(secret, "pe-frontend" | nonce_d |
//   nonce_f | node id)
// Each side proves it knows the secret against a nonce the other chose, so a recorded exchange
// cannot be replayed, and the node id is bound to the proof.  Comparisons are constant-time.
#pragma once

#include <string>

namespace pe::auth {

inline constexpr size_t kSecretBytes = 32;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256

// Fresh random bytes from the OS (secrets and nonces).  Throws pe::Error if there are none.
std::string random_bytes(size_t n);
std::string new_secret();
// Hex form for the environment / file; from_hex throws pe::Error on malformed input.
std::string to_hex(const std::string& bytes);
std::string from_hex(const std::string& hex);

std::string daemon_proof(const std::string& secret, const std::string& nonce_f,
                         const std::string& nonce_d, const std::string& node_id);
std::string frontend_proof(const std::string& secret, const std::string& nonce_f,
                           const std::string& nonce_d, const std::string& node_id);
// Constant-time check of a received proof.
bool proof_matches(const std::string& expected, const std::string& received);

// Join mode (pytorch_exec --rdzv-endpoint): the control plane's key for a secret the user chose
// (any length, any bytes) and the rendezvous id: HMAC-SHA256(secret, "pe-rdzv" | rdzv_id), so
// that two jobs with one secret cannot join each other, and a node with the wrong secret or id
// fails the handshake.  kSecretBytes long.
std::string rdzv_key(const std::string& user_secret, const std::string& rdzv_id);

// The first line of a secret file (trailing CR and blanks dropped).  Throws SystemError when it
// cannot be read, UsageError when it is readable by group or others (0600 needed) or empty.
std::string secret_from_file(const std::string& path);

}  // namespace pe::auth
