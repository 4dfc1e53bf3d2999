#include "transport/peer_seal.h"

#include <openssl/evp.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "transport/peer_format.h"

namespace kvpool::transport {

namespace {

constexpr size_t kHeaderLenAt = 20;  // the frame's header_len field
constexpr size_t kIvBytes = 12;
// EVP updates take an int length.
constexpr size_t kMaxUpdate = size_t{1} << 30;

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

std::array<uint8_t, kIvBytes> Iv(uint64_t counter) {
  std::array<uint8_t, kIvBytes> iv{};
  PutU64(iv.data() + 4, counter);
  return iv;
}

// Runs in through the context into out (which may be in), in int-sized steps.
bool Update(EVP_CIPHER_CTX* ctx, bool encrypt, const uint8_t* in, uint8_t* out, size_t len) {
  while (len > 0) {
    size_t n = std::min(len, kMaxUpdate);
    int done = 0;
    int ok = encrypt ? EVP_EncryptUpdate(ctx, out, &done, in, static_cast<int>(n))
                     : EVP_DecryptUpdate(ctx, out, &done, in, static_cast<int>(n));
    if (ok != 1 || done != static_cast<int>(n)) return false;
    in += n;
    out += n;
    len -= n;
  }
  return true;
}

bool Aad(EVP_CIPHER_CTX* ctx, bool encrypt, std::span<const uint8_t> aad) {
  int done = 0;
  int ok = encrypt ? EVP_EncryptUpdate(ctx, nullptr, &done, aad.data(), static_cast<int>(aad.size()))
                   : EVP_DecryptUpdate(ctx, nullptr, &done, aad.data(), static_cast<int>(aad.size()));
  return ok == 1;
}

}  // namespace

Result<std::unique_ptr<PeerSeal>> PeerSeal::Make(std::span<const uint8_t, kSealKeyBytes> send_key,
                                                 std::span<const uint8_t, kSealKeyBytes> recv_key) {
  std::unique_ptr<PeerSeal> s(new PeerSeal());
  s->send_ = EVP_CIPHER_CTX_new();
  s->recv_ = EVP_CIPHER_CTX_new();
  if (s->send_ == nullptr || s->recv_ == nullptr) {
    return ResourceExhausted("no memory for a connection's cipher");
  }
  // The keys are set once; each message sets only its nonce.
  if (EVP_EncryptInit_ex(s->send_, EVP_aes_256_gcm(), nullptr, send_key.data(), nullptr) != 1 ||
      EVP_DecryptInit_ex(s->recv_, EVP_aes_256_gcm(), nullptr, recv_key.data(), nullptr) != 1) {
    return Internal("AES-256-GCM is not available from OpenSSL");
  }
  return s;
}

PeerSeal::~PeerSeal() {
  EVP_CIPHER_CTX_free(send_);
  EVP_CIPHER_CTX_free(recv_);
}

Status PeerSeal::Seal(std::vector<uint8_t>* am_header, std::span<const uint8_t> payload,
                      uint8_t* payload_out) {
  if (am_header->size() < kFrameBytes) return Internal("sealing a message without a frame");
  const size_t header_bytes = am_header->size() - kFrameBytes;
  uint64_t counter = next_send_++;
  uint8_t* len_at = am_header->data() + kHeaderLenAt;
  uint32_t sealed_len = static_cast<uint32_t>(header_bytes + kSealTrailerBytes);
  for (int i = 0; i < 4; ++i) len_at[i] = static_cast<uint8_t>(sealed_len >> (8 * i));
  am_header->resize(am_header->size() + kSealTrailerBytes);
  uint8_t* h = am_header->data();
  auto iv = Iv(counter);
  int done = 0;
  uint8_t scratch[kSealTagBytes];  // GCM's final writes nothing
  bool ok = EVP_EncryptInit_ex(send_, nullptr, nullptr, nullptr, iv.data()) == 1 &&
            Aad(send_, true, {h, kFrameBytes}) &&
            Update(send_, true, h + kFrameBytes, h + kFrameBytes, header_bytes) &&
            Update(send_, true, payload.data(), payload_out, payload.size()) &&
            EVP_EncryptFinal_ex(send_, scratch, &done) == 1;
  uint8_t* trailer = h + kFrameBytes + header_bytes;
  PutU64(trailer, counter);
  ok = ok && EVP_CIPHER_CTX_ctrl(send_, EVP_CTRL_GCM_GET_TAG, kSealTagBytes, trailer + 8) == 1;
  return ok ? Status::Ok() : Internal("sealing a peer message failed");
}

bool PeerSeal::Seen(uint64_t counter) const {
  if (counter == 0) return true;
  if (counter > highest_) return false;
  uint64_t back = highest_ - counter;
  if (back >= kSealWindow) return true;  // too old to tell: refused
  return (window_[back / 64] >> (back % 64)) & 1;
}

void PeerSeal::Mark(uint64_t counter) {
  if (counter > highest_) {
    uint64_t shift = counter - highest_;
    highest_ = counter;
    if (shift >= kSealWindow) {
      window_.fill(0);
    } else {
      // Shift the whole bitmap towards older by `shift` bits.
      const size_t words = window_.size();
      const size_t w = shift / 64, b = shift % 64;
      for (size_t i = words; i-- > 0;) {
        uint64_t v = 0;
        if (i >= w) {
          v = window_[i - w] << b;
          if (b != 0 && i >= w + 1) v |= window_[i - w - 1] >> (64 - b);
        }
        window_[i] = v;
      }
    }
  }
  uint64_t back = highest_ - counter;
  window_[back / 64] |= uint64_t{1} << (back % 64);
}

bool PeerSeal::Plausible(std::span<const uint8_t> sealed_header, const char** reason) const {
  if (sealed_header.size() < kSealTrailerBytes) {
    *reason = "bad_seal";
    return false;
  }
  uint64_t counter = GetU64(sealed_header.data() + sealed_header.size() - kSealTrailerBytes);
  if (Seen(counter)) {
    *reason = "replayed_message";
    return false;
  }
  return true;
}

Status PeerSeal::Open(std::span<const uint8_t> frame, std::span<const uint8_t> sealed_header,
                      std::vector<uint8_t>* header_out, const uint8_t* payload_in,
                      uint8_t* payload_out, size_t payload_len, const char** reason) {
  if (frame.size() != kFrameBytes || !Plausible(sealed_header, reason)) {
    if (frame.size() != kFrameBytes) *reason = "bad_seal";
    return Corruption("peer message failed its integrity check");
  }
  const size_t header_bytes = sealed_header.size() - kSealTrailerBytes;
  const uint8_t* trailer = sealed_header.data() + header_bytes;
  uint64_t counter = GetU64(trailer);
  auto iv = Iv(counter);
  header_out->resize(header_bytes);
  uint8_t tag[kSealTagBytes];
  std::memcpy(tag, trailer + 8, kSealTagBytes);
  int done = 0;
  uint8_t scratch[kSealTagBytes];  // GCM's final writes nothing
  bool ok = EVP_DecryptInit_ex(recv_, nullptr, nullptr, nullptr, iv.data()) == 1 &&
            Aad(recv_, false, frame) &&
            Update(recv_, false, sealed_header.data(), header_out->data(), header_bytes) &&
            Update(recv_, false, payload_in, payload_out, payload_len) &&
            EVP_CIPHER_CTX_ctrl(recv_, EVP_CTRL_GCM_SET_TAG, kSealTagBytes, tag) == 1 &&
            EVP_DecryptFinal_ex(recv_, scratch, &done) == 1;
  if (!ok) {
    header_out->clear();
    *reason = "bad_seal";
    return Corruption("peer message failed its integrity check");
  }
  Mark(counter);
  return Status::Ok();
}

}  // namespace kvpool::transport
