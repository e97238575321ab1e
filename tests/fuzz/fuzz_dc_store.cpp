// libFuzzer target for the DataChannel store's protocol (src/dc/store.cpp).  The input is parsed
// as a sequence of requests by parse_store_request (sizes and limits checked against what it
// read), and the same bytes are sent, after the token exchange, to a real store server in this
// process, in pieces whose sizes come from the input.  A crash, a sanitizer report or a server
// that stops answering is a bug; the server dropping the connection is the correct answer to
// garbage.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dc/auth.hpp"
#include "dc/socket.hpp"
#include "dc/store.hpp"

using namespace pytorch_exec::dc;

namespace {

void parse_all(const char* p, size_t n) {
  StoreRequest r;
  for (size_t pos = 0; pos < n;) {
    long used = parse_store_request(p + pos, n - pos, r);
    if (used <= 0) return;
    if (static_cast<size_t>(used) > n - pos || r.key.size() > kStoreMaxKey ||
        r.value.size() > kStoreMaxValue)
      std::abort();
    pos += static_cast<size_t>(used);
  }
}

// A client of the server that proves the (empty) token; -1 if the server refused.
int client(int port) {
  int fd = connect_until("127.0.0.1", port, Deadline::after(5, "fuzz"), "fuzz");
  std::string nonce_s(kNonceBytes, '\0'), nonce_c(kNonceBytes, 'c'), theirs(kProofBytes, '\0');
  auto d = Deadline::after(5, "fuzz");
  io_exact(fd, nonce_s.data(), kNonceBytes, false, d, "store", "fuzz");
  std::string mine = nonce_c + proof("", "pdc-store-client", nonce_s, nonce_c);
  io_exact(fd, mine.data(), mine.size(), true, d, "store", "fuzz");
  io_exact(fd, theirs.data(), kProofBytes, false, d, "store", "fuzz");
  return fd;
}

}  // namespace

// OpenSSL's per-thread random state of the server thread, which still runs at exit.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcrypto.so\n"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int port = 0;
  static auto server = serve_tcp_store(0, "127.0.0.1", &port);
  const char* p = reinterpret_cast<const char*>(data);
  parse_all(p, size);
  int fd = client(port);
  for (size_t pos = 0; pos < size;) {
    size_t piece = 1 + static_cast<unsigned char>(p[pos]) % 256;
    if (piece > size - pos) piece = size - pos;
    if (::send(fd, p + pos, piece, MSG_NOSIGNAL) < 0) break;
    pos += piece;
  }
  ::shutdown(fd, SHUT_WR);
  // Whatever the server answers, until it closes or stays silent for a moment.
  char buf[65536];
  for (;;) {
    struct pollfd pf {
      fd, POLLIN, 0
    };
    if (::poll(&pf, 1, 50) <= 0 || ::recv(fd, buf, sizeof buf, 0) <= 0) break;
  }
  ::close(fd);
  return 0;
}
