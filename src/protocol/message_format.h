// Wire format of kvpool's local protocol (Unix socket) and, later, the peer
// protocol: every message is a fixed 24-byte header followed by a body.
// All integers are little-endian. docs/protocol.md describes the same.
//
// Header
// | offset | size | field       | meaning                                          |
// |--------|------|-------------|--------------------------------------------------|
// | 0      | 4    | magic       | 0x3150564B ("KVP1" in memory order)              |
// | 4      | 2    | version     | kProtocolVersion                                 |
// | 6      | 2    | type        | MessageType                                      |
// | 8      | 8    | request_id  | chosen by the requester, echoed in the reply      |
// | 16     | 4    | body_len    | bytes after the header; checked against limits    |
// | 20     | 4    | status      | replies: call-level StatusCode; requests: 0       |
//
// Bodies (n = item count, key = 16 bytes: hi u64, lo u64)
// | type          | request body                          | reply body |
// |---------------|---------------------------------------|----------------------------------------------|
// | Hello         | u32 client_version, str client_name,  | u64 instance_id, u64 segment_bytes, |
// |               | optional: str token_name, 32 B token  | | |               | | u64
// max_value_bytes, u32 max_batch,          | |               | | u32 max_frame_bytes, u64
// staging_bytes;      | |               |                                       | segment fd
// (SCM_RIGHTS), then the staging fd | |               |                                       |
// when staging_bytes > 0                       | | Reserve       | u32 n, n x {key, u64 size} | u32
// n, n x {i32 st, u64 handle, u64 off, u64 size} | |               | | (off: into the staging area
// if there is one) | | Commit        | u32 n, n x u64 handle                 | u32 n, n x i32 st |
// | Abort         | u32 n, n x u64 handle                 | (no reply) | | Acquire       | u32 n, n
// x key                        | u32 n, n x {i32 st, u64 handle, u64 off, u64 size} | | Release |
// u32 n, n x u64 handle                 | (no reply)                                   | | Exists
// | u32 n, n x key                        | u32 n, u32 prefix_len, n x u8 hit            | | Put |
// u32 n, n x {key, u64 size}, bytes     | u32 n, n x i32 st                            | | Get |
// u32 n, n x {key, u64 capacity}        | u32 n, n x {i32 st, u64 size}, bytes of OKs  | | Remove
// | u32 n, n x key                        | u32 n, n x i32 st                            | | Stats
// | (empty)                               | str json                                     | | Flush
// | (empty)                               | (empty; header status tells the outcome)     | | Clear
// | u32 namespace tag                     | u64 entries dropped                          | |
// ReserveDescr. | u32 n, n x {key, u64 size}, descs     | as Reserve | | PutDescribed  | u32 n, n x
// {key, u64 size}, descs,    | as Put                                       | |               |
// bytes                                 |                                              | |
// LookupPrefix  | u32 timeout_ms, u32 n, n x u64 hash   | str json (docs/kv-events.md, prefix
// lookups) | | Hint          | u32 op, u32 priority, u64 ttl_ms,     | u64 applied, u64 unknown,
// u64 clipped,       | |               | u32 n, n x key                        | u64 moved
// (docs/hints.md)                    | | Error         | -                                     |
// str message (header status holds the code)   | descs = u32 m (<= n), m x {key, str descriptor}:
// block descriptors (descriptor_format.h) of keys of the request, each key at most once; a
// descriptor naming a key not in the request fails the request.
// str = u32 length + bytes. A reply's type is the request's type | 0x8000.
#pragma once

#include <cstdint>

namespace kvpool::protocol {

inline constexpr uint32_t kMagic = 0x3150564B;
// 2: the hello reply carries staging_bytes (and a second fd), the hello an
// optional tenant token. 3: key ids carry their namespace's tag in their low
// 32 bits (common/key_id.h), and Clear; a client of version 2 derives other
// ids, so it is refused rather than left to miss.
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr uint32_t kHeaderBytes = 24;
inline constexpr uint16_t kReplyBit = 0x8000;

enum class MessageType : uint16_t {
  kHello = 1,
  kReserve = 2,
  kCommit = 3,
  kAbort = 4,
  kAcquire = 5,
  kRelease = 6,
  kExists = 7,
  kPut = 8,
  kGet = 9,
  kRemove = 10,
  kStats = 11,
  kFlush = 12,
  kClear = 13,  // drops every entry of one namespace (common/key_id.h: its tag)
  // Reserve and Put with block descriptors (descriptor_format.h) for the
  // node's KV events and prefix lookups. A node that predates them answers
  // an error.
  kReserveDescribed = 14,
  kPutDescribed = 15,
  // A router's prefix lookup (cluster/block_index.h): which nodes hold the
  // longest leading run of engine block hashes. Answered as JSON.
  kLookupPrefix = 16,
  // A cache hint on keys of the client's tenant (docs/hints.md; its op as
  // kvpool::HintOp, store/dram/dram_store.h).
  kHint = 17,
  kError = 0x7fff,
};

// Caps checked before anything is allocated. Node settings may lower them.
inline constexpr uint32_t kMaxBatch = 4096;          // items per request
inline constexpr uint32_t kMaxHintKeys = 8192;       // keys per Hint (one hint, applied whole)
inline constexpr uint32_t kMaxPreHandshakeFrame = 4096;
inline constexpr uint32_t kMaxClientName = 256;
inline constexpr uint32_t kMaxString = 1u << 20;     // stats JSON, error text
// Ranges of a staging area are multiples of this (a reserve batch fits when
// its values, each rounded up to it, add up to at most staging_bytes).
inline constexpr uint64_t kStagingAlign = 256;
// The staging bytes a value of `size` takes (at least one unit).
inline constexpr uint64_t StagingBytes(uint64_t size) {
  return size == 0 ? kStagingAlign : (size + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
}

struct FrameHeader {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t type = 0;
  uint64_t request_id = 0;
  uint32_t body_len = 0;
  int32_t status = 0;
};

}  // namespace kvpool::protocol
