#include "dc/tcp/hello.hpp"

#include <cstring>

#include "dc/auth.hpp"

namespace pytorch_exec::dc::tcp {
namespace {

constexpr uint32_t kMagic = 0x32636470;  // "pdc2"

std::string ranks(int from, int to) { return std::to_string(from) + ">" + std::to_string(to); }

}  // namespace

std::string hello_key(uint64_t session) { return job_token() + "/" + std::to_string(session); }

std::string make_hello(const std::string& key, int from, int to, const std::string& challenge,
                       std::string& nonce) {
  nonce = random_bytes(kNonceBytes);
  std::string h(8, '\0');
  uint32_t head[2] = {kMagic, static_cast<uint32_t>(from)};
  std::memcpy(h.data(), head, sizeof head);
  return h + nonce + proof(key, "pdc-tcp-hello", challenge, nonce, ranks(from, to));
}

std::string reply_proof(const std::string& key, int from, int to, const std::string& challenge,
                        const std::string& nonce) {
  return proof(key, "pdc-tcp-reply", challenge, nonce, ranks(from, to));
}

int check_hello(const std::string& key, const std::string& hello, int me, int size,
                const std::string& challenge, std::string& reply) {
  if (hello.size() != kHelloBytes) return -1;
  uint32_t head[2];
  std::memcpy(head, hello.data(), sizeof head);
  if (head[0] != kMagic || head[1] <= static_cast<uint32_t>(me) ||
      head[1] >= static_cast<uint32_t>(size))
    return -1;
  int from = static_cast<int>(head[1]);
  std::string nonce = hello.substr(8, kNonceBytes), got = hello.substr(8 + kNonceBytes);
  if (!proof_matches(proof(key, "pdc-tcp-hello", challenge, nonce, ranks(from, me)), got))
    return -1;
  reply = reply_proof(key, from, me, challenge, nonce);
  return from;
}

}  // namespace pytorch_exec::dc::tcp
