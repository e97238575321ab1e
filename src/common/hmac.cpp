#include "common/hmac.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdint>

namespace pe::crypto {

std::string hmac_parts(const std::string& key, std::initializer_list<const std::string*> parts) {
  std::string msg;
  for (const std::string* part : parts) {
    uint32_t n = static_cast<uint32_t>(part->size());
    msg.append(reinterpret_cast<const char*>(&n), sizeof n);
    msg += *part;
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len))
    return "";
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1) return "";
  return s;
}

bool equal_constant_time(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace pe::crypto
