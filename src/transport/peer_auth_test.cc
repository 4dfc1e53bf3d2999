// The cluster-key handshake as data: who completes it, and that recorded,
// reflected or relabelled answers, other keys and altered identities do not.
#include "transport/peer_auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace kvpool::transport {
namespace {

ClusterKey Key(uint8_t seed) {
  std::array<uint8_t, kClusterKeyBytes> b{};
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(seed * 31 + i);
  return MakeClusterKey(b);
}

// Runs one handshake; returns the listener's verdict on the proof, or the
// first failure before it.
Status Handshake(const ClusterKey& connector_key, const std::vector<ClusterKey>& listener_keys,
                 const std::string& c_id = "a/1", const std::string& l_id = "b/2",
                 std::string* seen_by_connector = nullptr, std::string* seen_by_listener = nullptr) {
  AuthConnector c(connector_key, c_id);
  AuthListener l(&listener_keys, l_id);
  KVPOOL_ASSIGN_OR_RETURN(std::vector<uint8_t> hello, c.Hello());
  const char* reason = "";
  KVPOOL_ASSIGN_OR_RETURN(std::vector<uint8_t> challenge, l.Challenge(hello, &reason));
  std::string listener_id;
  KVPOOL_ASSIGN_OR_RETURN(std::vector<uint8_t> proof, c.Answer(challenge, &listener_id));
  KVPOOL_RETURN_IF_ERROR(l.Verify(proof, &reason));
  if (seen_by_connector) *seen_by_connector = listener_id;
  if (seen_by_listener) *seen_by_listener = l.peer_identity();
  return Status::Ok();
}

TEST(PeerAuth, HoldersOfTheKeyAuthenticateEachOtherAndLearnTheIdentities) {
  std::string c_saw, l_saw;
  ASSERT_TRUE(Handshake(Key(1), {Key(1)}, "a/1", "b/2", &c_saw, &l_saw).ok());
  EXPECT_EQ(c_saw, "b/2");
  EXPECT_EQ(l_saw, "a/1");
}

TEST(PeerAuth, AnotherKeyIsRefusedAtTheHello) {
  std::vector<ClusterKey> keys = {Key(1)};
  AuthConnector c(Key(2), "x/1");
  AuthListener l(&keys, "b/2");
  auto hello = c.Hello();
  ASSERT_TRUE(hello.ok());
  const char* reason = "";
  auto challenge = l.Challenge(*hello, &reason);
  EXPECT_EQ(challenge.status().code(), StatusCode::kPermissionDenied);
  EXPECT_STREQ(reason, "unknown_key");
}

TEST(PeerAuth, AKeyIdWithoutTheKeyCannotProveAnything) {
  // An intruder that learned the key id (it crosses the wire) but not the key.
  std::vector<ClusterKey> keys = {Key(1)};
  ClusterKey fake = Key(9);
  fake.id = Key(1).id;
  AuthConnector c(fake, "x/1");
  AuthListener l(&keys, "b/2");
  auto hello = c.Hello();
  const char* reason = "";
  auto challenge = l.Challenge(*hello, &reason);
  ASSERT_TRUE(challenge.ok());
  // The intruder cannot check the listener either...
  std::string id;
  EXPECT_EQ(c.Answer(*challenge, &id).status().code(), StatusCode::kPermissionDenied);
  // ... and a proof made with its key is refused.
  AuthHello h;
  ASSERT_TRUE(DecodeAuthHello(*hello, &h));
  AuthChallenge ch;
  ASSERT_TRUE(DecodeAuthChallenge(*challenge, &ch));
  AuthProof p;
  p.mac = AuthMac(fake, /*listener=*/false, h, ch.nonce, ch.identity, ch.flags);
  EXPECT_EQ(l.Verify(EncodeAuthProof(p), &reason).code(), StatusCode::kPermissionDenied);
  EXPECT_STREQ(reason, "bad_proof");
}

TEST(PeerAuth, ARecordedHandshakeCannotBeReplayed) {
  std::vector<ClusterKey> keys = {Key(1)};
  // Record a good handshake.
  AuthConnector c(Key(1), "a/1");
  AuthListener l1(&keys, "b/2");
  auto hello = c.Hello();
  const char* reason = "";
  auto challenge = l1.Challenge(*hello, &reason);
  std::string id;
  auto proof = c.Answer(*challenge, &id);
  ASSERT_TRUE(l1.Verify(*proof, &reason).ok());
  // Replay hello and proof to the listener: its new nonce makes the proof stale.
  AuthListener l2(&keys, "b/2");
  ASSERT_TRUE(l2.Challenge(*hello, &reason).ok());
  EXPECT_EQ(l2.Verify(*proof, &reason).code(), StatusCode::kPermissionDenied);
  // Replay the recorded challenge to a new connector: its new nonce makes
  // the challenge stale, so a listener cannot be impersonated either.
  AuthConnector c2(Key(1), "a/1");
  ASSERT_TRUE(c2.Hello().ok());
  EXPECT_EQ(c2.Answer(*challenge, &id).status().code(), StatusCode::kPermissionDenied);
}

TEST(PeerAuth, TheListenersMacIsNoProofAndIdentitiesAreBound) {
  std::vector<ClusterKey> keys = {Key(1)};
  AuthConnector c(Key(1), "a/1");
  AuthListener l(&keys, "b/2");
  auto hello = c.Hello();
  const char* reason = "";
  auto challenge = l.Challenge(*hello, &reason);
  AuthChallenge ch;
  ASSERT_TRUE(DecodeAuthChallenge(*challenge, &ch));
  // Reflection: the listener's own MAC sent back as the proof.
  AuthProof reflected;
  reflected.mac = ch.mac;
  EXPECT_FALSE(l.Verify(EncodeAuthProof(reflected), &reason).ok());
  // A challenge whose listener identity was altered in flight fails at the
  // connector.
  ch.identity = "c/2";
  std::string id;
  EXPECT_EQ(c.Answer(EncodeAuthChallenge(ch), &id).status().code(), StatusCode::kPermissionDenied);
  // A hello whose connector identity was altered: the connector's proof
  // (over its real identity) fails at the listener.
  AuthConnector c3(Key(1), "a/1");
  auto hello3 = c3.Hello();
  AuthHello h;
  ASSERT_TRUE(DecodeAuthHello(*hello3, &h));
  h.identity = "b/2";
  AuthListener l3(&keys, "b/2");
  auto challenge3 = l3.Challenge(EncodeAuthHello(h), &reason);
  ASSERT_TRUE(challenge3.ok());
  EXPECT_EQ(c3.Answer(*challenge3, &id).status().code(), StatusCode::kPermissionDenied);
}

TEST(PeerAuth, DuringRotationAListenerAcceptsBothKeys) {
  EXPECT_TRUE(Handshake(Key(1), {Key(2), Key(1)}).ok());
  EXPECT_TRUE(Handshake(Key(2), {Key(2), Key(1)}).ok());
  EXPECT_FALSE(Handshake(Key(3), {Key(2), Key(1)}).ok());
}

TEST(PeerAuth, MalformedBodiesAreRefused) {
  std::vector<ClusterKey> keys = {Key(1)};
  AuthListener l(&keys, "b/2");
  const char* reason = "";
  std::vector<uint8_t> junk(20, 7);
  EXPECT_FALSE(l.Challenge(junk, &reason).ok());
  EXPECT_STREQ(reason, "bad_auth_hello");
  AuthHello h;
  EXPECT_FALSE(DecodeAuthHello({}, &h));
  AuthConnector c(Key(1), "a/1");
  auto hello = c.Hello();
  ASSERT_TRUE(hello.ok());
  std::vector<uint8_t> longer = *hello;
  longer.push_back(0);
  EXPECT_FALSE(DecodeAuthHello(longer, &h));
  std::string id;
  EXPECT_FALSE(c.Answer(junk, &id).ok());
  // A proof before a challenge has nothing to match.
  AuthListener fresh(&keys, "b/2");
  EXPECT_FALSE(fresh.Verify(std::vector<uint8_t>(kAuthMacBytes, 0), &reason).ok());
}

// Encryption is asked for by either side; both learn the same two keys,
// one per direction, and nobody between them can take the request out.
TEST(PeerAuth, EitherSideTurnsOnEncryptionAndBothDeriveTheSameKeys) {
  std::vector<ClusterKey> keys = {Key(1)};
  for (int c_wants = 0; c_wants < 2; ++c_wants) {
    for (int l_wants = 0; l_wants < 2; ++l_wants) {
      AuthConnector c(Key(1), "a/1", c_wants != 0);
      AuthListener l(&keys, "b/2", l_wants != 0);
      auto hello = c.Hello();
      ASSERT_TRUE(hello.ok());
      const char* reason = "";
      auto challenge = l.Challenge(*hello, &reason);
      ASSERT_TRUE(challenge.ok());
      std::string id;
      auto proof = c.Answer(*challenge, &id);
      ASSERT_TRUE(proof.ok()) << proof.status().ToString();
      ASSERT_TRUE(l.Verify(*proof, &reason).ok());
      bool want = c_wants || l_wants;
      EXPECT_EQ(c.encrypted(), want);
      EXPECT_EQ(l.encrypted(), want);
      if (!want) continue;
      EXPECT_EQ(c.session_keys().connector_to_listener, l.session_keys().connector_to_listener);
      EXPECT_EQ(c.session_keys().listener_to_connector, l.session_keys().listener_to_connector);
      EXPECT_NE(c.session_keys().connector_to_listener, c.session_keys().listener_to_connector);
      // Neither key is the MAC of either side.
      AuthChallenge ch;
      ASSERT_TRUE(DecodeAuthChallenge(*challenge, &ch));
      EXPECT_NE(ch.mac, c.session_keys().listener_to_connector);
      EXPECT_NE(ch.mac, c.session_keys().connector_to_listener);
    }
  }
  // Two handshakes of the same pair get different keys (fresh nonces).
  auto keys_of = [&] {
    AuthConnector c(Key(1), "a/1", true);
    AuthListener l(&keys, "b/2");
    const char* reason = "";
    auto challenge = l.Challenge(*c.Hello(), &reason);
    std::string id;
    EXPECT_TRUE(c.Answer(*challenge, &id).ok());
    return c.session_keys().connector_to_listener;
  };
  EXPECT_NE(keys_of(), keys_of());
}

TEST(PeerAuth, AStrippedEncryptionRequestIsRefused) {
  std::vector<ClusterKey> keys = {Key(1)};
  AuthConnector c(Key(1), "a/1", /*encrypt=*/true);
  AuthListener l(&keys, "b/2");
  auto hello = c.Hello();
  ASSERT_TRUE(hello.ok());
  // Someone between clears the request in the hello: the listener's MAC
  // then covers a transcript the connector never sent.
  AuthHello h;
  ASSERT_TRUE(DecodeAuthHello(*hello, &h));
  EXPECT_EQ(h.flags, kAuthEncrypt);
  h.flags = 0;
  const char* reason = "";
  auto challenge = l.Challenge(EncodeAuthHello(h), &reason);
  ASSERT_TRUE(challenge.ok());
  std::string id;
  EXPECT_EQ(c.Answer(*challenge, &id).status().code(), StatusCode::kPermissionDenied);
  // Clearing the bit in the challenge breaks the listener's MAC.
  AuthListener l2(&keys, "b/2", /*encrypt=*/true);
  AuthConnector c2(Key(1), "a/1");
  auto challenge2 = l2.Challenge(*c2.Hello(), &reason);
  ASSERT_TRUE(challenge2.ok());
  AuthChallenge ch;
  ASSERT_TRUE(DecodeAuthChallenge(*challenge2, &ch));
  EXPECT_EQ(ch.flags, kAuthEncrypt);
  ch.flags = 0;
  EXPECT_EQ(c2.Answer(EncodeAuthChallenge(ch), &id).status().code(),
            StatusCode::kPermissionDenied);
  // Unknown flag bits are malformed.
  h.flags = 2;
  EXPECT_FALSE(DecodeAuthHello(EncodeAuthHello(h), &h));
}

class KeyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvpool-keyfile-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/cluster.key";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    rmdir(dir_.c_str());
  }
  void Write(const std::string& text, mode_t mode) {
    std::remove(path_.c_str());
    std::ofstream(path_) << text;
    chmod(path_.c_str(), mode);
  }
  std::string dir_, path_;
};

