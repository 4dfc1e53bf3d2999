#include "store/ssd/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace kvpool::crc32c {
namespace {

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Value("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(Value(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Value(ones.data(), 32), 0x62A8AB43u);
}

TEST(Crc32cTest, ExtendEqualsWholeAtAnySplitAndAlignment) {
  std::vector<uint8_t> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 31 + 7);
  for (size_t start : {0, 1, 3, 7}) {
    const uint32_t whole = Value(buf.data() + start, 900);
    for (size_t split : {0, 1, 5, 8, 13, 450, 899, 900}) {
      uint32_t c = Extend(0, buf.data() + start, split);
      EXPECT_EQ(Extend(c, buf.data() + start + split, 900 - split), whole);
    }
  }
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> buf(256, 0x5A);
  const uint32_t good = Value(buf.data(), buf.size());
  for (size_t bit = 0; bit < buf.size() * 8; ++bit) {
    buf[bit / 8] ^= 1 << (bit % 8);
    EXPECT_NE(Value(buf.data(), buf.size()), good);
    buf[bit / 8] ^= 1 << (bit % 8);
  }
}

}  // namespace
}  // namespace kvpool::crc32c
