// libFuzzer target for the control plane's frame decoder, field reader and message decoders.  The
// input is cut into pieces (sizes taken from the input itself) and fed to a FrameDecoder; every
// complete frame's payload is read as a sequence of fields and handed to the message decoders
// (job description, generation, exit, Routed envelope) by its type.  WireError is the correct answer to garbage;
// a crash, a sanitizer report or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/wire.hpp"
#include "exec/control_codec.hpp"

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
          switch (f.type % 4) {
            case 0: {
              auto j = pe::ctrl::decode_job(f.payload);
              if (j.node < 0 || static_cast<size_t>(j.node) >= j.map.nodes.size()) std::abort();
              for (const auto& loc : j.map.ranks)
                if (loc.node < 0 || static_cast<size_t>(loc.node) >= j.map.nodes.size()) std::abort();
              break;
            }
            case 1: pe::ctrl::decode_generation(f.payload); break;
            case 2: pe::ctrl::decode_exit(f.payload); break;
            case 3: pe::ctrl::unwrap(f.payload); break;
          }
        } catch (const WireError&) {
        }
        Reader r(f.payload);
        try {
          while (r.remaining() > 0) {
            switch (r.u8() % 5) {
              case 0: r.u16(); break;
              case 1: r.u32(); break;
              case 2: r.u64(); break;
              case 3: r.str(4096); break;
              case 4: r.finish(); break;
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
