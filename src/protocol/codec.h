// The message codec shared by the local and peer protocols: header
// encode/decode, a bounds-checked body reader, a body writer, and typed
// encoders/decoders for each message (message_format.h has the layouts).
//
// Decoders never trust a length: every count is checked against its limit
// and against the bytes actually present before anything is allocated.
// Stateless functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/key_id.h"
#include "common/status.h"
#include "protocol/message_format.h"

namespace kvpool::protocol {

// Appends little-endian fields to a byte vector.
class BodyWriter {
 public:
  explicit BodyWriter(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void I32(int32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Key(const KeyId& k) {
    U64(k.hi);
    U64(k.lo);
  }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }

 private:
  std::vector<uint8_t>* out_;  // not owned
};

// Reads fields from a body; every read is bounds-checked. After the first
// failure all reads fail and error() says why.
class BodyReader {
 public:
  explicit BodyReader(std::span<const uint8_t> body) : p_(body.data()), end_(body.data() + body.size()) {}
  bool U8(uint8_t* v) { return Fixed(v, 1); }
  bool U32(uint32_t* v) { return Fixed(v, 4); }
  bool I32(int32_t* v) { return Fixed(v, 4); }
  bool U64(uint64_t* v) { return Fixed(v, 8); }
  bool Key(KeyId* k) { return U64(&k->hi) && U64(&k->lo); }
  // A u32-prefixed string of at most max bytes.
  bool Str(uint32_t max, std::string* s);
  // A u32 item count, at most max, whose items (min_item_bytes each) fit in
  // what is left of the body.
  bool Count(uint32_t max, size_t min_item_bytes, uint32_t* n);
  // n raw bytes, returned as a view into the body.
  bool Bytes(size_t n, std::span<const uint8_t>* out);
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  bool ok() const { return error_ == nullptr; }
  const char* error() const { return error_ ? error_ : ""; }
  // OK when everything was read and nothing is left over.
  Status Finish(std::string_view what) const;

 private:
  bool Fixed(void* v, size_t n) {
    if (error_ != nullptr) return false;
    if (remaining() < n) return Fail("truncated body");
    std::memcpy(v, p_, n);
    p_ += n;
    return true;
  }
  bool Fail(const char* why) {
    if (error_ == nullptr) error_ = why;
    return false;
  }
  const uint8_t* p_;
  const uint8_t* end_;
  const char* error_ = nullptr;
};

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]);
// Checks magic, version and that body_len <= max_body. Does not judge the type.
Status DecodeHeader(std::span<const uint8_t> bytes, uint32_t max_body, FrameHeader* h);
// A whole frame: header + body.
std::vector<uint8_t> EncodeFrame(MessageType type, uint64_t request_id, int32_t status,
                                 std::span<const uint8_t> body, bool reply);
// Writes the header of a frame built in place: *frame holds kHeaderBytes
// (their content ignored), then the body. REQUIRES: frame->size() >= kHeaderBytes.
void SealFrame(MessageType type, uint64_t request_id, int32_t status, bool reply,
               std::vector<uint8_t>* frame);

// ---- Typed messages ------------------------------------------------------
struct HelloRequest {
  uint32_t client_version = kProtocolVersion;
  std::string client_name;
  // Optional: a tenant token (the name and secret of a client token line),
  // which puts the connection in the token's tenant.
  std::string token_name;
  std::array<uint8_t, 32> token{};
  bool has_token = false;
};
struct HelloReply {
  uint64_t instance_id = 0;
  uint64_t segment_bytes = 0;
  uint64_t max_value_bytes = 0;
  uint32_t max_batch = 0;
  uint32_t max_frame_bytes = 0;
  // > 0: the segment is passed read-only and a second fd follows, this
  // connection's staging memory of this size, where reservations are
  // written (the node copies them into the segment on commit). 0: the
  // segment is writable and reservations are written in place.
  uint64_t staging_bytes = 0;
};
struct SizedKey {
  KeyId key;
  uint64_t size = 0;  // value size (Reserve, Put) or buffer capacity (Get)
};
// One item of a Reserve or Acquire reply.
struct RegionItem {
  int32_t status = 0;
  uint64_t handle = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};
struct ExistsReply {
  uint32_t prefix_len = 0;
  std::vector<uint8_t> hits;
};
struct GetItem {
  int32_t status = 0;
  uint64_t size = 0;
};

void EncodeHello(const HelloRequest& m, std::vector<uint8_t>* out);
Status DecodeHello(std::span<const uint8_t> body, HelloRequest* m);
void EncodeHelloReply(const HelloReply& m, std::vector<uint8_t>* out);
Status DecodeHelloReply(std::span<const uint8_t> body, HelloReply* m);

