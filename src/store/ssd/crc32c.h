// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
// ext4 and RocksDB. Detects every single-bit error and every burst of up to
// 32 bits. Uses the SSE4.2 crc32 instruction (three interleaved streams) when
// the CPU has it (checked once at startup), else a slicing-by-8 table.
// Thread-safe (pure functions).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvpool::crc32c {

// Continues a CRC: Extend(Extend(0, a), b) == Value(a || b).
uint32_t Extend(uint32_t crc, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }
// Copies n bytes from src to dst (not overlapping) and returns
// Extend(crc, src, n), reading the source once.
uint32_t CopyAndExtend(uint32_t crc, void* dst, const void* src, size_t n);

// True when the hardware path is in use (for logs and benchmarks).
bool HardwareAccelerated();

}  // namespace kvpool::crc32c
