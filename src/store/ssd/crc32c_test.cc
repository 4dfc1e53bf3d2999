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

// Bit at a time, straight from the definition: the reference for the fast
// paths (lane blocks, short-lane tail, byte tail, unaligned starts).
uint32_t Reference(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0);
  }
  return ~c;
}

TEST(Crc32cTest, MatchesReferenceAcrossLaneBoundaries) {
  std::vector<uint8_t> buf(40960 + 64);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  // Around one and two long blocks (3 x 4096), short blocks (3 x 256) and
  // the 8-byte loop, from aligned and unaligned starts.
  std::vector<size_t> lengths = {0, 1, 7, 8, 9, 767, 768, 769, 1535, 1536, 1537, 12287, 12288,
                                 12289, 12288 + 768 + 7, 24576, 24576 + 1536 + 9, 36000};
  for (size_t start : {0, 1, 5, 8, 4096}) {
    for (size_t n : lengths) {
      ASSERT_LE(start + n, buf.size());
      EXPECT_EQ(Value(buf.data() + start, n), Reference(buf.data() + start, n))
          << "start " << start << " length " << n;
    }
  }
  // Extend across a lane-sized split still equals the whole.
  const uint32_t whole = Value(buf.data(), 36000);
  for (size_t split : {1, 12288, 12289, 20000}) {
    EXPECT_EQ(Extend(Value(buf.data(), split), buf.data() + split, 36000 - split), whole);
  }
}

TEST(Crc32cTest, CopyAndExtendCopiesAndMatchesExtend) {
  std::vector<uint8_t> src(40000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  for (size_t start : {0, 3, 8}) {
    for (size_t n : {0, 5, 8, 769, 12288, 12288 + 768 + 13, 39000}) {
      std::vector<uint8_t> dst(n + 16, 0xEE);
      const uint32_t seed = Value("seed", 4);
      EXPECT_EQ(CopyAndExtend(seed, dst.data() + 1, src.data() + start, n),
                Extend(seed, src.data() + start, n))
          << start << " " << n;
      EXPECT_EQ(std::memcmp(dst.data() + 1, src.data() + start, n), 0) << start << " " << n;
      EXPECT_EQ(dst[0], 0xEE);  // nothing written outside [dst, dst + n)
      EXPECT_EQ(dst[n + 1], 0xEE);
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
