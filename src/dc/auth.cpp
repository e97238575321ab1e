#include "dc/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdint>
#include <cstdlib>

#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {

std::string job_token() {
  const char* v = std::getenv("PYTORCH_DC_TOKEN");
  return v ? v : "";
}

std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1)
    throw Error("no random bytes available for a DataChannel nonce");
  return s;
}

std::string proof(const std::string& key, const std::string& label, const std::string& a,
                  const std::string& b, const std::string& c) {
  std::string msg;
  for (const std::string* part : {&label, &a, &b, &c}) {
    uint32_t n = static_cast<uint32_t>(part->size());
    msg.append(reinterpret_cast<const char*>(&n), sizeof n);
    msg += *part;
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len))
    throw Error("HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char*>(out), len);
}

bool proof_matches(const std::string& expected, const std::string& received) {
  return expected.size() == received.size() &&
         CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

}  // namespace pytorch_exec::dc