// Reserve request / Get request (size = capacity) / Put request header part.
void EncodeSizedKeys(std::span<const SizedKey> items, std::vector<uint8_t>* out);
// Decodes n x {key, u64}; for Put, the value bytes follow and *rest gets them.
Status DecodeSizedKeys(std::span<const uint8_t> body, uint32_t max_batch,
                       std::vector<SizedKey>* items, std::span<const uint8_t>* rest);

// Described requests (kReserveDescribed, kPutDescribed): the sized keys,
// then the descriptor section, then (Put) the values.
struct KeyDescriptor {
  KeyId key;
  std::span<const uint8_t> descriptor;  // not owned
};
void EncodeDescribedSizedKeys(std::span<const SizedKey> items,
                              std::span<const KeyDescriptor> descriptors,
                              std::vector<uint8_t>* out);
// *descriptors gets one entry per item, in item order: the bytes of its
// key's descriptor (views into body), empty where it has none. A
// descriptor whose key is not among the items, or a key described twice,
// fails the request (InvalidArgument naming the key). The descriptors'
// contents are not judged here (DecodeDescriptor).
Status DecodeDescribedSizedKeys(std::span<const uint8_t> body, uint32_t max_batch,
                                std::vector<SizedKey>* items,
                                std::vector<std::span<const uint8_t>>* descriptors,
                                std::span<const uint8_t>* rest);

// LookupPrefix request: a timeout and the engine block hashes, in order.
void EncodeLookupPrefix(uint32_t timeout_ms, std::span<const uint64_t> hashes,
                        std::vector<uint8_t>* out);
Status DecodeLookupPrefix(std::span<const uint8_t> body, uint32_t max_hashes, uint32_t* timeout_ms,
                          std::vector<uint64_t>* hashes);

// Hint request (a cache hint on the client's tenant's keys) and reply.
struct HintRequest {
  uint32_t op = 0;  // kvpool::HintOp (1 retain, 2 pin, 3 prefetch, 4 demote, 5 release)
  uint32_t priority = 0;
  uint64_t ttl_ms = 0;
  std::vector<KeyId> keys;
};
void EncodeHint(const HintRequest& m, std::vector<uint8_t>* out);
Status DecodeHint(std::span<const uint8_t> body, uint32_t max_batch, HintRequest* m);
struct HintReply {
  uint64_t applied = 0;
  uint64_t unknown = 0;
  uint64_t clipped = 0;
  uint64_t moved = 0;
};
void EncodeHintReply(const HintReply& m, std::vector<uint8_t>* out);
Status DecodeHintReply(std::span<const uint8_t> body, HintReply* m);

void EncodeKeys(std::span<const KeyId> keys, std::vector<uint8_t>* out);
Status DecodeKeys(std::span<const uint8_t> body, uint32_t max_batch, std::vector<KeyId>* keys);

void EncodeHandles(std::span<const uint64_t> handles, std::vector<uint8_t>* out);
Status DecodeHandles(std::span<const uint8_t> body, uint32_t max_batch,
                     std::vector<uint64_t>* handles);

void EncodeRegionItems(std::span<const RegionItem> items, std::vector<uint8_t>* out);
Status DecodeRegionItems(std::span<const uint8_t> body, uint32_t max_batch,
                         std::vector<RegionItem>* items);

void EncodeStatuses(std::span<const int32_t> statuses, std::vector<uint8_t>* out);
Status DecodeStatuses(std::span<const uint8_t> body, uint32_t max_batch,
                      std::vector<int32_t>* statuses);

void EncodeExistsReply(const ExistsReply& m, std::vector<uint8_t>* out);
Status DecodeExistsReply(std::span<const uint8_t> body, uint32_t max_batch, ExistsReply* m);

// Get reply: items, then the bytes of every OK item in order (*data).
void EncodeGetItems(std::span<const GetItem> items, std::vector<uint8_t>* out);
Status DecodeGetReply(std::span<const uint8_t> body, uint32_t max_batch,
                      std::vector<GetItem>* items, std::span<const uint8_t>* data);

void EncodeString(std::string_view s, std::vector<uint8_t>* out);
// Bodies of exactly one integer (Clear: the request's tag, the reply's count).
void EncodeU32Body(uint32_t v, std::vector<uint8_t>* out);
Status DecodeU32Body(std::span<const uint8_t> body, uint32_t* v);
void EncodeU64Body(uint64_t v, std::vector<uint8_t>* out);
Status DecodeU64Body(std::span<const uint8_t> body, uint64_t* v);
Status DecodeString(std::span<const uint8_t> body, std::string* s);

}  // namespace kvpool::protocol
