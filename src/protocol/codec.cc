#include "protocol/codec.h"

#include <fmt/format.h>

#include <unordered_map>

#include "common/check.h"
#include "protocol/descriptor_format.h"

namespace kvpool::protocol {

bool BodyReader::Str(uint32_t max, std::string* s) {
  uint32_t n;
  if (!U32(&n)) return false;
  if (n > max) return Fail("string over its limit");
  if (remaining() < n) return Fail("truncated string");
  s->assign(reinterpret_cast<const char*>(p_), n);
  p_ += n;
  return true;
}

bool BodyReader::Count(uint32_t max, size_t min_item_bytes, uint32_t* n) {
  if (!U32(n)) return false;
  if (*n > max) return Fail("item count over the batch limit");
  if (static_cast<uint64_t>(*n) * min_item_bytes > remaining()) return Fail("item count exceeds body");
  return true;
}

bool BodyReader::Bytes(size_t n, std::span<const uint8_t>* out) {
  if (error_ != nullptr) return false;
  if (remaining() < n) return Fail("truncated bytes");
  *out = std::span<const uint8_t>(p_, n);
  p_ += n;
  return true;
}

Status BodyReader::Finish(std::string_view what) const {
  if (error_ != nullptr) return InvalidArgument(fmt::format("malformed {}: {}", what, error_));
  if (p_ != end_) {
    return InvalidArgument(fmt::format("malformed {}: {} trailing bytes", what, remaining()));
  }
  return Status::Ok();
}

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]) {
  std::memcpy(out, &h.magic, 4);
  std::memcpy(out + 4, &h.version, 2);
  std::memcpy(out + 6, &h.type, 2);
  std::memcpy(out + 8, &h.request_id, 8);
  std::memcpy(out + 16, &h.body_len, 4);
  std::memcpy(out + 20, &h.status, 4);
}

Status DecodeHeader(std::span<const uint8_t> bytes, uint32_t max_body, FrameHeader* h) {
  if (bytes.size() < kHeaderBytes) return InvalidArgument("truncated header");
  const uint8_t* p = bytes.data();
  std::memcpy(&h->magic, p, 4);
  std::memcpy(&h->version, p + 4, 2);
  std::memcpy(&h->type, p + 6, 2);
  std::memcpy(&h->request_id, p + 8, 8);
  std::memcpy(&h->body_len, p + 16, 4);
  std::memcpy(&h->status, p + 20, 4);
  if (h->magic != kMagic) return InvalidArgument("bad magic");
  if (h->version != kProtocolVersion) {
    return InvalidArgument(fmt::format("unsupported protocol version {}", h->version));
  }
  if (h->body_len > max_body) {
    return InvalidArgument(fmt::format("frame body of {} bytes over the limit of {}", h->body_len, max_body));
  }
  return Status::Ok();
}

std::vector<uint8_t> EncodeFrame(MessageType type, uint64_t request_id, int32_t status,
                                 std::span<const uint8_t> body, bool reply) {
  std::vector<uint8_t> out(kHeaderBytes + body.size());
  if (!body.empty()) std::memcpy(out.data() + kHeaderBytes, body.data(), body.size());
  SealFrame(type, request_id, status, reply, &out);
  return out;
}

void SealFrame(MessageType type, uint64_t request_id, int32_t status, bool reply,
               std::vector<uint8_t>* frame) {
  KVPOOL_CHECK(frame->size() >= kHeaderBytes);
  FrameHeader h;
  h.type = static_cast<uint16_t>(static_cast<uint16_t>(type) | (reply ? kReplyBit : 0));
  h.request_id = request_id;
  h.body_len = static_cast<uint32_t>(frame->size() - kHeaderBytes);
  h.status = status;
  EncodeHeader(h, frame->data());
}

void EncodeHello(const HelloRequest& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(m.client_version);
  w.Str(m.client_name);
  if (m.has_token) {
    w.Str(m.token_name);
    w.Raw(m.token.data(), m.token.size());
  }
}

Status DecodeHello(std::span<const uint8_t> body, HelloRequest* m) {
  BodyReader r(body);
  r.U32(&m->client_version) && r.Str(kMaxClientName, &m->client_name);
  m->has_token = r.ok() && r.remaining() > 0;
  if (m->has_token) {
    std::span<const uint8_t> secret;
    if (r.Str(kMaxClientName, &m->token_name) && r.Bytes(m->token.size(), &secret)) {
      std::copy(secret.begin(), secret.end(), m->token.begin());
    }
  }
  return r.Finish("hello");
}

void EncodeHelloReply(const HelloReply& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U64(m.instance_id);
  w.U64(m.segment_bytes);
  w.U64(m.max_value_bytes);
  w.U32(m.max_batch);
  w.U32(m.max_frame_bytes);
  w.U64(m.staging_bytes);
}

Status DecodeHelloReply(std::span<const uint8_t> body, HelloReply* m) {
  BodyReader r(body);
  r.U64(&m->instance_id) && r.U64(&m->segment_bytes) && r.U64(&m->max_value_bytes) &&
      r.U32(&m->max_batch) && r.U32(&m->max_frame_bytes) && r.U64(&m->staging_bytes);
  return r.Finish("hello reply");
}

