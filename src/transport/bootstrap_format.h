// Wire format of the peer port's bootstrap: the only bytes a kvpool node
// reads from a TCP connection to its peer port. A connector sends a hello;
// the listener answers a welcome with its UCX worker address and a
// connection token, or a refusal with a reason. Between nodes that hold a
// cluster key, the hello carries the connector's half of a mutual
// authentication and the listener first answers a challenge, which the
// connector answers with a proof (peer_auth.h); only then comes the welcome. The connector then creates
// its UCX endpoint to that address and sends requests on it, each carrying
// the token (peer_format.h, field `conn`): that is how the listener knows
// which connection a request belongs to. The listener answers on the reply
// endpoint UCX gives it with each request; it never hands bytes a connector
// sent to UCX, so nothing sent to the peer port reaches UCX's address
// parser or makes the node connect anywhere. The TCP
// connection stays open, silent, for the life of the peer connection: its
// close is how either side learns at once that the other went away, and any
// byte on it after the bootstrap is a protocol error that closes it.
//
// Every message is a fixed 16-byte header and a body. All integers
// little-endian.
//
// | offset | size | field    | meaning                                               |
// |--------|------|----------|-------------------------------------------------------|
// | 0      | 4    | magic    | 0x4250564B ("KVPB" in memory order)                   |
// | 4      | 1    | version  | kBootstrapVersion                                     |
// | 5      | 1    | kind     | 1 hello, 2 welcome, 3 refuse, 4 challenge, 5 proof    |
// | 6      | 2    | reserved | 0                                                     |
// | 8      | 4    | token    | welcome: nonzero connection token; otherwise 0        |
// | 12     | 4    | body_len | bytes after the header, <= kMaxBootstrapBody          |
// | 16     | n    | body     | hello: empty, or an AuthHello (<= kMaxHelloBody);     |
// |        |      |          | welcome: the listener's UCX worker address (>= 1      |
// |        |      |          | byte); refuse: the reason, UTF-8, starting with       |
// |        |      |          | kRefusedPermission when credentials were refused;     |
// |        |      |          | challenge: an AuthChallenge (>= 1 byte); proof: an    |
// |        |      |          | AuthProof (kProofBody bytes)                          |
//
// A listener reads at most 16 + kMaxHelloBody bytes at a time from a
// connection it has not welcomed (a hello, then with keys a proof), all
// within one deadline, before it either welcomes it or closes it; nothing
// is allocated on the word of a length before it is checked.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpool::transport {

inline constexpr uint32_t kBootstrapMagic = 0x4250564B;
inline constexpr uint8_t kBootstrapVersion = 1;
inline constexpr size_t kBootstrapHeaderBytes = 16;
inline constexpr size_t kMaxBootstrapBody = 4096;
// An AuthHello: key id, nonce, u32-prefixed identity of at most 256 bytes.
inline constexpr size_t kMaxHelloBody = 8 + 32 + 4 + 256;
inline constexpr size_t kProofBody = 32;
// How a refusal for missing or wrong credentials begins.
inline constexpr std::string_view kRefusedPermission = "permission denied: ";

enum class BootstrapKind : uint8_t {
  kHello = 1,
  kWelcome = 2,
  kRefuse = 3,
  kChallenge = 4,
  kProof = 5,
};

struct BootstrapMessage {
  BootstrapKind kind = BootstrapKind::kHello;
  uint32_t token = 0;
  std::vector<uint8_t> body;
};

// REQUIRES: m.body.size() <= kMaxBootstrapBody.
std::vector<uint8_t> EncodeBootstrap(const BootstrapMessage& m);

// What a prefix of a byte stream holds.
enum class BootstrapParse {
  kNeedMore,  // a valid prefix; read more
  kDone,      // *m holds one whole message of *consumed bytes
  kInvalid,   // not a bootstrap message; *reason names the check (a metric label)
};

// Parses the first message of `bytes`. Checks magic, version, kind, reserved,
// the token rule and body_len before it looks at the body.
BootstrapParse ParseBootstrap(std::span<const uint8_t> bytes, BootstrapMessage* m,
                              size_t* consumed, const char** reason);

}  // namespace kvpool::transport
