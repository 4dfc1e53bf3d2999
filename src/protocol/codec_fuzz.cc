// libFuzzer target for every decoder of the message codec: the first byte
// picks a decoder, the rest is its input; the header decoder sees the first
// 24 bytes too. Run with `make fuzz`.
#include <cstddef>
#include <cstdint>

#include "protocol/codec.h"
#include "protocol/codec_test_util.h"

using namespace kvpool::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> body(data + 1, size - 1);
  FrameHeader h;
  (void)DecodeHeader(std::span(data, size), 80u << 20, &h);
  RunDecoder(data[0] % kNumDecoders, body, kMaxBatch);
  // Round trip: what decodes must re-encode to the same bytes.
  std::vector<kvpool::KeyId> k;
  if (data[0] % kNumDecoders == 0 && DecodeKeys(body, kMaxBatch, &k).ok()) {
    std::vector<uint8_t> again;
    EncodeKeys(k, &again);
    if (again.size() != body.size() || !std::equal(again.begin(), again.end(), body.begin())) {
      __builtin_trap();
    }
  }
  return 0;
}
