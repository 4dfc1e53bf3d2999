// The message seal as data: what one side seals the other opens byte for
// byte, and a changed bit anywhere, another key, a replay or a message older
// than the window is refused.
#include "transport/peer_seal.h"

#include <gtest/gtest.h>

#include <cstring>

#include "transport/peer_format.h"

namespace kvpool::transport {
namespace {

std::array<uint8_t, kSealKeyBytes> Key(uint8_t seed) {
  std::array<uint8_t, kSealKeyBytes> k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(seed * 17 + i);
  return k;
}

struct Pair {
  std::unique_ptr<PeerSeal> a, b;  // a sends with key 1, b receives with it
};

Pair MakePair() {
  auto k1 = Key(1), k2 = Key(2);
  Pair p;
  p.a = std::move(PeerSeal::Make(k1, k2)).value();
  p.b = std::move(PeerSeal::Make(k2, k1)).value();
  return p;
}

struct Sealed {
  std::vector<uint8_t> am_header;
  std::vector<uint8_t> payload;
};

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

Sealed Seal(PeerSeal* s, const std::vector<uint8_t>& header, const std::vector<uint8_t>& payload) {
  Frame f;
  f.type = 9;
  f.request_id = 77;
  f.payload_len = payload.size();
  Sealed out;
  out.am_header = EncodeFrame(f, header);
  out.payload.resize(payload.size());
  EXPECT_TRUE(s->Seal(&out.am_header, payload, out.payload.data()).ok());
  return out;
}

// Opens m as a receiver would: the frame parsed, the header checked.
Status Open(PeerSeal* s, const Sealed& m, std::vector<uint8_t>* header,
            std::vector<uint8_t>* payload, const char** reason) {
  Frame f;
  std::span<const uint8_t> hdr;
  Status st = DecodeFrame(m.am_header, m.payload.size(), 1 << 20, 1 << 30, &f, &hdr, reason);
  if (!st.ok()) return st;
  payload->resize(m.payload.size());
  return s->Open(std::span(m.am_header).first(kFrameBytes), hdr, header, m.payload.data(),
                 payload->data(), m.payload.size(), reason);
}

TEST(PeerSeal, WhatOneSideSealsTheOtherOpensExactly) {
  Pair p = MakePair();
  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20}) {
    auto header = Bytes(33, 3), payload = Bytes(n, 5);
    Sealed m = Seal(p.a.get(), header, payload);
    // The frame stays readable (and counts the trailer); nothing else does.
    EXPECT_EQ(m.am_header.size(), kFrameBytes + header.size() + kSealTrailerBytes);
    EXPECT_NE(std::memcmp(m.am_header.data() + kFrameBytes, header.data(), header.size()), 0);
    if (n >= 16) {
      EXPECT_NE(std::memcmp(m.payload.data(), payload.data(), 16), 0);
    }
    std::vector<uint8_t> h, pl;
    const char* reason = "";
    ASSERT_TRUE(Open(p.b.get(), m, &h, &pl, &reason).ok()) << reason;
    EXPECT_EQ(h, header);
    EXPECT_EQ(pl, payload);
  }
  EXPECT_EQ(p.a->sent(), 4u);
}

TEST(PeerSeal, InPlaceSealingAndOpening) {
  Pair p = MakePair();
  auto payload = Bytes(10000, 9);
  std::vector<uint8_t> buf = payload;
  Frame f;
  f.payload_len = buf.size();
  std::vector<uint8_t> am = EncodeFrame(f, Bytes(5, 1));
  ASSERT_TRUE(p.a->Seal(&am, buf, buf.data()).ok());
  std::vector<uint8_t> h;
  const char* reason = "";
  ASSERT_TRUE(p.b->Open(std::span(am).first(kFrameBytes), std::span(am).subspan(kFrameBytes), &h,
                        buf.data(), buf.data(), buf.size(), &reason)
                  .ok());
  EXPECT_EQ(buf, payload);
  EXPECT_EQ(h, Bytes(5, 1));
}

