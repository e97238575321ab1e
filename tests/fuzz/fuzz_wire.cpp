// libFuzzer target for the control plane's frame decoder, field reader and message decoders.  The
// input is cut into pieces (sizes taken from the input itself) and fed to a FrameDecoder; every
// complete frame's payload is read as a sequence of fields and decoded as every control message
// type (ctrl/messages.hpp), the one its type names and all the others.  WireError is the correct
// answer to garbage;
// a crash, a sanitizer report or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/wire.hpp"
#include "exec/ctrl/messages.hpp"

using namespace pe::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FrameDecoder d(1 << 16);
  size_t pos = 0;
  try {
    while (pos < size) {
      size_t piece = 1 + data[pos] % 64;
      ++pos;
      if (pos + piece > size) piece = size - pos;
      d.feed(reinterpret_cast<const char*>(data) + pos, piece);
      pos += piece;
      Frame f;
      while (d.next(f)) {
        if (f.payload.size() > (1u << 16)) std::abort();
        try {
          auto j = pe::ctrl::decode<pe::ctrl::Job>(f.payload).job;
          if (j.node < 0 || static_cast<size_t>(j.node) >= j.map.nodes.size()) std::abort();
          for (const auto& loc : j.map.ranks)
            if (loc.node < 0 || static_cast<size_t>(loc.node) >= j.map.nodes.size()) std::abort();
        } catch (const WireError&) {
        }
        for (uint16_t type = 0; type <= 41; ++type) {
          try {
            pe::ctrl::decode_any(type, f.payload);
          } catch (const WireError&) {
          }
        }
        Reader r(f.payload);
        try {
          while (r.remaining() > 0) {
            switch (r.u8() % 5) {
              case 0:
                r.u16();
                break;
              case 1:
                r.u32();
                break;
              case 2:
                r.u64();
                break;
              case 3:
                r.str(4096);
                break;
              case 4:
                r.finish();
                break;
            }
          }
        } catch (const WireError&) {
        }
      }
    }
  } catch (const WireError&) {
  }
  return 0;
}