void EncodeSizedKeys(std::span<const SizedKey> items, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(items.size()));
  for (const auto& i : items) {
    w.Key(i.key);
    w.U64(i.size);
  }
}

namespace {

// u32 n, n x {key, u64 size}; false (r failed) when malformed.
bool ReadSizedKeys(BodyReader& r, uint32_t max_batch, std::vector<SizedKey>* items) {
  uint32_t n = 0;
  if (!r.Count(max_batch, 24, &n)) return false;
  items->resize(n);
  for (auto& i : *items) {
    if (!r.Key(&i.key) || !r.U64(&i.size)) return false;
  }
  return true;
}

}  // namespace

Status DecodeSizedKeys(std::span<const uint8_t> body, uint32_t max_batch,
                       std::vector<SizedKey>* items, std::span<const uint8_t>* rest) {
  BodyReader r(body);
  ReadSizedKeys(r, max_batch, items);
  if (rest != nullptr) {
    if (!r.ok()) return r.Finish("sized key list");
    r.Bytes(r.remaining(), rest);
  }
  return r.Finish("sized key list");
}

void EncodeDescribedSizedKeys(std::span<const SizedKey> items,
                              std::span<const KeyDescriptor> descriptors,
                              std::vector<uint8_t>* out) {
  EncodeSizedKeys(items, out);
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(descriptors.size()));
  for (const auto& d : descriptors) {
    w.Key(d.key);
    w.U32(static_cast<uint32_t>(d.descriptor.size()));
    w.Raw(d.descriptor.data(), d.descriptor.size());
  }
}

Status DecodeDescribedSizedKeys(std::span<const uint8_t> body, uint32_t max_batch,
                                std::vector<SizedKey>* items,
                                std::vector<std::span<const uint8_t>>* descriptors,
                                std::span<const uint8_t>* rest) {
  BodyReader r(body);
  ReadSizedKeys(r, max_batch, items);
  const auto n = static_cast<uint32_t>(items->size());
  descriptors->assign(items->size(), {});
  // Descriptors usually come in item order: each is looked for at the item
  // after the last one's, and through an index of the items otherwise.
  std::unordered_map<KeyId, size_t, KeyIdHash> index;
  size_t hint = 0;
  uint32_t m = 0;
  if (r.Count(n, 20, &m)) {
    for (uint32_t j = 0; j < m; ++j) {
      KeyId key;
      uint32_t len = 0;
      std::span<const uint8_t> bytes;
      if (!r.Key(&key) || !r.U32(&len)) break;
      if (len > kMaxDescriptorBytes) {
        return InvalidArgument(
            fmt::format("descriptor of key {:016x}{:016x}: {} bytes, over the limit of {}", key.hi,
                        key.lo, len, kMaxDescriptorBytes));
      }
      if (!r.Bytes(len, &bytes)) break;
      size_t at = hint;
      if (at >= n || (*items)[at].key != key) {
        if (index.empty()) {
          for (size_t i = n; i-- > 0;) index[(*items)[i].key] = i;  // the first of duplicates
        }
        auto it = index.find(key);
        at = it == index.end() ? n : it->second;
      }
      if (at == n) {
        return InvalidArgument(fmt::format(
            "descriptor of key {:016x}{:016x}, which is not in the request", key.hi, key.lo));
      }
      if (!(*descriptors)[at].empty()) {
        return InvalidArgument(fmt::format("key {:016x}{:016x} described twice", key.hi, key.lo));
      }
      if (len == 0) return InvalidArgument("an empty descriptor");
      (*descriptors)[at] = bytes;
      hint = at + 1;
    }
  }
  if (rest != nullptr) {
    if (!r.ok()) return r.Finish("described key list");
    r.Bytes(r.remaining(), rest);
  }
  return r.Finish("described key list");
}

void EncodeLookupPrefix(uint32_t timeout_ms, std::span<const uint64_t> hashes,
                        std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(timeout_ms);
  w.U32(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) w.U64(h);
}

Status DecodeLookupPrefix(std::span<const uint8_t> body, uint32_t max_hashes, uint32_t* timeout_ms,
                          std::vector<uint64_t>* hashes) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.U32(timeout_ms) && r.Count(max_hashes, 8, &n)) {
    hashes->resize(n);
    for (uint64_t& h : *hashes) r.U64(&h);
  }
  return r.Finish("prefix lookup");
}

void EncodeHint(const HintRequest& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(m.op);
  w.U32(m.priority);
  w.U64(m.ttl_ms);
  w.U32(static_cast<uint32_t>(m.keys.size()));
  for (const auto& k : m.keys) w.Key(k);
}

Status DecodeHint(std::span<const uint8_t> body, uint32_t max_batch, HintRequest* m) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.U32(&m->op) && r.U32(&m->priority) && r.U64(&m->ttl_ms) && r.Count(max_batch, 16, &n)) {
    m->keys.resize(n);
    for (auto& k : m->keys) {
      if (!r.Key(&k)) break;
    }
  }
  return r.Finish("hint");
}