const char* kHexA = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
const char* kHexB = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

TEST_F(KeyFile, LoadsOneOrTwoKeysInOrder) {
  Write(std::string("# cluster key\n") + kHexA + "\n\n", 0600);
  auto one = LoadClusterKeyFile(path_);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].bytes[1], 0x11);
  EXPECT_EQ((*one)[0].bytes[31], 0xFF);
  Write(std::string(kHexB) + "\n" + kHexA + "\n", 0400);
  auto two = LoadClusterKeyFile(path_);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[0].bytes[0], 0xFF);
  EXPECT_EQ((*two)[1].id, (*one)[0].id);
  EXPECT_NE((*two)[0].id, (*two)[1].id);
}

TEST_F(KeyFile, RefusesLooseModesBadKeysAndMissingFilesSayingWhatToFix) {
  struct Case {
    std::string text;
    mode_t mode;
    const char* says;
  };
  const Case cases[] = {
      {kHexA, 0640, "chmod 600"},
      {kHexA, 0604, "chmod 600"},
      {"", 0600, "holds no key"},
      {"# only a comment\n", 0600, "holds no key"},
      {std::string(kHexA).substr(2), 0600, "64 hex digits"},
      {std::string(kHexA).replace(10, 1, "g"), 0600, "not a hex digit at column 11"},
      {std::string(kHexA) + "\n" + kHexB + "\n" + kHexA + "\n", 0600, "at most two"},
      {std::string(kHexA) + "\n" + kHexA + "\n", 0600, "same key twice"},
  };
  for (const Case& c : cases) {
    Write(c.text, c.mode);
    auto r = LoadClusterKeyFile(path_);
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().ToString();
  }
  std::remove(path_.c_str());
  auto missing = LoadClusterKeyFile(path_);
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find(path_), std::string::npos);
  // Owned by another user.
  Write(kHexA, 0600);
  ASSERT_EQ(chown(path_.c_str(), 65534, 65534), 0);
  auto foreign = LoadClusterKeyFile(path_);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("chown"), std::string::npos);
}

