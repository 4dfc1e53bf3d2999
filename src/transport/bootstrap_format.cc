#include "transport/bootstrap_format.h"

#include "common/check.h"
#include "protocol/codec.h"

namespace kvpool::transport {

std::vector<uint8_t> EncodeBootstrap(const BootstrapMessage& m) {
  KVPOOL_CHECK(m.body.size() <= kMaxBootstrapBody);
  std::vector<uint8_t> out;
  out.reserve(kBootstrapHeaderBytes + m.body.size());
  protocol::BodyWriter w(&out);
  w.U32(kBootstrapMagic);
  w.U8(kBootstrapVersion);
  w.U8(static_cast<uint8_t>(m.kind));
  w.U8(0);
  w.U8(0);
  w.U32(m.token);
  w.U32(static_cast<uint32_t>(m.body.size()));
  w.Raw(m.body.data(), m.body.size());
  return out;
}

BootstrapParse ParseBootstrap(std::span<const uint8_t> bytes, BootstrapMessage* m,
                              size_t* consumed, const char** reason) {
  auto invalid = [&](const char* why) {
    *reason = why;
    return BootstrapParse::kInvalid;
  };
  *reason = "";
  // Each field is checked as soon as its bytes are there, so a connection
  // that opens with garbage is refused at its first bytes, not at 16.
  protocol::BodyReader r(bytes.first(std::min(bytes.size(), kBootstrapHeaderBytes)));
  uint32_t magic = 0;
  if (!r.U32(&magic)) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] != ((kBootstrapMagic >> (8 * i)) & 0xFF)) return invalid("bad_magic");
    }
    return BootstrapParse::kNeedMore;
  }
  if (magic != kBootstrapMagic) return invalid("bad_magic");
  uint8_t version = 0, kind = 0, res0 = 0, res1 = 0;
  if (!r.U8(&version)) return BootstrapParse::kNeedMore;
  if (version != kBootstrapVersion) return invalid("bad_version");
  if (!r.U8(&kind)) return BootstrapParse::kNeedMore;
  if (kind < static_cast<uint8_t>(BootstrapKind::kHello) ||
      kind > static_cast<uint8_t>(BootstrapKind::kProof)) {
    return invalid("bad_kind");
  }
  if (!r.U8(&res0)) return BootstrapParse::kNeedMore;
  if (res0 != 0) return invalid("bad_reserved");
  if (!r.U8(&res1)) return BootstrapParse::kNeedMore;
  if (res1 != 0) return invalid("bad_reserved");
  uint32_t token = 0, body_len = 0;
  if (!r.U32(&token) || !r.U32(&body_len)) return BootstrapParse::kNeedMore;
  auto k = static_cast<BootstrapKind>(kind);
  if ((k == BootstrapKind::kWelcome) != (token != 0)) return invalid("bad_token");
  if (body_len > kMaxBootstrapBody) return invalid("body_too_large");
  if (k == BootstrapKind::kHello && body_len > kMaxHelloBody) return invalid("hello_too_large");
  if (k == BootstrapKind::kWelcome && body_len == 0) return invalid("empty_address");
  if (k == BootstrapKind::kChallenge && body_len == 0) return invalid("empty_challenge");
  if (k == BootstrapKind::kProof && body_len != kProofBody) return invalid("bad_proof_length");
  if (bytes.size() < kBootstrapHeaderBytes + body_len) return BootstrapParse::kNeedMore;
  m->kind = k;
  m->token = token;
  const uint8_t* b = bytes.data() + kBootstrapHeaderBytes;
  m->body.assign(b, b + body_len);
  *consumed = kBootstrapHeaderBytes + body_len;
  return BootstrapParse::kDone;
}

}  // namespace kvpool::transport
