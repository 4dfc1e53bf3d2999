#include "transport/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/check.h"
#include "common/secret_file.h"
#include "protocol/codec.h"

namespace kvpool::transport {

namespace {

constexpr std::string_view kKeyIdLabel = "kvpool cluster key id v1";
constexpr std::string_view kListenerLabel = "kvpool peer auth v1 listener";
constexpr std::string_view kConnectorLabel = "kvpool peer auth v1 connector";
constexpr std::string_view kSealC2LLabel = "kvpool peer seal v1 connector to listener";
constexpr std::string_view kSealL2CLabel = "kvpool peer seal v1 listener to connector";

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// 64 hex digits into *out; `where` names the line in the error.
Status ParseHexKey(std::string_view hex, std::array<uint8_t, kClusterKeyBytes>* out,
                   const std::string& where) {
  if (hex.size() != 2 * kClusterKeyBytes) {
    return InvalidArgument(fmt::format(
        "{}: a key is 64 hex digits (32 bytes; e.g. openssl rand -hex 32), this one has {} "
        "characters",
        where, hex.size()));
  }
  for (size_t i = 0; i < kClusterKeyBytes; ++i) {
    int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument(
          fmt::format("{}: not a hex digit at column {}", where, hi < 0 ? 2 * i + 1 : 2 * i + 2));
    }
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return Status::Ok();
}

std::array<uint8_t, kAuthMacBytes> Hmac(const ClusterKey& key, std::span<const uint8_t> msg) {
  std::array<uint8_t, kAuthMacBytes> mac{};
  unsigned int len = 0;
  KVPOOL_CHECK(HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()),
                    msg.data(), msg.size(), mac.data(), &len) != nullptr);
  KVPOOL_CHECK(len == mac.size());
  return mac;
}

// HMAC-SHA256(key, label | transcript): the MACs and the message keys.
std::array<uint8_t, kAuthMacBytes> TranscriptMac(const ClusterKey& key, std::string_view label,
                                                 const AuthHello& hello,
                                                 std::span<const uint8_t, kAuthNonceBytes> nonce_l,
                                                 const std::string& listener_identity,
                                                 uint8_t listener_flags) {
  std::vector<uint8_t> msg;
  protocol::BodyWriter w(&msg);
  w.Raw(label.data(), label.size());
  w.U64(hello.key_id);
  w.Raw(hello.nonce.data(), hello.nonce.size());
  w.Raw(nonce_l.data(), nonce_l.size());
  w.Str(hello.identity);
  w.Str(listener_identity);
  w.U8(hello.flags);
  w.U8(listener_flags);
  return Hmac(key, msg);
}

template <size_t N>
bool ReadArray(protocol::BodyReader* r, std::array<uint8_t, N>* a) {
  std::span<const uint8_t> b;
  if (!r->Bytes(N, &b)) return false;
  std::memcpy(a->data(), b.data(), N);
  return true;
}

}  // namespace

uint64_t ClusterKeyId(std::span<const uint8_t, kClusterKeyBytes> key) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  KVPOOL_CHECK(ctx != nullptr);
  KVPOOL_CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1);
  EVP_DigestUpdate(ctx, kKeyIdLabel.data(), kKeyIdLabel.size());
  EVP_DigestUpdate(ctx, key.data(), key.size());
  KVPOOL_CHECK(EVP_DigestFinal_ex(ctx, digest, &len) == 1);
  EVP_MD_CTX_free(ctx);
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id |= uint64_t{digest[i]} << (8 * i);
  return id;
}

ClusterKey MakeClusterKey(std::span<const uint8_t, kClusterKeyBytes> key) {
  ClusterKey k;
  std::memcpy(k.bytes.data(), key.data(), kClusterKeyBytes);
  k.id = ClusterKeyId(key);
  return k;
}

Result<std::vector<ClusterKey>> LoadClusterKeyFile(const std::string& path) {
  KVPOOL_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(path, "cluster key file"));
  std::vector<ClusterKey> keys;
  int key_no = 0;
  for (const std::string& line : SecretLines(text)) {
    ++key_no;
    std::array<uint8_t, kClusterKeyBytes> b{};
    KVPOOL_RETURN_IF_ERROR(ParseHexKey(line, &b, fmt::format("cluster key file {} key {}", path, key_no)));
    keys.push_back(MakeClusterKey(b));
  }
  if (keys.empty()) return InvalidArgument(fmt::format("cluster key file {} holds no key", path));
  if (keys.size() > 2) {
    return InvalidArgument(fmt::format(
        "cluster key file {} holds {} keys; at most two (the current one first, and the one "
        "being rotated in or out)",
        path, keys.size()));
  }
  if (keys.size() == 2 && keys[0].id == keys[1].id) {
    return InvalidArgument(fmt::format("cluster key file {} holds the same key twice", path));
  }
  return keys;
}

