// Block descriptors: what a writer says about a key so the node's KV events
// name the block the engine's way (docs/kv-events.md). A put or reserve may
// carry one per key (MessageType::kPutDescribed, kReserveDescribed); the
// node keeps it with the entry while a tier holds it.
//
// A descriptor is a little-endian byte string:
// | field        | type            | meaning                                        |
// |--------------|-----------------|------------------------------------------------|
// | version      | u8              | 1                                              |
// | hash_kind    | u8              | 1 uint64, 2 int64, 3 bytes                     |
// | hash         | 8 bytes (1, 2), | the engine's block hash as its own events      |
// |              | or u8 len (1-32)| write it (an int, or bytes)                    |
// |              | + len bytes (3) |                                                |
// | parent_kind  | u8              | 0 none (the first block), else as hash_kind    |
// | parent       | as hash         | absent for kind 0                              |
// | block_size   | u32             | tokens per block, 1 .. 65536                   |
// | n_tokens     | u32             | 0 (not told) or block_size                     |
// | token_ids    | n_tokens x u32  | the block's tokens                             |
// | group_idx    | i32             | the KV cache group, -1 none                    |
// | lora_name    | u8 len + bytes  | 0: none                                        |
// | spec_kind    | u8 len + bytes  | the cache spec kind ("full", ...); 0: none     |
// Nothing may follow. A descriptor is at most kMaxDescriptorBytes.
//
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpool::protocol {

inline constexpr uint8_t kDescriptorVersion = 1;
inline constexpr uint32_t kMaxDescriptorTokens = 4096;
inline constexpr uint32_t kMaxDescriptorBlockSize = 65536;
inline constexpr uint32_t kMaxDescriptorHashBytes = 32;
inline constexpr uint32_t kMaxDescriptorBytes = 16 * 1024 + 512;

// An engine block hash: an int (unsigned or signed 64-bit) or bytes.
struct EngineHash {
  enum class Kind : uint8_t { kNone = 0, kUint64 = 1, kInt64 = 2, kBytes = 3 };
  Kind kind = Kind::kNone;
  uint64_t value = 0;  // kUint64, kInt64 (two's complement)
  std::string bytes;   // kBytes
  bool operator==(const EngineHash&) const = default;
};

struct BlockDescriptor {
  EngineHash hash;
  EngineHash parent;  // kind kNone: no parent
  uint32_t block_size = 0;
  std::vector<uint32_t> token_ids;  // empty or block_size of them
  int32_t group_idx = -1;           // -1: none
  std::string lora_name;            // empty: none
  std::string spec_kind;            // empty: none
  bool operator==(const BlockDescriptor&) const = default;
};

// A descriptor read in place: views into its bytes, nothing allocated (the
// node reads every descriptor of every put this way).
struct EngineHashView {
  EngineHash::Kind kind = EngineHash::Kind::kNone;
  uint64_t value = 0;
  std::string_view bytes;
};
struct DescriptorView {
  EngineHashView hash;
  EngineHashView parent;
  uint32_t block_size = 0;
  uint32_t n_tokens = 0;
  const uint8_t* tokens = nullptr;  // n_tokens little-endian u32, unaligned
  int32_t group_idx = -1;
  std::string_view lora_name;
  std::string_view spec_kind;
  uint32_t token(uint32_t i) const {
    uint32_t t;
    std::memcpy(&t, tokens + 4 * static_cast<size_t>(i), 4);
    return t;
  }
};

// The descriptor's bytes; InvalidArgument when it breaks a rule above.
Result<std::string> EncodeDescriptor(const BlockDescriptor& d);
// Reads and checks a descriptor in place (*v views `bytes`); InvalidArgument
// says which rule it broke. The rules live here alone.
Status ParseDescriptor(std::span<const uint8_t> bytes, DescriptorView* v);
// ParseDescriptor, copied out.
Status DecodeDescriptor(std::span<const uint8_t> bytes, BlockDescriptor* d);

}  // namespace kvpool::protocol
