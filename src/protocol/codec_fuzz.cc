// libFuzzer target for every decoder of the message codec: the first byte
// picks a decoder, the rest is its input; the header decoder sees the first
// 24 bytes too. Run with `make fuzz`.
#include <cstddef>
#include <cstdint>

#include "protocol/codec.h"

using namespace kvpool::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> body(data + 1, size - 1);
  FrameHeader h;
  (void)DecodeHeader(std::span(data, size), 80u << 20, &h);
  std::vector<kvpool::KeyId> k;
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
  switch (data[0] % 11) {
    case 0: (void)DecodeKeys(body, kMaxBatch, &k); break;
    case 1: (void)DecodeSizedKeys(body, kMaxBatch, &s, &rest); break;
    case 2: (void)DecodeSizedKeys(body, kMaxBatch, &s, nullptr); break;
    case 3: (void)DecodeHandles(body, kMaxBatch, &hs); break;
    case 4: (void)DecodeRegionItems(body, kMaxBatch, &r); break;
    case 5: (void)DecodeStatuses(body, kMaxBatch, &st); break;
    case 6: (void)DecodeExistsReply(body, kMaxBatch, &e); break;
    case 7: (void)DecodeGetReply(body, kMaxBatch, &g, &rest); break;
    case 8: (void)DecodeHello(body, &hr); break;
    case 9: (void)DecodeHelloReply(body, &hp); break;
    case 10: (void)DecodeString(body, &str); break;
  }
  // Round trip: what decodes must re-encode to the same bytes.
  if (data[0] % 11 == 0 && DecodeKeys(body, kMaxBatch, &k).ok()) {
    std::vector<uint8_t> again;
    EncodeKeys(k, &again);
    if (again.size() != body.size() || !std::equal(again.begin(), again.end(), body.begin())) {
      __builtin_trap();
    }
  }
  return 0;
}