void EncodeHintReply(const HintReply& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U64(m.applied);
  w.U64(m.unknown);
  w.U64(m.clipped);
  w.U64(m.moved);
}

Status DecodeHintReply(std::span<const uint8_t> body, HintReply* m) {
  BodyReader r(body);
  (void)(r.U64(&m->applied) && r.U64(&m->unknown) && r.U64(&m->clipped) && r.U64(&m->moved));
  return r.Finish("hint reply");
}

void EncodeKeys(std::span<const KeyId> keys, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.Key(k);
}

Status DecodeKeys(std::span<const uint8_t> body, uint32_t max_batch, std::vector<KeyId>* keys) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.Count(max_batch, 16, &n)) {
    keys->resize(n);
    for (auto& k : *keys) {
      if (!r.Key(&k)) break;
    }
  }
  return r.Finish("key list");
}

void EncodeHandles(std::span<const uint64_t> handles, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(handles.size()));
  for (uint64_t h : handles) w.U64(h);
}

Status DecodeHandles(std::span<const uint8_t> body, uint32_t max_batch,
                     std::vector<uint64_t>* handles) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.Count(max_batch, 8, &n)) {
    handles->resize(n);
    for (auto& h : *handles) {
      if (!r.U64(&h)) break;
    }
  }
  return r.Finish("handle list");
}

void EncodeRegionItems(std::span<const RegionItem> items, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(items.size()));
  for (const auto& i : items) {
    w.I32(i.status);
    w.U64(i.handle);
    w.U64(i.offset);
    w.U64(i.size);
  }
}

Status DecodeRegionItems(std::span<const uint8_t> body, uint32_t max_batch,
                         std::vector<RegionItem>* items) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.Count(max_batch, 28, &n)) {
    items->resize(n);
    for (auto& i : *items) {
      if (!r.I32(&i.status) || !r.U64(&i.handle) || !r.U64(&i.offset) || !r.U64(&i.size)) break;
    }
  }
  return r.Finish("region list");
}

void EncodeStatuses(std::span<const int32_t> statuses, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(statuses.size()));
  for (int32_t s : statuses) w.I32(s);
}

Status DecodeStatuses(std::span<const uint8_t> body, uint32_t max_batch,
                      std::vector<int32_t>* statuses) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.Count(max_batch, 4, &n)) {
    statuses->resize(n);
    for (auto& s : *statuses) {
      if (!r.I32(&s)) break;
    }
  }
  return r.Finish("status list");
}

void EncodeExistsReply(const ExistsReply& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(m.hits.size()));
  w.U32(m.prefix_len);
  w.Raw(m.hits.data(), m.hits.size());
}

Status DecodeExistsReply(std::span<const uint8_t> body, uint32_t max_batch, ExistsReply* m) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.U32(&n)) {
    std::span<const uint8_t> hits;
    if (n > max_batch) return InvalidArgument("malformed exists reply: count over the batch limit");
    if (r.U32(&m->prefix_len) && r.Bytes(n, &hits)) {
      m->hits.assign(hits.begin(), hits.end());
      if (m->prefix_len > n) return InvalidArgument("malformed exists reply: prefix over count");
    }
  }
  return r.Finish("exists reply");
}

void EncodeGetItems(std::span<const GetItem> items, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(items.size()));
  for (const auto& i : items) {
    w.I32(i.status);
    w.U64(i.size);
  }
}

Status DecodeGetReply(std::span<const uint8_t> body, uint32_t max_batch,
                      std::vector<GetItem>* items, std::span<const uint8_t>* data) {
  BodyReader r(body);
  uint32_t n = 0;
  if (!r.Count(max_batch, 12, &n)) return r.Finish("get reply");
  items->resize(n);
  uint64_t total = 0;
  for (auto& i : *items) {
    if (!r.I32(&i.status) || !r.U64(&i.size)) return r.Finish("get reply");
    if (i.status == 0) {
      if (i.size > r.remaining()) return InvalidArgument("malformed get reply: value exceeds body");
      total += i.size;
    }
  }
  if (total != r.remaining()) return InvalidArgument("malformed get reply: value bytes do not add up");
  r.Bytes(r.remaining(), data);
  return r.Finish("get reply");
}

void EncodeString(std::string_view s, std::vector<uint8_t>* out) { BodyWriter(out).Str(s); }

Status DecodeString(std::span<const uint8_t> body, std::string* s) {
  BodyReader r(body);
  r.Str(kMaxString, s);
  return r.Finish("string");
}

void EncodeU32Body(uint32_t v, std::vector<uint8_t>* out) { BodyWriter(out).U32(v); }

Status DecodeU32Body(std::span<const uint8_t> body, uint32_t* v) {
  BodyReader r(body);
  r.U32(v);
  return r.Finish("u32 body");
}

void EncodeU64Body(uint64_t v, std::vector<uint8_t>* out) { BodyWriter(out).U64(v); }

Status DecodeU64Body(std::span<const uint8_t> body, uint64_t* v) {
  BodyReader r(body);
  r.U64(v);
  return r.Finish("u64 body");
}

}  // namespace kvpool::protocol
