#include <gtest/gtest.h>

#include "common/wire.hpp"

using namespace pe::wire;

TEST(WireTest, FieldsRoundTrip) {
  Writer w;
  w.u8(7).u16(0xbeef).u32(0xdeadbeef).u64(0x0123456789abcdefULL).i32(-5).str("héllo").str("");
  Reader r(w.data());
  EXPECT_EQ(r.u8(), 7);
  EXPECT_EQ(r.u16(), 0xbeef);
  EXPECT_EQ(r.u32(), 0xdeadbeefu);
  EXPECT_EQ(r.u64(), 0x0123456789abcdefULL);
  EXPECT_EQ(r.i32(), -5);
  EXPECT_EQ(r.str(), "héllo");
  EXPECT_EQ(r.str(), "");
  EXPECT_NO_THROW(r.finish());
}

TEST(WireTest, EncodingIsLittleEndianAndStable) {
  std::string f = encode_frame(0x0102, "ab", 0x0304);
  EXPECT_EQ(f, std::string("PEX1\x02\x01\x04\x03\x02\x00\x00\x00"
                           "ab",
                           14));
}

TEST(WireTest, TruncationAndBoundsAreErrors) {
  Writer w;
  w.u32(10);  // a string length with no bytes behind it
  Reader r(w.data());
  EXPECT_THROW(r.str(), WireError);
  Reader big(Writer().u32(100).data());
  EXPECT_THROW(big.str(10), WireError);
  Reader trailing(Writer().u8(1).u8(2).data());
  trailing.u8();
  EXPECT_THROW(trailing.finish(), WireError);
  Reader empty("");
  EXPECT_THROW(empty.u64(), WireError);
}

TEST(FrameDecoderTest, ReassemblesFramesFedByteByByte) {
  std::string stream =
      encode_frame(1, "first") + encode_frame(2, "") + encode_frame(3, std::string(70000, 'x'));
  FrameDecoder d;
  std::vector<Frame> got;
  for (char c : stream) {
    d.feed(&c, 1);
    Frame f;
    while (d.next(f)) got.push_back(f);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].type, 1);
  EXPECT_EQ(got[0].payload, "first");
  EXPECT_EQ(got[1].payload, "");
  EXPECT_EQ(got[2].payload.size(), 70000u);
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(FrameDecoderTest, RejectsStrangersAndOversizedFrames) {
  FrameDecoder d;
  std::string junk = "GET / HTTP/1.1\r\n";
  d.feed(junk.data(), junk.size());
  Frame f;
  EXPECT_THROW(d.next(f), WireError);
  FrameDecoder small(1024);
  std::string header = encode_frame(1, std::string(2000, 'y')).substr(0, kHeaderSize);
  small.feed(header.data(), header.size());
  EXPECT_THROW(small.next(f), WireError);  // refused before the payload arrives
  EXPECT_THROW(encode_frame(1, std::string(kMaxPayload + 1, 'z')), WireError);
}
