// Authenticated encryption of the messages of one peer connection
// (--peer-encryption), with the per-direction keys its handshake derived
// (peer_auth.h).
//
// AES-256-GCM (OpenSSL) over each message: the 40-byte frame
// (peer_format.h) is authenticated but stays readable, because the receiver
// needs it to find the connection and to size the payload's buffer before
// the payload arrives; the message header and the payload are encrypted
// under one tag. A sealed message's AM header is
//
//   | frame (header_len counts the trailer) | encrypted header | counter 8 | tag 16 |
//
// and its AM data is the encrypted payload, as long as the plain one. The
// counter numbers a direction's messages from 1 and is the GCM nonce (four
// zero bytes, then the counter), so no nonce repeats under a key; a
// receiver accepts each counter once, within a window of the last
// kSealWindow counters (messages of one connection may complete out of
// order: a large payload lands after small ones sent later), and refuses a
// repeated or older one. A receiver that refuses a message closes the
// connection.
//
// One seal belongs to one connection and is used by one thread (the
// transport's progress thread). Not thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

namespace kvpool::transport {

inline constexpr size_t kSealKeyBytes = 32;
inline constexpr size_t kSealTagBytes = 16;
inline constexpr size_t kSealTrailerBytes = 8 + kSealTagBytes;
inline constexpr uint64_t kSealWindow = 1024;

class PeerSeal {
 public:
  // send_key seals what this side sends, recv_key opens what it receives.
  static Result<std::unique_ptr<PeerSeal>> Make(std::span<const uint8_t, kSealKeyBytes> send_key,
                                                std::span<const uint8_t, kSealKeyBytes> recv_key);
  ~PeerSeal();
  PeerSeal(const PeerSeal&) = delete;
  PeerSeal& operator=(const PeerSeal&) = delete;

  // Seals one message. *am_header holds a frame and the plain header bytes:
  // they are encrypted in place, the trailer appended and the frame's
  // header_len raised to match. The payload is encrypted into payload_out
  // (payload.size() bytes; may be payload.data() itself).
  Status Seal(std::vector<uint8_t>* am_header, std::span<const uint8_t> payload,
              uint8_t* payload_out);

  // The first check of a received message, before its payload is read:
  // the header holds a trailer and the counter is neither repeated nor
  // older than the window. *reason: "bad_seal" or "replayed_message".
  bool Plausible(std::span<const uint8_t> sealed_header, const char** reason) const;

  // Opens one message: `frame` is its 40 frame bytes as received,
  // `sealed_header` the header bytes after them (the trailer included).
  // The plain header goes to *header_out, the payload is decrypted from
  // payload_in into payload_out (may be the same). On failure nothing is
  // accepted and *reason is "bad_seal" (tampered, forged or mis-sized) or
  // "replayed_message"; the bytes written to payload_out are then garbage.
  Status Open(std::span<const uint8_t> frame, std::span<const uint8_t> sealed_header,
              std::vector<uint8_t>* header_out, const uint8_t* payload_in, uint8_t* payload_out,
              size_t payload_len, const char** reason);

  uint64_t sent() const { return next_send_ - 1; }

 private:
  PeerSeal() = default;
  bool Seen(uint64_t counter) const;
  void Mark(uint64_t counter);

  EVP_CIPHER_CTX* send_ = nullptr;
  EVP_CIPHER_CTX* recv_ = nullptr;
  uint64_t next_send_ = 1;
  uint64_t highest_ = 0;  // the highest counter accepted (0: none yet)
  // Bit i of the window: counter highest_ - i was accepted.
  std::array<uint64_t, kSealWindow / 64> window_{};
};

}  // namespace kvpool::transport
