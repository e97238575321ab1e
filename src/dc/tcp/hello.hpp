// The tcp transport's connection hello (set-up only, mesh.cpp).  On every connection:
//   acceptor -> connector  challenge (kNonceBytes random)
//   connector -> acceptor  hello: magic, its rank, nonce, proof(key, "pdc-tcp-hello", ...)
//   acceptor -> connector  proof(key, "pdc-tcp-reply", ...)
// where the key is the job token and the group's session number, and both proofs bind the
// challenge, the nonce and the two ranks: a stranger, a process of another group or a replayed
// hello fails.
//
// Threads: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pytorch_exec::dc::tcp {

inline constexpr size_t kHelloBytes = 8 + 32 + 32;

// The key both proofs use: PYTORCH_DC_TOKEN and the session.
std::string hello_key(uint64_t session);
// Rank `from`'s hello to rank `to`, answering `challenge`; `nonce` gets the nonce it carries.
std::string make_hello(const std::string& key, int from, int to, const std::string& challenge,
                       std::string& nonce);
// Checks a hello of kHelloBytes received by rank `me` of `size`, which sent `challenge`.  The
// sender's rank (higher than `me`), or -1 when the hello is not from a member of the group; then
// `reply` gets the acceptor's proof.
int check_hello(const std::string& key, const std::string& hello, int me, int size,
                const std::string& challenge, std::string& reply);
// The proof the acceptor `to` sends back to `from`.
std::string reply_proof(const std::string& key, int from, int to, const std::string& challenge,
                        const std::string& nonce);

}  // namespace pytorch_exec::dc::tcp
