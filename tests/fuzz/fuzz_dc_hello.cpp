// libFuzzer target for the tcp transport's hello (src/dc/tcp/hello.cpp).  The input is a hello
// as a stranger would send it (its first two bytes pick the receiving rank and the group size):
// check_hello must refuse it, since it cannot carry a valid proof for a fresh challenge, without
// reading beyond it.  A hello made with the right key must pass, and one with another key fail.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dc/auth.hpp"
#include "dc/tcp/hello.hpp"

using namespace pytorch_exec::dc;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  int size_g = 2 + data[0] % 64, me = data[1] % size_g;
  std::string key = "token/42", challenge = random_bytes(kNonceBytes), reply;
  std::string hello(reinterpret_cast<const char*>(data) + 2, size - 2);
  if (tcp::check_hello(key, hello, me, size_g, challenge, reply) >= 0) std::abort();
  if (me + 1 < size_g) {
    std::string nonce, mine = tcp::make_hello(key, me + 1, me, challenge, nonce);
    if (tcp::check_hello(key, mine, me, size_g, challenge, reply) != me + 1) std::abort();
    if (tcp::check_hello("token/43", mine, me, size_g, challenge, reply) >= 0) std::abort();
  }
  return 0;
}
