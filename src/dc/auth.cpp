#include "dc/auth.hpp"

#include <cstdlib>

#include "common/hmac.hpp"
#include "pytorch_exec/dc.hpp"

namespace pytorch_exec::dc {

std::string job_token() {
  const char* v = std::getenv("PYTORCH_DC_TOKEN");
  return v ? v : "";
}

std::string random_bytes(size_t n) {
  std::string s = pe::crypto::random_bytes(n);
  if (s.size() != n) throw Error("no random bytes available for a DataChannel nonce");
  return s;
}

std::string proof(const std::string& key, const std::string& label, const std::string& a,
                  const std::string& b, const std::string& c) {
  std::string h = pe::crypto::hmac_parts(key, {&label, &a, &b, &c});
  if (h.empty()) throw Error(pe::crypto::hmac_failure());
  return h;
}

bool proof_matches(const std::string& expected, const std::string& received) {
  return pe::crypto::equal_constant_time(expected, received);
}

}  // namespace pytorch_exec::dc