TEST_F(KeyFile, ClientTokenFilesNameEachClient) {
  Write(std::string("# remote clients\nengine-1 ") + kHexA + "\nengine.2\t" + kHexB + "\n", 0600);
  auto tokens = LoadClientTokenFile(path_);
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].principal, "engine-1");
  EXPECT_EQ((*tokens)[1].principal, "engine.2");
  EXPECT_EQ((*tokens)[1].bytes[0], 0xFF);
  struct Case {
    std::string text;
    const char* says;
  };
  const Case cases[] = {
      {kHexA, "want \"NAME HEX64\""},
      {std::string("bad/name ") + kHexA, "a client name is"},
      {std::string("a ") + kHexA + "\na " + kHexB, "the name a is taken"},
      {std::string("a ") + kHexA + "\nb " + kHexA, "the same token as a"},
      {"a abcd", "64 hex digits"},
      {"# nothing\n", "holds no token"},
  };
  for (const Case& c : cases) {
    Write(c.text, 0600);
    auto r = LoadClientTokenFile(path_);
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().ToString();
  }
  Write(std::string("a ") + kHexA, 0644);
  EXPECT_NE(LoadClientTokenFile(path_).status().message().find("chmod 600"), std::string::npos);
}

}  // namespace
}  // namespace kvpool::transport
