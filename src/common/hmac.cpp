#include <config.h>

#include "common/hmac.hpp"

#include <dlfcn.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/opensslv.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace pe::crypto {
namespace {

#define PE_STR2(x) #x
#define PE_STR(x) PE_STR2(x)
#if defined(OPENSSL_VERSION_MAJOR) && OPENSSL_VERSION_MAJOR >= 3
constexpr const char* kLibcrypto = "libcrypto.so." PE_STR(OPENSSL_VERSION_MAJOR);
#else
constexpr const char* kLibcrypto = "libcrypto.so.1.1";
#endif

// OpenSSL's libcrypto, loaded when a key is first used: a job on one machine authenticates
// nothing, and loading libcrypto at start-up cost every launch about 1 ms.
struct Libcrypto {
  decltype(&::EVP_sha256) sha256 = nullptr;
  decltype(&::HMAC) hmac = nullptr;
  std::string error;  // why it is not there
};

const Libcrypto& libcrypto() {
  static const Libcrypto lib = [] {
    Libcrypto l;
    // Where configure found it first (a --with-openssl prefix), else the loader's search.
    const std::string found = std::string(PE_OPENSSL_LIBDIR) + "/" + kLibcrypto;
    void* h = *PE_OPENSSL_LIBDIR ? ::dlopen(found.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!h) h = ::dlopen(kLibcrypto, RTLD_NOW | RTLD_LOCAL);
    if (h) {
      l.sha256 = reinterpret_cast<decltype(l.sha256)>(::dlsym(h, "EVP_sha256"));
      l.hmac = reinterpret_cast<decltype(l.hmac)>(::dlsym(h, "HMAC"));
    }
    if (!l.sha256 || !l.hmac) {
      const char* why = ::dlerror();
      l.error =
          std::string("cannot load OpenSSL's ") + kLibcrypto + (why ? ": " : "") + (why ? why : "");
      l.sha256 = nullptr;
      l.hmac = nullptr;
    }
    return l;
  }();
  return lib;
}

}  // namespace

std::string hmac_parts(const std::string& key, std::initializer_list<const std::string*> parts) {
  const Libcrypto& lib = libcrypto();
  if (!lib.hmac) return "";
  std::string msg;
  for (const std::string* part : parts) {
    uint32_t n = static_cast<uint32_t>(part->size());
    msg.append(reinterpret_cast<const char*>(&n), sizeof n);
    msg += *part;
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!lib.hmac(lib.sha256(), key.data(), static_cast<int>(key.size()),
                reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len))
    return "";
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string hmac_failure() {
  const std::string& why = libcrypto().error;
  return why.empty() ? "HMAC-SHA256 failed" : "HMAC-SHA256 failed: " + why;
}

// The kernel's generator (getrandom, by its system call: glibc has the wrapper since 2.25), which
// OpenSSL's own seeds from.
std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  size_t got = 0;
  while (got < n) {
    long r = ::syscall(SYS_getrandom, s.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return "";
    got += static_cast<size_t>(r);
  }
  return s;
}

bool equal_constant_time(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  // Every byte compared, whatever differs where (volatile: not cut short by the compiler).
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace pe::crypto