Result<std::vector<ClusterKey>> LoadClientTokenFile(const std::string& path) {
  KVPOOL_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(path, "client token file"));
  std::vector<ClusterKey> tokens;
  int line_no = 0;
  for (const std::string& line : SecretLines(text)) {
    ++line_no;
    std::string where = fmt::format("client token file {} entry {}", path, line_no);
    size_t space = line.find_first_of(" \t");
    if (space == std::string::npos) {
      return InvalidArgument(where + ": want \"NAME HEX64\" (a client name, then its token)");
    }
    std::string name = line.substr(0, space);
    size_t hex_at = line.find_first_not_of(" \t", space);
    bool name_ok = !name.empty() && name.size() <= 64 &&
                   std::all_of(name.begin(), name.end(), [](char c) {
                     return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                            c == '-';
                   });
    if (!name_ok) {
      return InvalidArgument(where + ": a client name is 1-64 characters of A-Z a-z 0-9 . _ -");
    }
    std::array<uint8_t, kClusterKeyBytes> b{};
    KVPOOL_RETURN_IF_ERROR(ParseHexKey(std::string_view(line).substr(hex_at), &b, where));
    ClusterKey k = MakeClusterKey(b);
    k.principal = name;
    for (const ClusterKey& other : tokens) {
      if (other.principal == name) return InvalidArgument(where + ": the name " + name + " is taken");
      if (other.id == k.id) return InvalidArgument(where + ": the same token as " + other.principal);
    }
    tokens.push_back(std::move(k));
    if (tokens.size() > 1024) return InvalidArgument(where + ": more than 1024 clients");
  }
  if (tokens.empty()) return InvalidArgument(fmt::format("client token file {} holds no token", path));
  return tokens;
}

std::vector<uint8_t> EncodeAuthHello(const AuthHello& h) {
  std::vector<uint8_t> out;
  protocol::BodyWriter w(&out);
  w.U64(h.key_id);
  w.Raw(h.nonce.data(), h.nonce.size());
  w.Str(h.identity);
  w.U8(h.flags);
  return out;
}

std::vector<uint8_t> EncodeAuthChallenge(const AuthChallenge& c) {
  std::vector<uint8_t> out;
  protocol::BodyWriter w(&out);
  w.Raw(c.nonce.data(), c.nonce.size());
  w.Str(c.identity);
  w.U8(c.flags);
  w.Raw(c.mac.data(), c.mac.size());
  return out;
}

std::vector<uint8_t> EncodeAuthProof(const AuthProof& p) {
  return std::vector<uint8_t>(p.mac.begin(), p.mac.end());
}

bool DecodeAuthHello(std::span<const uint8_t> body, AuthHello* h) {
  protocol::BodyReader r(body);
  return r.U64(&h->key_id) && ReadArray(&r, &h->nonce) &&
         r.Str(kMaxAuthIdentityBytes, &h->identity) && r.U8(&h->flags) &&
         (h->flags & ~kAuthEncrypt) == 0 && r.remaining() == 0;
}

bool DecodeAuthChallenge(std::span<const uint8_t> body, AuthChallenge* c) {
  protocol::BodyReader r(body);
  return ReadArray(&r, &c->nonce) && r.Str(kMaxAuthIdentityBytes, &c->identity) &&
         r.U8(&c->flags) && (c->flags & ~kAuthEncrypt) == 0 && ReadArray(&r, &c->mac) &&
         r.remaining() == 0;
}

bool DecodeAuthProof(std::span<const uint8_t> body, AuthProof* p) {
  protocol::BodyReader r(body);
  return ReadArray(&r, &p->mac) && r.remaining() == 0;
}

Status RandomNonce(std::array<uint8_t, kAuthNonceBytes>* nonce) {
  if (RAND_bytes(nonce->data(), static_cast<int>(nonce->size())) != 1) {
    return Internal("no random bytes for an authentication nonce");
  }
  return Status::Ok();
}

std::array<uint8_t, kAuthMacBytes> AuthMac(const ClusterKey& key, bool listener,
                                           const AuthHello& hello,
                                           std::span<const uint8_t, kAuthNonceBytes> nonce_l,
                                           const std::string& listener_identity,
                                           uint8_t listener_flags) {
  return TranscriptMac(key, listener ? kListenerLabel : kConnectorLabel, hello, nonce_l,
                       listener_identity, listener_flags);
}

