#include "store/ssd/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvpool::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// tables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
};
constexpr Tables kTables;

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& t = kTables.t;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64)
    v ^= crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^
          t[4][(v >> 24) & 0xff] ^ t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^
          t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of 3 cycles but issues one per cycle:
// one dependent stream runs at a third of the unit's speed. Long inputs are
// cut into blocks of three equal lanes computed side by side, then joined:
// the register after lane A then lane B is Shift(A's register, |B|) ^ B's
// register started from 0 (the CRC register update is linear over GF(2)).
// Shift by a fixed lane length is a 32x32 bit matrix, kept as four byte
// tables computed once from the instruction itself.
struct ShiftTable {
  std::array<std::array<uint32_t, 256>, 4> t{};
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t ShiftByZeros(uint32_t c, size_t bytes) {
  uint64_t r = c;
  for (size_t i = 0; i < bytes; i += 8) r = _mm_crc32_u64(r, 0);
  return static_cast<uint32_t>(r);
}

ShiftTable MakeShiftTable(size_t bytes) {
  ShiftTable s;
  uint32_t basis[32];
  for (int bit = 0; bit < 32; ++bit) basis[bit] = ShiftByZeros(1u << bit, bytes);
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int i = 0; i < 8; ++i) {
        if (b & (1u << i)) v ^= basis[8 * k + i];
      }
      s.t[k][b] = v;
    }
  }
  return s;
}

// Lane lengths (multiples of 8): long lanes for bulk data, short ones for
// the tail and small records.
constexpr size_t kLongLane = 4096;
constexpr size_t kShortLane = 256;

// Reads each input byte once; with kCopy also stores it to d (the copy rides
// along with the CRC instead of a second pass over the source).
template <size_t kLane, bool kCopy>
__attribute__((target("sse4.2"))) inline uint64_t ThreeLanes(uint64_t c, uint8_t* d,
                                                             const uint8_t* p,
                                                             const ShiftTable& shift) {
  uint64_t c1 = 0, c2 = 0;
  for (size_t i = 0; i < kLane; i += 8) {
    uint64_t v0, v1, v2;
    std::memcpy(&v0, p + i, 8);
    std::memcpy(&v1, p + kLane + i, 8);
    std::memcpy(&v2, p + 2 * kLane + i, 8);
    if constexpr (kCopy) {
      std::memcpy(d + i, &v0, 8);
      std::memcpy(d + kLane + i, &v1, 8);
      std::memcpy(d + 2 * kLane + i, &v2, 8);
    }
    c = _mm_crc32_u64(c, v0);
    c1 = _mm_crc32_u64(c1, v1);
    c2 = _mm_crc32_u64(c2, v2);
  }
  const uint32_t ab = shift(static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1);
  return shift(ab) ^ static_cast<uint32_t>(c2);
}

template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, uint8_t* d,
                                                       const uint8_t* p, size_t n) {
  static const ShiftTable kShiftLong = MakeShiftTable(kLongLane);
  static const ShiftTable kShiftShort = MakeShiftTable(kShortLane);
  uint64_t c = crc;
  auto advance = [&](size_t k) {
    p += k;
    n -= k;
    if constexpr (kCopy) d += k;
  };
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    if constexpr (kCopy) *d = *p;
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
    advance(1);
  }
  while (n >= 3 * kLongLane) {
    c = ThreeLanes<kLongLane, kCopy>(c, d, p, kShiftLong);
    advance(3 * kLongLane);
  }
  while (n >= 3 * kShortLane) {
    c = ThreeLanes<kShortLane, kCopy>(c, d, p, kShiftShort);
    advance(3 * kShortLane);
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    if constexpr (kCopy) std::memcpy(d, &v, 8);
    c = _mm_crc32_u64(c, v);
    advance(8);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    if constexpr (kCopy) *d = *p;
    c32 = _mm_crc32_u8(c32, *p);
    advance(1);
  }
  return c32;
}

bool DetectSse42() {
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_SSE4_2) != 0;
}
const bool kHaveSse42 = DetectSse42();
#else
const bool kHaveSse42 = false;
#endif

}  // namespace

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  crc = kHaveSse42 ? ExtendSse42<false>(crc, nullptr, p, n) : ExtendPortable(crc, p, n);
#else
  crc = ExtendPortable(crc, p, n);
#endif
  return ~crc;
}

uint32_t CopyAndExtend(uint32_t crc, void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (kHaveSse42) {
    return ~ExtendSse42<true>(~crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src),
                              n);
  }
#endif
  std::memcpy(dst, src, n);
  return Extend(crc, src, n);
}

bool HardwareAccelerated() { return kHaveSse42; }

}  // namespace kvpool::crc32c
