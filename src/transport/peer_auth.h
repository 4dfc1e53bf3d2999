// Mutual authentication of peer connections with a shared cluster key,
// carried in the peer port's bootstrap (bootstrap_format.h).
//
// The exchange, before the listener hands out its UCX worker address:
//
//   connector -> listener  hello     key id, nonce_c, connector identity, flags_c
//   listener  -> connector challenge nonce_l, listener identity, flags_l, mac_l
//   connector -> listener  proof     mac_c
//   listener  -> connector welcome   (the UCX worker address, as without keys)
//
//   mac_l = HMAC-SHA256(key, "kvpool peer auth v1 listener"  | transcript)
//   mac_c = HMAC-SHA256(key, "kvpool peer auth v1 connector" | transcript)
//   transcript = key id | nonce_c | nonce_l | len | id_c | len | id_l
//                | flags_c | flags_l
//
// Flags: bit 0 (kAuthEncrypt) in flags_c asks for encrypted messages; in
// flags_l it says the connection is encrypted, which the listener sets when
// either side asks (flags_l = flags_c | the listener's own wish). Both are
// inside both MACs, so nobody between the two can strip the request: a
// connector that asked and reads a challenge without the bit refuses it.
// An encrypted connection's message keys (peer_seal.h) come from the same
// key and transcript, one per direction:
//
//   key_c->l = HMAC-SHA256(key, "kvpool peer seal v1 connector to listener" | transcript)
//   key_l->c = HMAC-SHA256(key, "kvpool peer seal v1 listener to connector" | transcript)
//
// Nonces are 32 random bytes from each side, so a recorded proof or
// challenge is worthless in any other handshake; both identities (node id and
// incarnation) are inside both MACs, and the two directions use different
// labels, so neither side can replay, reflect or relabel the other's answer.
// The key id (the first 8 bytes of SHA-256 over a label and the key) tells
// the listener which of its keys the connector holds: a node accepts two
// keys at once while a new key is rolled out, and initiates with the first.
//
// Only the key's holders can complete the exchange; the key itself never
// crosses the wire. Authentication happens once per connection: requests
// and replies carry no per-message cost.
//
// Plain functions and data; no I/O. Thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpool::transport {

inline constexpr size_t kClusterKeyBytes = 32;
inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthMacBytes = 32;
inline constexpr size_t kMaxAuthIdentityBytes = 256;
inline constexpr uint8_t kAuthEncrypt = 1;  // hello and challenge flags
inline constexpr size_t kSessionKeyBytes = 32;

struct ClusterKey {
  std::array<uint8_t, kClusterKeyBytes> bytes{};
  uint64_t id = 0;  // KeyId(bytes)
  // Empty for a cluster key (its holders are members). For a client token:
  // the client's name; a connection it authenticates is a client's, which
  // may send only the message types a listener allows clients.
  std::string principal;
};

// The id a hello names a key by.
uint64_t ClusterKeyId(std::span<const uint8_t, kClusterKeyBytes> key);
ClusterKey MakeClusterKey(std::span<const uint8_t, kClusterKeyBytes> key);

// Reads a cluster key file: one or two keys, one per line, each 64 hex
// digits (32 bytes, e.g. `openssl rand -hex 32`); blank lines and lines
// starting with '#' are skipped. The first key initiates, every key is
// accepted. The file must be a regular file owned by this process's user
// with no permission for group or others (0600 or 0400); otherwise, or when
// it holds no key, more than two, or a malformed one, the error says what to
// fix.
Result<std::vector<ClusterKey>> LoadClusterKeyFile(const std::string& path);

// Reads a client token file: one line per client, "NAME HEX64" (a name of
// 1-64 characters from [A-Za-z0-9._-], then its 32-byte token in hex),
// at most 1024 lines, names and tokens unique; the same file checks as a
// cluster key file. A node accepts every token in it; a remote-mode client
// uses the first line of its own file.
Result<std::vector<ClusterKey>> LoadClientTokenFile(const std::string& path);

// Bodies of the three authentication messages.
struct AuthHello {
  uint64_t key_id = 0;
  std::array<uint8_t, kAuthNonceBytes> nonce{};
  std::string identity;
  uint8_t flags = 0;
};
struct AuthChallenge {
  std::array<uint8_t, kAuthNonceBytes> nonce{};
  std::string identity;
  uint8_t flags = 0;
  std::array<uint8_t, kAuthMacBytes> mac{};
};
// The message keys of an encrypted connection, one per direction.
struct SessionKeys {
  std::array<uint8_t, kSessionKeyBytes> connector_to_listener{};
  std::array<uint8_t, kSessionKeyBytes> listener_to_connector{};
};
struct AuthProof {
  std::array<uint8_t, kAuthMacBytes> mac{};
};

