#include "protocol/codec.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include "protocol/codec_test_util.h"
#include "protocol/descriptor_format.h"

namespace kvpool::protocol {
namespace {

TEST(CodecTest, HeaderRoundTrip) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(MessageType::kAcquire);
  h.request_id = 0x1122334455667788ull;
  h.body_len = 1234;
  h.status = 5;
  uint8_t buf[kHeaderBytes];
  EncodeHeader(h, buf);
  FrameHeader back;
  ASSERT_TRUE(DecodeHeader(std::span(buf, kHeaderBytes), 4096, &back).ok());
  EXPECT_EQ(back.type, h.type);
  EXPECT_EQ(back.request_id, h.request_id);
  EXPECT_EQ(back.body_len, 1234u);
  EXPECT_EQ(back.status, 5);
}

TEST(CodecTest, HeaderRejectsBadMagicVersionAndSize) {
  FrameHeader h;
  h.body_len = 5000;
  uint8_t buf[kHeaderBytes];
  EncodeHeader(h, buf);
  FrameHeader out;
  EXPECT_EQ(DecodeHeader(std::span(buf, kHeaderBytes), 4096, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(DecodeHeader(std::span(buf, kHeaderBytes), 5000, &out).ok());
  EXPECT_EQ(DecodeHeader(std::span(buf, 10), 5000, &out).code(), StatusCode::kInvalidArgument);
  buf[0] ^= 1;
  EXPECT_NE(DecodeHeader(std::span(buf, kHeaderBytes), 5000, &out).message().find("magic"), std::string::npos);
  buf[0] ^= 1;
  buf[4] = 9;
  EXPECT_NE(DecodeHeader(std::span(buf, kHeaderBytes), 5000, &out).message().find("version"), std::string::npos);
}

// docs/protocol.md's frame table names the version this code speaks: the
// first number of its "version" row is kProtocolVersion.
TEST(CodecTest, TheProtocolDocNamesTheCodesVersion) {
  std::ifstream in(std::string(KVPOOL_DOCS_DIR) + "/protocol.md");
  ASSERT_TRUE(in.good()) << KVPOOL_DOCS_DIR;
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  const std::string doc = text.str();
  ASSERT_TRUE(std::regex_search(doc, m, std::regex(R"(\| 4 \| 2 \| version \| (\d+))")))
      << "no version row in docs/protocol.md";
  EXPECT_EQ(std::stoi(m[1].str()), kProtocolVersion)
      << "docs/protocol.md says version " << m[1].str() << ", the code speaks "
      << kProtocolVersion;
}

TEST(CodecTest, KeysRoundTripAndLimits) {
  std::vector<KeyId> keys = {MakeKeyId("a", "1"), MakeKeyId("a", "2"), MakeKeyId("b", "")};
  std::vector<uint8_t> body;
  EncodeKeys(keys, &body);
  std::vector<KeyId> back;
  ASSERT_TRUE(DecodeKeys(body, 16, &back).ok());
  EXPECT_EQ(back, keys);
  EXPECT_NE(DecodeKeys(body, 2, &back).message().find("batch limit"), std::string::npos);
  body.pop_back();
  EXPECT_EQ(DecodeKeys(body, 16, &back).code(), StatusCode::kInvalidArgument);
  body.push_back(0);
  body.push_back(0);
  EXPECT_NE(DecodeKeys(body, 16, &back).message().find("trailing"), std::string::npos);
}

TEST(CodecTest, HintsRoundTripAndLimits) {
  HintRequest m;
  m.op = 3;
  m.priority = 200;
  m.ttl_ms = 30'000;
  m.keys = {MakeKeyId("n", "a"), MakeKeyId("n", "b")};
  std::vector<uint8_t> body;
  EncodeHint(m, &body);
  HintRequest back;
  ASSERT_TRUE(DecodeHint(body, 16, &back).ok());
  EXPECT_EQ(back.op, 3u);
  EXPECT_EQ(back.priority, 200u);
  EXPECT_EQ(back.ttl_ms, 30'000u);
  EXPECT_EQ(back.keys, m.keys);
  EXPECT_NE(DecodeHint(body, 1, &back).message().find("batch limit"), std::string::npos);
  body.pop_back();
  EXPECT_EQ(DecodeHint(body, 16, &back).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> reply;
  EncodeHintReply({1, 2, 3, 4}, &reply);
  HintReply r;
  ASSERT_TRUE(DecodeHintReply(reply, &r).ok());
  EXPECT_EQ(r.applied + 10 * r.unknown + 100 * r.clipped + 1000 * r.moved, 4321u);
  reply.push_back(0);
  EXPECT_NE(DecodeHintReply(reply, &r).message().find("trailing"), std::string::npos);
}

TEST(CodecTest, CountLargerThanBodyIsRejectedBeforeAllocation) {
  // A count of 4 billion items in an 8-byte body must fail on the count
  // check, not try to allocate.
  std::vector<uint8_t> body = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
  std::vector<KeyId> keys;
  Status s = DecodeKeys(body, UINT32_MAX, &keys);
  EXPECT_NE(s.message().find("exceeds body"), std::string::npos) << s.ToString();
  EXPECT_TRUE(keys.empty());
}

TEST(CodecTest, SizedKeysWithTrailingValueBytes) {
  std::vector<SizedKey> items = {{MakeKeyId("n", "k1"), 3}, {MakeKeyId("n", "k2"), 2}};
  std::vector<uint8_t> body;
  EncodeSizedKeys(items, &body);
  body.insert(body.end(), {'a', 'b', 'c', 'd', 'e'});
  std::vector<SizedKey> back;
  std::span<const uint8_t> rest;
  ASSERT_TRUE(DecodeSizedKeys(body, 16, &back, &rest).ok());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].key, items[1].key);
  EXPECT_EQ(back[0].size, 3u);
  EXPECT_EQ(std::string(rest.begin(), rest.end()), "abcde");
  EXPECT_FALSE(DecodeSizedKeys(body, 16, &back, nullptr).ok());  // trailing bytes
}

// A described request: each descriptor lands on its own item, in any order;
// one naming a key the request does not hold, or a key described twice,
// fails the whole request with the key in the message.
TEST(CodecTest, DescribedSizedKeysPutEachDescriptorOnItsKey) {
  const KeyId a = MakeKeyId("n", "a"), b = MakeKeyId("n", "b"), c = MakeKeyId("n", "c");
  std::vector<SizedKey> items = {{a, 1}, {b, 2}, {c, 3}};
  const std::string da = "AAA", dc = "CCCC";
  std::vector<KeyDescriptor> descs = {
      {c, {reinterpret_cast<const uint8_t*>(dc.data()), dc.size()}},
      {a, {reinterpret_cast<const uint8_t*>(da.data()), da.size()}}};
  std::vector<uint8_t> body;
  EncodeDescribedSizedKeys(items, descs, &body);
  body.insert(body.end(), {'x', 'y', 'y', 'z', 'z', 'z'});
  std::vector<SizedKey> back;
  std::vector<std::span<const uint8_t>> got;
  std::span<const uint8_t> rest;
  ASSERT_TRUE(DecodeDescribedSizedKeys(body, 16, &back, &got, &rest).ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(std::string(got[0].begin(), got[0].end()), "AAA");
  EXPECT_TRUE(got[1].empty());
  EXPECT_EQ(std::string(got[2].begin(), got[2].end()), "CCCC");
  EXPECT_EQ(std::string(rest.begin(), rest.end()), "xyyzzz");

  const KeyId stranger = MakeKeyId("n", "stranger");
  std::vector<KeyDescriptor> bad = {{stranger, {reinterpret_cast<const uint8_t*>(da.data()), 3}}};
  body.clear();
  EncodeDescribedSizedKeys(items, bad, &body);
  Status s = DecodeDescribedSizedKeys(body, 16, &back, &got, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(fmt::format("{:016x}{:016x}", stranger.hi, stranger.lo)),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("not in the request"), std::string::npos) << s.message();

  std::vector<KeyDescriptor> twice = {{b, {reinterpret_cast<const uint8_t*>(da.data()), 3}},
                                      {b, {reinterpret_cast<const uint8_t*>(dc.data()), 4}}};
  body.clear();
  EncodeDescribedSizedKeys(items, twice, &body);
  s = DecodeDescribedSizedKeys(body, 16, &back, &got, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("described twice"), std::string::npos) << s.message();

  // An oversized descriptor is refused before its bytes are looked at.
  std::vector<uint8_t> big;
  EncodeSizedKeys(items, &big);
  BodyWriter w(&big);
  w.U32(1);
  w.Key(a);
  w.U32(kMaxDescriptorBytes + 1);
  big.resize(big.size() + kMaxDescriptorBytes + 1, 0);
  s = DecodeDescribedSizedKeys(big, 16, &back, &got, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("over the limit"), std::string::npos) << s.message();
}

TEST(CodecTest, BlockDescriptorsRoundTripAndBrokenRulesAreNamed) {
  BlockDescriptor d;
  d.hash = {EngineHash::Kind::kUint64, 0xfedcba9876543210ull, ""};
  d.parent = {EngineHash::Kind::kBytes, 0, std::string("\x01\x02\x03", 3)};
  d.block_size = 4;
  d.token_ids = {7, 8, 9, 4000000000u};
  d.group_idx = 2;
  d.lora_name = "adapter-1";
  d.spec_kind = "full";
  auto bytes = EncodeDescriptor(d);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  BlockDescriptor back;
  auto span = [](const std::string& s) {
    return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  ASSERT_TRUE(DecodeDescriptor(span(*bytes), &back).ok());
  EXPECT_EQ(back, d);

  BlockDescriptor neg;
  neg.hash = {EngineHash::Kind::kInt64, static_cast<uint64_t>(int64_t{-5}), ""};
  neg.block_size = 16;
  auto nb = EncodeDescriptor(neg);
  ASSERT_TRUE(nb.ok());
  ASSERT_TRUE(DecodeDescriptor(span(*nb), &back).ok());
  EXPECT_EQ(back, neg);

  auto refused = [&](BlockDescriptor x, const char* why) {
    auto r = EncodeDescriptor(x);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  };
  BlockDescriptor x = d;
  x.token_ids = {1, 2, 3};
  refused(x, "3 token ids for a block of 4");
  x = d;
  x.block_size = 0;
  x.token_ids.clear();
  refused(x, "block_size 0");
  x = d;
  x.hash = {};
  refused(x, "no hash");
  x = d;
  x.hash = {EngineHash::Kind::kBytes, 0, std::string(33, 'h')};
  refused(x, "1 to 32 bytes");

  // Decoding names the rule too, and nothing may trail or be cut.
  std::string cut = bytes->substr(0, bytes->size() - 1);
  EXPECT_EQ(DecodeDescriptor(span(cut), &back).code(), StatusCode::kInvalidArgument);
  std::string trailing = *bytes + "!";
  Status s = DecodeDescriptor(span(trailing), &back);
  EXPECT_NE(s.message().find("trailing"), std::string::npos) << s.message();
  std::string v2 = *bytes;
  v2[0] = 2;
  s = DecodeDescriptor(span(v2), &back);
  EXPECT_NE(s.message().find("version 2"), std::string::npos) << s.message();
  std::string kind = *bytes;
  kind[1] = 9;  // hash kind
  EXPECT_EQ(DecodeDescriptor(span(kind), &back).code(), StatusCode::kInvalidArgument);
  // A token count the bytes cannot hold is refused before anything grows.
  std::string many = *bytes;
  const size_t at = 1 + 9 + 1 + 1 + 3 + 4;  // version, hash, parent kind+len+bytes, block size
  many[at] = '\xff';
  many[at + 1] = '\xff';
  EXPECT_EQ(DecodeDescriptor(span(many), &back).code(), StatusCode::kInvalidArgument);
}

TEST(CodecTest, RepliesRoundTrip) {
  std::vector<RegionItem> regions = {{0, 7, 4096, 100}, {1, 0, 0, 0}};
  std::vector<uint8_t> body;
  EncodeRegionItems(regions, &body);
  std::vector<RegionItem> rback;
  ASSERT_TRUE(DecodeRegionItems(body, 16, &rback).ok());
  EXPECT_EQ(rback[0].handle, 7u);
  EXPECT_EQ(rback[0].offset, 4096u);
  EXPECT_EQ(rback[1].status, 1);

  ExistsReply e;
  e.hits = {1, 1, 0, 1};
  e.prefix_len = 2;
  body.clear();
  EncodeExistsReply(e, &body);
  ExistsReply eback;
  ASSERT_TRUE(DecodeExistsReply(body, 16, &eback).ok());
  EXPECT_EQ(eback.hits, e.hits);
  EXPECT_EQ(eback.prefix_len, 2u);

  std::vector<GetItem> items = {{0, 3}, {1, 0}, {0, 2}};
  body.clear();
  EncodeGetItems(items, &body);
  body.insert(body.end(), {'x', 'y', 'z', 'p', 'q'});
  std::vector<GetItem> gback;
  std::span<const uint8_t> data;
  ASSERT_TRUE(DecodeGetReply(body, 16, &gback, &data).ok());
  EXPECT_EQ(data.size(), 5u);
  body.push_back('!');
  EXPECT_FALSE(DecodeGetReply(body, 16, &gback, &data).ok());

  HelloReply h{42, 1 << 30, 64 << 20, 4096, 80 << 20};
  body.clear();
  EncodeHelloReply(h, &body);
  HelloReply hback;
  ASSERT_TRUE(DecodeHelloReply(body, &hback).ok());
  EXPECT_EQ(hback.instance_id, 42u);
  EXPECT_EQ(hback.max_frame_bytes, 80u << 20);
}

TEST(CodecTest, OneIntegerBodiesMustBeExact) {
  std::vector<uint8_t> b;
  EncodeU32Body(0x5e953bb2u, &b);
  uint32_t v32 = 0;
  ASSERT_TRUE(DecodeU32Body(b, &v32).ok());
  EXPECT_EQ(v32, 0x5e953bb2u);
  EXPECT_EQ(DecodeU32Body(std::span(b).first(3), &v32).code(), StatusCode::kInvalidArgument);
  b.push_back(0);
  EXPECT_EQ(DecodeU32Body(b, &v32).code(), StatusCode::kInvalidArgument);  // trailing byte
  EXPECT_EQ(DecodeU32Body({}, &v32).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> c;
  EncodeU64Body(1ull << 40, &c);
  uint64_t v64 = 0;
  ASSERT_TRUE(DecodeU64Body(c, &v64).ok());
  EXPECT_EQ(v64, 1ull << 40);
  EXPECT_EQ(DecodeU64Body(std::span(c).first(7), &v64).code(), StatusCode::kInvalidArgument);
}

TEST(CodecTest, StringsAreBounded) {
  std::vector<uint8_t> body = {0xff, 0xff, 0xff, 0x7f};
  HelloRequest req;
  EXPECT_FALSE(DecodeHello(body, &req).ok());
  body.clear();
  HelloRequest big;
  big.client_name = std::string(kMaxClientName + 1, 'x');
  EncodeHello(big, &body);
  EXPECT_NE(DecodeHello(body, &req).message().find("limit"), std::string::npos);
}

TEST(CodecTest, HelloCarriesAnOptionalTenantToken) {
  HelloRequest plain;
  plain.client_name = "engine";
  std::vector<uint8_t> body;
  EncodeHello(plain, &body);
  HelloRequest back;
  ASSERT_TRUE(DecodeHello(body, &back).ok());
  EXPECT_FALSE(back.has_token);
  HelloRequest with = plain;
  with.has_token = true;
  with.token_name = "alpha-jobs";
  for (size_t i = 0; i < with.token.size(); ++i) with.token[i] = static_cast<uint8_t>(i * 7);
  body.clear();
  EncodeHello(with, &body);
  ASSERT_TRUE(DecodeHello(body, &back).ok());
  EXPECT_TRUE(back.has_token);
  EXPECT_EQ(back.token_name, "alpha-jobs");
  EXPECT_EQ(back.token, with.token);
  body.pop_back();  // a token one byte short
  EXPECT_EQ(DecodeHello(body, &back).code(), StatusCode::kInvalidArgument);
}

TEST(CodecTest, RandomBytesNeverCrashDecoders) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b(rng() % 64);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    for (int d = 0; d < kNumDecoders; ++d) RunDecoder(d, b, 4096);
  }
}

}  // namespace
}  // namespace kvpool::protocol
