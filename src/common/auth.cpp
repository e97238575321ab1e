#include "common/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/error.hpp"

namespace pe::auth {
namespace {

std::string hmac(const std::string& secret, const std::string& label, const std::string& a,
                 const std::string& b, const std::string& node_id) {
  // Length-prefix every part so that no two different inputs concatenate to the same message.
  std::string msg;
  for (const std::string* part : {&label, &a, &b, &node_id}) {
    uint32_t n = static_cast<uint32_t>(part->size());
    msg.append(reinterpret_cast<const char*>(&n), sizeof n);
    msg += *part;
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len))
    throw Error("HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char*>(out), len);
}

}  // namespace

std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1)
    throw Error("no random bytes available for the job secret");
  return s;
}

std::string new_secret() { return random_bytes(kSecretBytes); }

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  auto val = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2) throw Error("malformed job secret (odd number of hex digits)");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = val(hex[i]), lo = val(hex[i + 1]);
    if (hi < 0 || lo < 0) throw Error("malformed job secret (not hex)");
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::string daemon_proof(const std::string& secret, const std::string& nonce_f,
                         const std::string& nonce_d, const std::string& node_id) {
  return hmac(secret, "pe-daemon", nonce_f, nonce_d, node_id);
}

std::string frontend_proof(const std::string& secret, const std::string& nonce_f,
                           const std::string& nonce_d, const std::string& node_id) {
  return hmac(secret, "pe-frontend", nonce_d, nonce_f, node_id);
}

bool proof_matches(const std::string& expected, const std::string& received) {
  return expected.size() == received.size() &&
         CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

}  // namespace pe::auth
