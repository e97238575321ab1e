#include "common/auth.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <fstream>

#include "common/error.hpp"
#include "common/hmac.hpp"

namespace pe::auth {
namespace {

std::string hmac(const std::string& secret, const std::string& label, const std::string& a,
                 const std::string& b, const std::string& node_id) {
  std::string h = crypto::hmac_parts(secret, {&label, &a, &b, &node_id});
  if (h.empty()) throw Error(crypto::hmac_failure());
  return h;
}

}  // namespace

std::string random_bytes(size_t n) {
  std::string s = crypto::random_bytes(n);
  if (s.size() != n) throw Error("no random bytes available for the job secret");
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
  return crypto::equal_constant_time(expected, received);
}

std::string rdzv_key(const std::string& user_secret, const std::string& rdzv_id) {
  const std::string label = "pe-rdzv";
  std::string h = crypto::hmac_parts(user_secret, {&label, &rdzv_id});
  if (h.size() != kSecretBytes) throw Error(crypto::hmac_failure());
  return h;
}

std::string secret_from_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw SystemError("secret file " + path, errno);
  if ((st.st_mode & 077) != 0)
    throw UsageError("secret file " + path + " is readable by others (needs mode 0600)");
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) throw UsageError("no secret in " + path);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace pe::auth
