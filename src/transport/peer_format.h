// Wire format of a peer message as the UCX transport carries it. A message is
// one UCX active message: the AM header holds a fixed 40-byte frame followed
// by the message header bytes; the AM data holds the payload (sent eagerly
// when small, by UCX rendezvous when large, so it can land in the receiver's
// buffer directly). All integers little-endian.
//
// | offset | size | field       | meaning                                             |
// |--------|------|-------------|-----------------------------------------------------|
// | 0      | 4    | magic       | 0x5450564B ("KVPT" in memory order)                  |
// | 4      | 1    | version     | kPeerVersion                                        |
// | 5      | 1    | kind        | 1 request, 2 reply                                  |
// | 6      | 2    | type        | application MessageType (echoed in the reply)       |
// | 8      | 8    | request_id  | chosen by the caller, echoed in the reply            |
// | 16     | 4    | status      | reply: StatusCode; request: 0                        |
// | 20     | 4    | header_len  | bytes after the frame; == AM header length - 40      |
// | 24     | 8    | payload_len | == AM data length; <= max payload bytes              |
// | 32     | 4    | budget_ms   | request: time left to the caller's deadline          |
// | 36     | 4    | conn        | request: the connection token of the bootstrap's     |
// |        |      |             | welcome (bootstrap_format.h); reply: 0               |
//
// A reply whose status is not OK carries the error message as its header
// bytes and no payload. Request AMs use id kAmRequest, replies kAmReply.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace kvpool::transport {

inline constexpr uint32_t kPeerMagic = 0x5450564B;
inline constexpr uint8_t kPeerVersion = 2;
inline constexpr size_t kFrameBytes = 40;
inline constexpr uint16_t kAmRequest = 0x4B50;
inline constexpr uint16_t kAmReply = 0x4B51;

enum class FrameKind : uint8_t { kRequest = 1, kReply = 2 };

struct Frame {
  FrameKind kind = FrameKind::kRequest;
  uint16_t type = 0;
  uint64_t request_id = 0;
  int32_t status = 0;
  uint32_t header_len = 0;
  uint64_t payload_len = 0;
  uint32_t budget_ms = 0;
  uint32_t conn = 0;
};

// Appends the frame and then the header bytes: the whole AM header.
std::vector<uint8_t> EncodeFrame(const Frame& f, std::span<const uint8_t> header);

// Sets the conn field of an encoded frame (a request's token is known only
// once its connection's bootstrap is done). REQUIRES: am_header holds a frame.
void SetFrameConn(std::vector<uint8_t>* am_header, uint32_t conn);

// Parses an AM header; checks magic, version, kind, that header_len matches
// the bytes present and is <= max_header, and that payload_len equals the AM
// data length and is <= max_payload. On success *header views the header
// bytes. `reason` names the failed check (a metrics label).
Status DecodeFrame(std::span<const uint8_t> am_header, size_t am_data_len, size_t max_header,
                   size_t max_payload, Frame* f, std::span<const uint8_t>* header,
                   const char** reason);

}  // namespace kvpool::transport