TEST(PeerSeal, EveryChangedBitIsRefused) {
  auto header = Bytes(20, 3), payload = Bytes(300, 5);
  Pair p = MakePair();
  Sealed m = Seal(p.a.get(), header, payload);
  size_t total = m.am_header.size() + m.payload.size();
  // Every byte of the message, frame included (but not the frame's length
  // fields, which the frame parser refuses first), flipped in turn.
  int refused = 0, tried = 0;
  for (size_t i = 0; i < total; i += 3) {
    if ((i >= 20 && i < 32)) continue;  // header_len, payload_len
    Sealed bad = m;
    uint8_t* at = i < bad.am_header.size() ? &bad.am_header[i]
                                           : &bad.payload[i - bad.am_header.size()];
    *at ^= 0x10;
    std::vector<uint8_t> h, pl;
    const char* reason = "";
    ++tried;
    Pair fresh = MakePair();
    if (!Open(fresh.b.get(), bad, &h, &pl, &reason).ok()) ++refused;
  }
  EXPECT_EQ(refused, tried);
  // The untouched message still opens.
  std::vector<uint8_t> h, pl;
  const char* reason = "";
  EXPECT_TRUE(Open(p.b.get(), m, &h, &pl, &reason).ok());
}

TEST(PeerSeal, AnotherKeyOrTheOtherDirectionCannotOpen) {
  Pair p = MakePair();
  Sealed m = Seal(p.a.get(), Bytes(8, 1), Bytes(64, 2));
  std::vector<uint8_t> h, pl;
  const char* reason = "";
  // The sender's own receive key is the other direction's.
  EXPECT_EQ(Open(p.a.get(), m, &h, &pl, &reason).code(), StatusCode::kCorruption);
  EXPECT_STREQ(reason, "bad_seal");
  auto k3 = Key(3);
  auto other = std::move(PeerSeal::Make(k3, k3)).value();
  EXPECT_FALSE(Open(other.get(), m, &h, &pl, &reason).ok());
}

TEST(PeerSeal, ReplaysAndMessagesOlderThanTheWindowAreRefused) {
  Pair p = MakePair();
  std::vector<Sealed> sent;
  for (int i = 0; i < 5; ++i) sent.push_back(Seal(p.a.get(), Bytes(4, i), Bytes(16, i)));
  std::vector<uint8_t> h, pl;
  const char* reason = "";
  // Out of order within the window is fine; each exactly once.
  for (int i : {2, 0, 4, 1, 3}) {
    ASSERT_TRUE(Open(p.b.get(), sent[i], &h, &pl, &reason).ok()) << i;
    EXPECT_EQ(h, Bytes(4, i));
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(p.b->Plausible(std::span(sent[i].am_header).subspan(kFrameBytes), &reason));
    EXPECT_EQ(Open(p.b.get(), sent[i], &h, &pl, &reason).code(), StatusCode::kCorruption);
    EXPECT_STREQ(reason, "replayed_message");
  }
  // A message overtaken by a full window of later ones is refused; one
  // just inside the window is still accepted.
  Sealed old_one = Seal(p.a.get(), Bytes(4, 9), {});     // counter 6
  Sealed inside = Seal(p.a.get(), Bytes(4, 10), {});     // counter 7
  Sealed last;
  for (uint64_t i = 0; i < kSealWindow - 1; ++i) last = Seal(p.a.get(), {}, {});
  ASSERT_TRUE(Open(p.b.get(), last, &h, &pl, &reason).ok());  // counter 6 + kSealWindow
  EXPECT_FALSE(Open(p.b.get(), old_one, &h, &pl, &reason).ok());
  EXPECT_STREQ(reason, "replayed_message");
  EXPECT_TRUE(Open(p.b.get(), inside, &h, &pl, &reason).ok()) << reason;
}

TEST(PeerSeal, AMessageTooShortForItsTrailerIsRefused) {
  Pair p = MakePair();
  Frame f;
  std::vector<uint8_t> am = EncodeFrame(f, Bytes(kSealTrailerBytes - 1, 1));
  std::vector<uint8_t> h;
  const char* reason = "";
  EXPECT_FALSE(p.b->Plausible(std::span(am).subspan(kFrameBytes), &reason));
  EXPECT_STREQ(reason, "bad_seal");
  EXPECT_FALSE(p.b->Open(std::span(am).first(kFrameBytes), std::span(am).subspan(kFrameBytes), &h,
                         nullptr, nullptr, 0, &reason)
                   .ok());
}

}  // namespace
}  // namespace kvpool::transport
