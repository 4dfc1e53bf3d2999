#include "transport/bootstrap_format.h"

#include <gtest/gtest.h>

#include <random>

namespace kvpool::transport {
namespace {

BootstrapMessage Hello(size_t n) {
  BootstrapMessage m;
  m.body.resize(n);
  for (size_t i = 0; i < n; ++i) m.body[i] = static_cast<uint8_t>(i * 7);
  return m;
}

TEST(BootstrapFormat, RoundTripsEachKindAndAcceptsAnyPrefixAsNeedMore) {
  BootstrapMessage welcome = Hello(300);
  welcome.kind = BootstrapKind::kWelcome;
  welcome.token = 0xA1B2C3D4;
  BootstrapMessage refuse;
  refuse.kind = BootstrapKind::kRefuse;
  BootstrapMessage big = Hello(kMaxBootstrapBody);
  big.kind = BootstrapKind::kRefuse;
  BootstrapMessage challenge = Hello(120);
  challenge.kind = BootstrapKind::kChallenge;
  BootstrapMessage proof = Hello(kProofBody);
  proof.kind = BootstrapKind::kProof;
  for (const BootstrapMessage& want :
       {Hello(0), Hello(kMaxHelloBody), welcome, big, refuse, challenge, proof}) {
    std::vector<uint8_t> bytes = EncodeBootstrap(want);
    ASSERT_EQ(bytes.size(), kBootstrapHeaderBytes + want.body.size());
    BootstrapMessage got;
    size_t used = 0;
    const char* reason = "";
    for (size_t n = 0; n < bytes.size(); ++n) {
      ASSERT_EQ(ParseBootstrap({bytes.data(), n}, &got, &used, &reason), BootstrapParse::kNeedMore)
          << n;
    }
    bytes.push_back(0xEE);  // the next bytes are not part of it
    ASSERT_EQ(ParseBootstrap(bytes, &got, &used, &reason), BootstrapParse::kDone);
    EXPECT_EQ(used, bytes.size() - 1);
    EXPECT_EQ(got.kind, want.kind);
    EXPECT_EQ(got.token, want.token);
    EXPECT_EQ(got.body, want.body);
  }
}

TEST(BootstrapFormat, RejectsEachBrokenFieldAtItsFirstBadByte) {
  BootstrapMessage w64 = Hello(64);
  w64.kind = BootstrapKind::kWelcome;
  w64.token = 5;
  const std::vector<uint8_t> good = EncodeBootstrap(w64);
  struct Case {
    size_t offset;
    uint8_t value;
    const char* reason;
  };
  const Case cases[] = {
      {0, 0x00, "bad_magic"},   {3, 0x00, "bad_magic"},     {4, 9, "bad_version"},
      {5, 0, "bad_kind"},       {5, 6, "bad_kind"},         {6, 1, "bad_reserved"},
      {14, 1, "body_too_large"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bytes = good;
    bytes[c.offset] = c.value;
    BootstrapMessage m;
    size_t used = 0;
    const char* reason = "";
    // Invalid as soon as the broken byte is in, before the rest arrives.
    EXPECT_EQ(ParseBootstrap({bytes.data(), c.offset + 1}, &m, &used, &reason),
              c.offset < 8 ? BootstrapParse::kInvalid : BootstrapParse::kNeedMore)
        << c.offset;
    EXPECT_EQ(ParseBootstrap(bytes, &m, &used, &reason), BootstrapParse::kInvalid) << c.offset;
    EXPECT_STREQ(reason, c.reason);
  }
  // A welcome needs a token and an address; a hello has no token and at most
  // an authentication hello; a challenge has a body, a proof exactly a MAC.
  struct Rule {
    BootstrapKind kind;
    uint32_t token;
    size_t body;
    const char* reason;
  };
  const Rule rules[] = {{BootstrapKind::kWelcome, 0, 8, "bad_token"},
                        {BootstrapKind::kWelcome, 9, 0, "empty_address"},
                        {BootstrapKind::kHello, 9, 0, "bad_token"},
                        {BootstrapKind::kHello, 0, kMaxHelloBody + 1, "hello_too_large"},
                        {BootstrapKind::kChallenge, 0, 0, "empty_challenge"},
                        {BootstrapKind::kChallenge, 3, 8, "bad_token"},
                        {BootstrapKind::kProof, 0, kProofBody - 1, "bad_proof_length"},
                        {BootstrapKind::kProof, 0, kProofBody + 1, "bad_proof_length"}};
  for (const Rule& rule : rules) {
    BootstrapMessage w = Hello(rule.body);
    w.kind = rule.kind;
    w.token = rule.token;
    std::vector<uint8_t> bytes = EncodeBootstrap(w);
    BootstrapMessage m;
    size_t used = 0;
    const char* reason = "";
    EXPECT_EQ(ParseBootstrap(bytes, &m, &used, &reason), BootstrapParse::kInvalid);
    EXPECT_STREQ(reason, rule.reason);
  }
}

TEST(BootstrapFormat, RandomBytesNeverOverreadOrPassAsAHelloWithoutItsMagic) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> bytes(rng() % 64);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    BootstrapMessage m;
    size_t used = 0;
    const char* reason = "";
    BootstrapParse r = ParseBootstrap(bytes, &m, &used, &reason);
    if (r == BootstrapParse::kDone) {
      EXPECT_LE(used, bytes.size());
      EXPECT_EQ(bytes[0], 0x4B);
    }
  }
}

}  // namespace
}  // namespace kvpool::transport
