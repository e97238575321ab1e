// The control plane's codec: length-prefixed binary frames, little-endian, every decode bounded
// and checked.  A frame is
//   magic "PEX1" (4 bytes) | type u16 | flags u16 | payload length u32 | payload
// and a payload is a sequence of fields written with Writer and read back with Reader.  Any
// malformed input throws WireError; the caller drops the connection and logs it.
//
// Threading: none of these types is shared between threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace pe::wire {

class WireError : public pe::Error {
 public:
  explicit WireError(const std::string& what) : pe::Error(what) {}
};

inline constexpr uint32_t kMagic = 0x31584550;  // "PEX1" as little-endian bytes
inline constexpr size_t kHeaderSize = 12;
inline constexpr uint32_t kMaxPayload = 16u << 20;  // a larger frame is an error
inline constexpr uint32_t kMaxString = 1u << 20;    // likewise a longer string field

struct Frame {
  uint16_t type = 0;
  uint16_t flags = 0;
  std::string payload;
};

// Appends fields to a payload.
class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& u16(uint16_t v);
  Writer& u32(uint32_t v);
  Writer& u64(uint64_t v);
  Writer& i32(int32_t v) { return u32(static_cast<uint32_t>(v)); }
  Writer& str(std::string_view s);  // u32 length + bytes; throws WireError above kMaxString
  Writer& blob(
      std::string_view s);  // the same for bulk data, up to kMaxPayload (read: str(kMaxPayload))
  const std::string& data() const { return buf_; }
  std::string take() { return std::move(buf_); }

 private:
  std::string buf_;
};

// Reads fields from a payload; throws WireError on truncation or bounds.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  uint8_t u8();
  uint16_t u16();
  uint32_t u32();
  uint64_t u64();
  int32_t i32() { return static_cast<int32_t>(u32()); }
  std::string str(uint32_t max = kMaxString);
  // Throws unless every byte was consumed (trailing garbage is malformed too).
  void finish() const;
  size_t remaining() const { return data_.size() - pos_; }

 private:
  const char* take(size_t n);
  std::string_view data_;
  size_t pos_ = 0;
};

std::string encode_frame(uint16_t type, std::string_view payload, uint16_t flags = 0);

// Reassembles frames from a byte stream fed in arbitrary pieces.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_payload = kMaxPayload) : max_(max_payload) {}
  void set_max_payload(uint32_t max_payload) { max_ = max_payload; }
  void feed(const char* data, size_t len);
  // The next complete frame, if any; throws WireError for a bad magic or an oversized length
  // as soon as the header has arrived.
  bool next(Frame& out);
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  uint32_t max_;
};

}  // namespace pe::wire
