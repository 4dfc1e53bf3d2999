#include "protocol/descriptor_format.h"

#include <fmt/format.h>

#include "protocol/codec.h"

namespace kvpool::protocol {
namespace {

using Kind = EngineHash::Kind;

Status CheckHash(const EngineHash& h, const char* what, bool may_be_none) {
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

Status Check(const BlockDescriptor& d) {
  KVPOOL_RETURN_IF_ERROR(CheckHash(d.hash, "hash", false));
  KVPOOL_RETURN_IF_ERROR(CheckHash(d.parent, "parent hash", true));
  if (d.block_size < 1 || d.block_size > kMaxDescriptorBlockSize) {
    return InvalidArgument(fmt::format("block descriptor: block_size {} is not 1 to {}",
                                       d.block_size, kMaxDescriptorBlockSize));
  }
  if (!d.token_ids.empty() && d.token_ids.size() != d.block_size) {
    return InvalidArgument(
        fmt::format("block descriptor: {} token ids for a block of {} (0 or block_size)",
                    d.token_ids.size(), d.block_size));
  }
  if (d.token_ids.size() > kMaxDescriptorTokens) {
    return InvalidArgument(
        fmt::format("block descriptor: more than {} token ids", kMaxDescriptorTokens));
  }
  if (d.group_idx < -1) return InvalidArgument("block descriptor: group_idx below -1");
  if (d.lora_name.size() > 255 || d.spec_kind.size() > 255) {
    return InvalidArgument("block descriptor: a name over 255 bytes");
  }
  return Status::Ok();
}

void PutHash(BodyWriter& w, const EngineHash& h) {
  w.U8(static_cast<uint8_t>(h.kind));
  if (h.kind == Kind::kUint64 || h.kind == Kind::kInt64) {
    w.U64(h.value);
  } else if (h.kind == Kind::kBytes) {
    w.U8(static_cast<uint8_t>(h.bytes.size()));
    w.Raw(h.bytes.data(), h.bytes.size());
  }
}

void PutShortStr(BodyWriter& w, const std::string& s) {
  w.U8(static_cast<uint8_t>(s.size()));
  w.Raw(s.data(), s.size());
}

bool GetHash(BodyReader& r, EngineHash* h) {
  uint8_t kind = 0;
  if (!r.U8(&kind)) return false;
  h->kind = static_cast<Kind>(kind);
  if (kind == 1 || kind == 2) return r.U64(&h->value);
  if (kind == 3) {
    uint8_t len = 0;
    std::span<const uint8_t> b;
    if (!r.U8(&len) || !r.Bytes(len, &b)) return false;
    h->bytes.assign(reinterpret_cast<const char*>(b.data()), b.size());
  }
  return true;
}

bool GetShortStr(BodyReader& r, std::string* s) {
  uint8_t len = 0;
  std::span<const uint8_t> b;
  if (!r.U8(&len) || !r.Bytes(len, &b)) return false;
  s->assign(reinterpret_cast<const char*>(b.data()), b.size());
  return true;
}

}  // namespace

Result<std::string> EncodeDescriptor(const BlockDescriptor& d) {
  KVPOOL_RETURN_IF_ERROR(Check(d));
  std::vector<uint8_t> out;
  BodyWriter w(&out);
  w.U8(kDescriptorVersion);
  PutHash(w, d.hash);
  PutHash(w, d.parent);
  w.U32(d.block_size);
  w.U32(static_cast<uint32_t>(d.token_ids.size()));
  for (uint32_t t : d.token_ids) w.U32(t);
  w.I32(d.group_idx);
  PutShortStr(w, d.lora_name);
  PutShortStr(w, d.spec_kind);
  return std::string(out.begin(), out.end());
}

Status DecodeDescriptor(std::span<const uint8_t> bytes, BlockDescriptor* d) {
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
  *d = BlockDescriptor{};
  uint32_t n_tokens = 0;
  if (GetHash(r, &d->hash) && GetHash(r, &d->parent) && r.U32(&d->block_size) && r.U32(&n_tokens)) {
    if (n_tokens > kMaxDescriptorTokens || uint64_t{n_tokens} * 4 > r.remaining()) {
      return InvalidArgument(fmt::format("block descriptor: {} token ids do not fit", n_tokens));
    }
    d->token_ids.resize(n_tokens);
    for (uint32_t& t : d->token_ids) r.U32(&t);
    r.I32(&d->group_idx);
    GetShortStr(r, &d->lora_name);
    GetShortStr(r, &d->spec_kind);
  }
  KVPOOL_RETURN_IF_ERROR(r.Finish("block descriptor"));
  return Check(*d);
}

}  // namespace kvpool::protocol