std::vector<uint8_t> EncodeAuthHello(const AuthHello& h);
std::vector<uint8_t> EncodeAuthChallenge(const AuthChallenge& c);
std::vector<uint8_t> EncodeAuthProof(const AuthProof& p);
// Each needs the whole body and nothing after it; false when malformed
// (including flags other than kAuthEncrypt).
bool DecodeAuthHello(std::span<const uint8_t> body, AuthHello* h);
bool DecodeAuthChallenge(std::span<const uint8_t> body, AuthChallenge* c);
bool DecodeAuthProof(std::span<const uint8_t> body, AuthProof* p);

// Fills a nonce from the system's CSPRNG.
Status RandomNonce(std::array<uint8_t, kAuthNonceBytes>* nonce);

// The MACs of one handshake. `listener` selects the label.
std::array<uint8_t, kAuthMacBytes> AuthMac(const ClusterKey& key, bool listener,
                                           const AuthHello& hello,
                                           std::span<const uint8_t, kAuthNonceBytes> nonce_l,
                                           const std::string& listener_identity,
                                           uint8_t listener_flags);
// The message keys of one handshake (same transcript as AuthMac).
SessionKeys DeriveSessionKeys(const ClusterKey& key, const AuthHello& hello,
                              std::span<const uint8_t, kAuthNonceBytes> nonce_l,
                              const std::string& listener_identity, uint8_t listener_flags);
// A member's proof of holding a cluster key, carried in its membership
// registration (membership/etcd_membership.h):
//   HMAC-SHA256(key, "kvpool member proof v1" | record)
// where record names the registration (cluster, node id, incarnation,
// address, weight; EtcdMembership builds it). Only key holders can make one;
// a copied proof is good for that one registration only.
std::array<uint8_t, kAuthMacBytes> MemberProofMac(const ClusterKey& key, std::string_view record);
// Constant-time comparison.
bool MacEqual(std::span<const uint8_t, kAuthMacBytes> a, std::span<const uint8_t, kAuthMacBytes> b);

// One side's view of the handshake state machine, used by the transport.
class AuthConnector {
 public:
  // `encrypt`: ask for an encrypted connection.
  AuthConnector(const ClusterKey& key, std::string identity, bool encrypt = false)
      : key_(key), identity_(std::move(identity)), encrypt_(encrypt) {}
  // The hello body (a fresh nonce each call).
  Result<std::vector<uint8_t>> Hello();
  // Checks the listener's challenge; on success returns the proof body and
  // sets *peer_identity. PermissionDenied when the listener does not hold
  // the key, or does not encrypt a connection this side asked to encrypt.
  Result<std::vector<uint8_t>> Answer(std::span<const uint8_t> challenge_body,
                                      std::string* peer_identity);
  // After a successful Answer: whether the connection is encrypted, and its keys.
  bool encrypted() const { return encrypted_; }
  const SessionKeys& session_keys() const { return session_; }

 private:
  ClusterKey key_;
  std::string identity_;
  bool encrypt_;
  AuthHello hello_;
  bool encrypted_ = false;
  SessionKeys session_;
};

class AuthListener {
 public:
  // `encrypt`: encrypt every connection, asked for or not.
  AuthListener(const std::vector<ClusterKey>* keys, std::string identity, bool encrypt = false)
      : keys_(keys), identity_(std::move(identity)), encrypt_(encrypt) {}
  // Checks a hello and returns the challenge body. *reason is a metric label
  // on failure: "bad_auth_hello", "unknown_key".
  Result<std::vector<uint8_t>> Challenge(std::span<const uint8_t> hello_body, const char** reason);
  // Checks the connector's proof ("bad_proof" on failure).
  Status Verify(std::span<const uint8_t> proof_body, const char** reason);
  const std::string& peer_identity() const { return hello_.identity; }
  // After a successful Challenge: the key the connector holds, and whether
  // the connection is encrypted.
  const ClusterKey* key() const { return key_; }
  bool encrypted() const { return (flags_ & kAuthEncrypt) != 0; }
  // After a successful Verify of an encrypted connection: its keys.
  const SessionKeys& session_keys() const { return session_; }

 private:
  const std::vector<ClusterKey>* keys_;  // not owned
  std::string identity_;
  bool encrypt_;
  const ClusterKey* key_ = nullptr;
  AuthHello hello_;
  std::array<uint8_t, kAuthNonceBytes> nonce_{};
  uint8_t flags_ = 0;
  SessionKeys session_;
};

}  // namespace kvpool::transport
