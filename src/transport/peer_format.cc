#include "transport/peer_format.h"

#include "common/check.h"
#include "protocol/codec.h"

namespace kvpool::transport {

std::vector<uint8_t> EncodeFrame(const Frame& f, std::span<const uint8_t> header) {
  std::vector<uint8_t> out;
  out.reserve(kFrameBytes + header.size());
  protocol::BodyWriter w(&out);
  w.U32(kPeerMagic);
  w.U8(kPeerVersion);
  w.U8(static_cast<uint8_t>(f.kind));
  uint16_t type = f.type;
  w.Raw(&type, 2);
  w.U64(f.request_id);
  w.I32(f.status);
  w.U32(static_cast<uint32_t>(header.size()));
  w.U64(f.payload_len);
  w.U32(f.budget_ms);
  w.U32(f.conn);
  w.Raw(header.data(), header.size());
  return out;
}

void SetFrameConn(std::vector<uint8_t>* am_header, uint32_t conn) {
  KVPOOL_CHECK(am_header->size() >= kFrameBytes);
  for (int i = 0; i < 4; ++i) (*am_header)[36 + i] = static_cast<uint8_t>(conn >> (8 * i));
}

Status DecodeFrame(std::span<const uint8_t> am_header, size_t am_data_len, size_t max_header,
                   size_t max_payload, Frame* f, std::span<const uint8_t>* header,
                   const char** reason) {
  auto fail = [&](const char* why) {
    *reason = why;
    return InvalidArgument(why);
  };
  if (am_header.size() < kFrameBytes) return fail("short_frame");
  protocol::BodyReader r(am_header);
  uint32_t magic = 0;
  uint8_t version = 0, kind = 0, type_lo = 0, type_hi = 0;
  r.U32(&magic);
  r.U8(&version);
  r.U8(&kind);
  r.U8(&type_lo);
  r.U8(&type_hi);
  r.U64(&f->request_id);
  r.I32(&f->status);
  r.U32(&f->header_len);
  r.U64(&f->payload_len);
  r.U32(&f->budget_ms);
  r.U32(&f->conn);
  if (!r.ok()) return fail("short_frame");
  if (magic != kPeerMagic) return fail("bad_magic");
  if (version != kPeerVersion) return fail("bad_version");
  if (kind != static_cast<uint8_t>(FrameKind::kRequest) &&
      kind != static_cast<uint8_t>(FrameKind::kReply)) {
    return fail("bad_kind");
  }
  f->kind = static_cast<FrameKind>(kind);
  f->type = static_cast<uint16_t>(type_lo | (type_hi << 8));
  if (f->header_len > max_header) return fail("header_too_large");
  if (f->header_len != r.remaining()) return fail("header_length_mismatch");
  if (f->payload_len > max_payload) return fail("payload_too_large");
  if (f->payload_len != am_data_len) return fail("payload_length_mismatch");
  if (!r.Bytes(f->header_len, header)) return fail("short_frame");
  *reason = "";
  return Status::Ok();
}

}  // namespace kvpool::transport
