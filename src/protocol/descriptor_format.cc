#include "protocol/descriptor_format.h"

#include <fmt/format.h>

#include "protocol/codec.h"

namespace kvpool::protocol {
namespace {

using Kind = EngineHash::Kind;

Status CheckHash(const EngineHashView& h, const char* what, bool may_be_none) {
  switch (h.kind) {
    case Kind::kNone:
      if (may_be_none) return Status::Ok();
      return InvalidArgument(fmt::format("block descriptor: no {}", what));
    case Kind::kUint64:
    case Kind::kInt64:
      return Status::Ok();
    case Kind::kBytes:
      if (h.bytes.empty() || h.bytes.size() > kMaxDescriptorHashBytes) {
        return InvalidArgument(fmt::format("block descriptor: a bytes {} must be 1 to {} bytes",
                                           what, kMaxDescriptorHashBytes));
      }
      return Status::Ok();
  }
  return InvalidArgument(fmt::format("block descriptor: unknown {} kind", what));
}

Status Check(const DescriptorView& d) {
  KVPOOL_RETURN_IF_ERROR(CheckHash(d.hash, "hash", false));
  KVPOOL_RETURN_IF_ERROR(CheckHash(d.parent, "parent hash", true));
  if (d.block_size < 1 || d.block_size > kMaxDescriptorBlockSize) {
    return InvalidArgument(fmt::format("block descriptor: block_size {} is not 1 to {}",
                                       d.block_size, kMaxDescriptorBlockSize));
  }
  if (d.n_tokens != 0 && d.n_tokens != d.block_size) {
    return InvalidArgument(
        fmt::format("block descriptor: {} token ids for a block of {} (0 or block_size)",
                    d.n_tokens, d.block_size));
  }
  if (d.group_idx < -1) return InvalidArgument("block descriptor: group_idx below -1");
  return Status::Ok();
}

void PutHash(BodyWriter& w, const EngineHash& h) {
  w.U8(static_cast<uint8_t>(h.kind));
  if (h.kind == Kind::kUint64 || h.kind == Kind::kInt64) {
    w.U64(h.value);
  } else if (h.kind == Kind::kBytes) {
    w.U8(static_cast<uint8_t>(std::min<size_t>(h.bytes.size(), 255)));
    w.Raw(h.bytes.data(), std::min<size_t>(h.bytes.size(), 255));
  }
}

std::string_view View(std::span<const uint8_t> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

bool GetHash(BodyReader& r, EngineHashView* h) {
  uint8_t kind = 0;
  if (!r.U8(&kind)) return false;
  h->kind = static_cast<Kind>(kind);
  if (kind == 1 || kind == 2) return r.U64(&h->value);
  if (kind == 3) {
    uint8_t len = 0;
    std::span<const uint8_t> b;
    if (!r.U8(&len) || !r.Bytes(len, &b)) return false;
    h->bytes = View(b);
  }
  return true;
}

bool GetShortStr(BodyReader& r, std::string_view* s) {
  uint8_t len = 0;
  std::span<const uint8_t> b;
  if (!r.U8(&len) || !r.Bytes(len, &b)) return false;
  *s = View(b);
  return true;
}

EngineHash Own(const EngineHashView& h) { return {h.kind, h.value, std::string(h.bytes)}; }

}  // namespace

Result<std::string> EncodeDescriptor(const BlockDescriptor& d) {
  if (d.token_ids.size() > kMaxDescriptorTokens) {
    return InvalidArgument(
        fmt::format("block descriptor: more than {} token ids", kMaxDescriptorTokens));
  }
  if (d.lora_name.size() > 255 || d.spec_kind.size() > 255 ||
      d.hash.bytes.size() > kMaxDescriptorHashBytes ||
      d.parent.bytes.size() > kMaxDescriptorHashBytes) {
    return InvalidArgument(
        d.lora_name.size() > 255 || d.spec_kind.size() > 255
            ? "block descriptor: a name over 255 bytes"
            : fmt::format("block descriptor: a bytes hash must be 1 to {} bytes",
                          kMaxDescriptorHashBytes));
  }
  std::vector<uint8_t> out;
  BodyWriter w(&out);
  w.U8(kDescriptorVersion);
  PutHash(w, d.hash);
  PutHash(w, d.parent);
  w.U32(d.block_size);
  w.U32(static_cast<uint32_t>(d.token_ids.size()));
  for (uint32_t t : d.token_ids) w.U32(t);
  w.I32(d.group_idx);
  w.U8(static_cast<uint8_t>(d.lora_name.size()));
  w.Raw(d.lora_name.data(), d.lora_name.size());
  w.U8(static_cast<uint8_t>(d.spec_kind.size()));
  w.Raw(d.spec_kind.data(), d.spec_kind.size());
  // The rules are ParseDescriptor's: what it refuses is not encoded.
  DescriptorView v;
  KVPOOL_RETURN_IF_ERROR(ParseDescriptor(out, &v));
  return std::string(out.begin(), out.end());
}

Status ParseDescriptor(std::span<const uint8_t> bytes, DescriptorView* d) {
  if (bytes.size() > kMaxDescriptorBytes) {
    return InvalidArgument(fmt::format("block descriptor: {} bytes, over the limit of {}",
                                       bytes.size(), kMaxDescriptorBytes));
  }
  BodyReader r(bytes);
  uint8_t version = 0;
  if (!r.U8(&version)) return r.Finish("block descriptor");
  if (version != kDescriptorVersion) {
    return InvalidArgument(fmt::format("block descriptor: version {} (this node reads {})", version,
                                       kDescriptorVersion));
  }
  *d = DescriptorView{};
  if (GetHash(r, &d->hash) && GetHash(r, &d->parent) && r.U32(&d->block_size) &&
      r.U32(&d->n_tokens)) {
    if (d->n_tokens > kMaxDescriptorTokens || uint64_t{d->n_tokens} * 4 > r.remaining()) {
      return InvalidArgument(
          fmt::format("block descriptor: {} token ids do not fit", d->n_tokens));
    }
    std::span<const uint8_t> tokens;
    r.Bytes(size_t{d->n_tokens} * 4, &tokens);
    d->tokens = tokens.data();
    r.I32(&d->group_idx);
    GetShortStr(r, &d->lora_name);
    GetShortStr(r, &d->spec_kind);
  }
  KVPOOL_RETURN_IF_ERROR(r.Finish("block descriptor"));
  return Check(*d);
}

Status DecodeDescriptor(std::span<const uint8_t> bytes, BlockDescriptor* d) {
  DescriptorView v;
  KVPOOL_RETURN_IF_ERROR(ParseDescriptor(bytes, &v));
  d->hash = Own(v.hash);
  d->parent = Own(v.parent);
  d->block_size = v.block_size;
  d->token_ids.resize(v.n_tokens);
  for (uint32_t i = 0; i < v.n_tokens; ++i) d->token_ids[i] = v.token(i);
  d->group_idx = v.group_idx;
  d->lora_name.assign(v.lora_name);
  d->spec_kind.assign(v.spec_kind);
  return Status::Ok();
}

}  // namespace kvpool::protocol
