#include "protocol/codec.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include "protocol/codec_test_util.h"

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
