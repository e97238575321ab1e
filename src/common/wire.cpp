#include "common/wire.hpp"

#include <cstring>

namespace pe::wire {
namespace {

void put_le(std::string& b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

Writer& Writer::u8(uint8_t v) {
  put_le(buf_, v, 1);
  return *this;
}
Writer& Writer::u16(uint16_t v) {
  put_le(buf_, v, 2);
  return *this;
}
Writer& Writer::u32(uint32_t v) {
  put_le(buf_, v, 4);
  return *this;
}
Writer& Writer::u64(uint64_t v) {
  put_le(buf_, v, 8);
  return *this;
}

Writer& Writer::str(std::string_view s) {
  if (s.size() > kMaxString)
    throw WireError("string field of " + std::to_string(s.size()) + " bytes is too long");
  u32(static_cast<uint32_t>(s.size()));
  buf_.append(s);
  return *this;
}

Writer& Writer::blob(std::string_view s) {
  if (s.size() > kMaxPayload)
    throw WireError("data field of " + std::to_string(s.size()) + " bytes is too long");
  u32(static_cast<uint32_t>(s.size()));
  buf_.append(s);
  return *this;
}

const char* Reader::take(size_t n) {
  if (n > remaining())
    throw WireError("truncated payload: " + std::to_string(n) + " bytes wanted, " +
                    std::to_string(remaining()) + " left");
  const char* p = data_.data() + pos_;
  pos_ += n;
  return p;
}

uint8_t Reader::u8() { return static_cast<uint8_t>(get_le(take(1), 1)); }
uint16_t Reader::u16() { return static_cast<uint16_t>(get_le(take(2), 2)); }
uint32_t Reader::u32() { return static_cast<uint32_t>(get_le(take(4), 4)); }
uint64_t Reader::u64() { return get_le(take(8), 8); }

std::string Reader::str(uint32_t max) {
  uint32_t n = u32();
  if (n > max)
    throw WireError("string field of " + std::to_string(n) + " bytes exceeds " +
                    std::to_string(max));
  const char* p = take(n);
  return std::string(p, n);
}

void Reader::finish() const {
  if (remaining() != 0) throw WireError(std::to_string(remaining()) + " unexpected trailing bytes");
}

std::string encode_frame(uint16_t type, std::string_view payload, uint16_t flags) {
  if (payload.size() > kMaxPayload)
    throw WireError("frame payload of " + std::to_string(payload.size()) + " bytes is too large");
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  put_le(out, kMagic, 4);
  put_le(out, type, 2);
  put_le(out, flags, 2);
  put_le(out, payload.size(), 4);
  out.append(payload);
  return out;
}

void FrameDecoder::feed(const char* data, size_t len) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  buf_.append(data, len);
}

bool FrameDecoder::next(Frame& out) {
  if (buffered() < kHeaderSize) return false;
  const char* h = buf_.data() + pos_;
  if (get_le(h, 4) != kMagic) throw WireError("bad frame magic (not a pytorch_exec peer)");
  uint32_t len = static_cast<uint32_t>(get_le(h + 8, 4));
  if (len > max_)
    throw WireError("frame of " + std::to_string(len) + " bytes exceeds the limit of " +
                    std::to_string(max_));
  if (buffered() < kHeaderSize + len) return false;
  out.type = static_cast<uint16_t>(get_le(h + 4, 2));
  out.flags = static_cast<uint16_t>(get_le(h + 6, 2));
  out.payload.assign(h + kHeaderSize, len);
  pos_ += kHeaderSize + len;
  if (pos_ > (1u << 20) && pos_ * 2 > buf_.size()) {  // compact now and then
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return true;
}

}  // namespace pe::wire
