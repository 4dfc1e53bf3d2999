// Test support: runs one of the codec's decoders on arbitrary bytes and
// throws the result away. Shared by the libFuzzer target (codec_fuzz.cc) and
// the unit test that feeds random bytes to every decoder (codec_test.cc), so
// a new decoder is added to both in one place.
//
// Thread-safe (no shared state).

#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "protocol/codec.h"
#include "protocol/descriptor_format.h"

namespace kvpool::protocol {

// How many decoder choices RunDecoder has (`which` in [0, kNumDecoders)).
inline constexpr int kNumDecoders = 15;

// Decodes `body` with decoder number `which`, batches bounded by max_batch.
inline void RunDecoder(int which, std::span<const uint8_t> body, uint32_t max_batch) {
  std::vector<KeyId> k;
  std::vector<SizedKey> s;
  std::vector<uint64_t> hs;
  std::vector<RegionItem> r;
  std::vector<int32_t> st;
  std::vector<GetItem> g;
  std::span<const uint8_t> rest;
  ExistsReply e;
  HelloRequest hr;
  HelloReply hp;
  std::string str;
  std::vector<std::span<const uint8_t>> descs;
  BlockDescriptor bd;
  switch (which) {
    case 0: (void)DecodeKeys(body, max_batch, &k); break;
    case 1: (void)DecodeSizedKeys(body, max_batch, &s, &rest); break;
    case 2: (void)DecodeSizedKeys(body, max_batch, &s, nullptr); break;
    case 3: (void)DecodeHandles(body, max_batch, &hs); break;
    case 4: (void)DecodeRegionItems(body, max_batch, &r); break;
    case 5: (void)DecodeStatuses(body, max_batch, &st); break;
    case 6: (void)DecodeExistsReply(body, max_batch, &e); break;
    case 7: (void)DecodeGetReply(body, max_batch, &g, &rest); break;
    case 8: (void)DecodeHello(body, &hr); break;
    case 9: (void)DecodeHelloReply(body, &hp); break;
    case 10: (void)DecodeString(body, &str); break;
    case 11:
      (void)DecodeDescribedSizedKeys(body, max_batch, &s, &descs, &rest);
      break;
    case 12:
      (void)DecodeDescribedSizedKeys(body, max_batch, &s, &descs, nullptr);
      break;
    case 13:
      (void)DecodeDescriptor(body, &bd);
      break;
    case 14: {
      uint32_t t;
      std::vector<uint64_t> h;
      (void)DecodeLookupPrefix(body, max_batch, &t, &h);
      break;
    }
  }
}

}  // namespace kvpool::protocol
