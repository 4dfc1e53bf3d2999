// Descriptor: one key's block descriptor (protocol/descriptor_format.h) as
// its writer sent it, checked, with its engine hash's 64-bit form: what the
// descriptor table keeps and what KV events read. Immutable and shared (a
// put's stage, the table and the event queue hold one copy): one allocation
// of its bytes and a small header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

#include "common/prefetch.h"
#include "protocol/descriptor_format.h"

namespace kvpool::blocks {

// The 64-bit form of an engine hash, as vLLM's int mode and Dynamo read
// it: an int as it is, bytes as their last 8 bytes, big-endian.
uint64_t EngineHash64(const protocol::EngineHash& h);
uint64_t EngineHash64(const protocol::EngineHashView& h);

class Descriptor {
 public:
  Descriptor() = default;  // none

  // bytes parsed (ParseDescriptor) into view: a copy of them, whose view
  // the caller has already checked.
  static Descriptor Make(std::span<const uint8_t> bytes, const protocol::DescriptorView& view);
  // Parses bytes; none when they do not parse.
  static Descriptor Parse(std::span<const uint8_t> bytes);
  static Descriptor Parse(std::string_view bytes) {
    return Parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  }

  explicit operator bool() const { return rep_ != nullptr; }
  std::span<const uint8_t> bytes() const;
  std::string_view str() const;
  size_t size() const {
    if (rep_ == nullptr) return 0;
    uint64_t n;
    std::memcpy(&n, rep_.get() + offsetof(Header, size), sizeof(n));
    return static_cast<size_t>(n);
  }
  uint64_t hash64() const;  // EngineHash64 of its hash
  // Starts loading its header and the bytes after it, 128 bytes from its
  // start, into the cache, for a read or a copy a little later. (The
  // size is in the header, not read here: that would wait for it.)
  void Prefetch() const {
    if (rep_ == nullptr) return;
    const auto at = reinterpret_cast<uintptr_t>(rep_.get());
    PrefetchForRead(reinterpret_cast<const void*>(at));
    PrefetchForRead(reinterpret_cast<const void*>(at + 64));
  }

 private:
  struct Header {
    uint64_t hash64;
    uint64_t size;
  };
  std::shared_ptr<const uint8_t[]> rep_;  // a Header, then the bytes
};

}  // namespace kvpool::blocks
