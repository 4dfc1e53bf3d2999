// KeyId: the 128-bit identity of a cached value.
//
// A key is (namespace, object key), both arbitrary bytes. Its id is SHA-256
// over the length-framed pair, truncated to 128 bits, with the low 32 bits
// replaced by the namespace's tag: 96 bits tell keys of one namespace apart
// (collision resistant: two different keys never share a slot), and the tag
// lets a node drop every key of one namespace (a clear) without storing
// namespaces. Computed once, at the edge (the client library); everything
// below works on ids. Thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

namespace kvpool {

struct KeyId {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const KeyId&, const KeyId&) = default;
  friend auto operator<=>(const KeyId&, const KeyId&) = default;
  // 32 lowercase hex digits.
  std::string ToHex() const;
  static bool FromHex(std::string_view hex, KeyId* out);
};

// The namespace's tag: SHA-256("kvpool-namespace" || 0x00 || ns), first 4
// bytes read big-endian. Two namespaces share a tag with probability 2^-32.
uint32_t NamespaceTag(std::string_view ns);
// The tag of the namespace a key id was made in.
inline uint32_t NamespaceTagOf(const KeyId& id) { return static_cast<uint32_t>(id.lo); }

// SHA-256( u64le(len(ns)) || ns || u64le(len(key)) || key ), first 16 bytes,
// read big-endian into (hi, lo); then lo's low 32 bits = NamespaceTag(ns).
KeyId MakeKeyId(std::string_view ns, std::string_view key);

struct KeyIdHash {
  size_t operator()(const KeyId& k) const { return static_cast<size_t>(k.lo ^ (k.hi >> 7)); }
};

}  // namespace kvpool