SessionKeys DeriveSessionKeys(const ClusterKey& key, const AuthHello& hello,
                              std::span<const uint8_t, kAuthNonceBytes> nonce_l,
                              const std::string& listener_identity, uint8_t listener_flags) {
  SessionKeys k;
  k.connector_to_listener =
      TranscriptMac(key, kSealC2LLabel, hello, nonce_l, listener_identity, listener_flags);
  k.listener_to_connector =
      TranscriptMac(key, kSealL2CLabel, hello, nonce_l, listener_identity, listener_flags);
  return k;
}

std::array<uint8_t, kAuthMacBytes> MemberProofMac(const ClusterKey& key, std::string_view record) {
  constexpr std::string_view kLabel = "kvpool member proof v1";
  std::vector<uint8_t> msg(kLabel.begin(), kLabel.end());
  msg.insert(msg.end(), record.begin(), record.end());
  return Hmac(key, msg);
}

bool MacEqual(std::span<const uint8_t, kAuthMacBytes> a, std::span<const uint8_t, kAuthMacBytes> b) {
  return CRYPTO_memcmp(a.data(), b.data(), kAuthMacBytes) == 0;
}

Result<std::vector<uint8_t>> AuthConnector::Hello() {
  hello_.key_id = key_.id;
  hello_.identity = identity_.substr(0, kMaxAuthIdentityBytes);
  hello_.flags = encrypt_ ? kAuthEncrypt : 0;
  KVPOOL_RETURN_IF_ERROR(RandomNonce(&hello_.nonce));
  return EncodeAuthHello(hello_);
}

Result<std::vector<uint8_t>> AuthConnector::Answer(std::span<const uint8_t> challenge_body,
                                                   std::string* peer_identity) {
  AuthChallenge c;
  if (!DecodeAuthChallenge(challenge_body, &c)) {
    return PermissionDenied("malformed authentication challenge");
  }
  auto want = AuthMac(key_, /*listener=*/true, hello_, c.nonce, c.identity, c.flags);
  if (!MacEqual(want, c.mac)) {
    return PermissionDenied("the listener does not hold this node's cluster key");
  }
  if (encrypt_ && !(c.flags & kAuthEncrypt)) {
    return PermissionDenied("the listener would not encrypt the connection (--peer-encryption)");
  }
  *peer_identity = c.identity;
  encrypted_ = (c.flags & kAuthEncrypt) != 0;
  if (encrypted_) session_ = DeriveSessionKeys(key_, hello_, c.nonce, c.identity, c.flags);
  AuthProof p;
  p.mac = AuthMac(key_, /*listener=*/false, hello_, c.nonce, c.identity, c.flags);
  return EncodeAuthProof(p);
}

Result<std::vector<uint8_t>> AuthListener::Challenge(std::span<const uint8_t> hello_body,
                                                     const char** reason) {
  if (!DecodeAuthHello(hello_body, &hello_)) {
    *reason = "bad_auth_hello";
    return PermissionDenied("malformed authentication hello");
  }
  key_ = nullptr;
  for (const ClusterKey& k : *keys_) {
    if (k.id == hello_.key_id) key_ = &k;
  }
  if (key_ == nullptr) {
    *reason = "unknown_key";
    return PermissionDenied("authentication failed: not a key of this cluster");
  }
  KVPOOL_RETURN_IF_ERROR(RandomNonce(&nonce_));
  AuthChallenge c;
  c.nonce = nonce_;
  c.identity = identity_.substr(0, kMaxAuthIdentityBytes);
  flags_ = c.flags = hello_.flags | (encrypt_ ? kAuthEncrypt : 0);
  c.mac = AuthMac(*key_, /*listener=*/true, hello_, nonce_, c.identity, c.flags);
  identity_ = c.identity;
  return EncodeAuthChallenge(c);
}

Status AuthListener::Verify(std::span<const uint8_t> proof_body, const char** reason) {
  AuthProof p;
  if (key_ == nullptr || !DecodeAuthProof(proof_body, &p) ||
      !MacEqual(AuthMac(*key_, /*listener=*/false, hello_, nonce_, identity_, flags_), p.mac)) {
    *reason = "bad_proof";
    return PermissionDenied("authentication failed");
  }
  if (encrypted()) session_ = DeriveSessionKeys(*key_, hello_, nonce_, identity_, flags_);
  return Status::Ok();
}

}  // namespace kvpool::transport
