// Bad input on the local socket: each case gets a clear error (or a close),
// is counted, and the node keeps serving others with nothing stored lost.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "protocol/codec.h"

namespace kvpool::testing {
namespace {

using protocol::FrameHeader;
using protocol::MessageType;

class Raw {
 public:
  explicit Raw(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Raw() { close(fd_); }
  void Send(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  static std::vector<uint8_t> Frame(MessageType type, const std::vector<uint8_t>& body,
                                    uint32_t magic = protocol::kMagic, uint16_t version = protocol::kProtocolVersion,
                                    int64_t body_len = -1) {
    std::vector<uint8_t> f(protocol::kHeaderBytes);
    FrameHeader h;
    h.magic = magic;
    h.version = version;
    h.type = static_cast<uint16_t>(type);
    h.request_id = 77;
    h.body_len = body_len >= 0 ? static_cast<uint32_t>(body_len) : static_cast<uint32_t>(body.size());
    protocol::EncodeHeader(h, f.data());
    f.insert(f.end(), body.begin(), body.end());
    return f;
  }
  // Reads one reply frame; false on EOF or timeout.
  bool Read(FrameHeader* h, std::vector<uint8_t>* body) {
    uint8_t hb[protocol::kHeaderBytes];
    if (!ReadN(hb, sizeof(hb))) return false;
    if (!protocol::DecodeHeader(std::span(hb, sizeof(hb)), 1u << 30, h).ok()) return false;
    body->resize(h->body_len);
    return ReadN(body->data(), body->size());
  }
  bool AtEof() {
    char c;
    return read(fd_, &c, 1) == 0;
  }
  void Hello() {
    std::vector<uint8_t> body;
    protocol::HelloRequest hello;
    hello.client_name = "raw";
    protocol::EncodeHello(hello, &body);
    Send(Frame(MessageType::kHello, body));
    FrameHeader h;
    std::vector<uint8_t> rb;
    ASSERT_TRUE(Read(&h, &rb));
    ASSERT_EQ(h.status, 0);
  }
  int fd() const { return fd_; }

 private:
  bool ReadN(uint8_t* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = read(fd_, p + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  int fd_;
};

constexpr uint16_t kErrorReply = static_cast<uint16_t>(MessageType::kError) | protocol::kReplyBit;

class MalformedInput : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = NodeProcess::Start({"--max-batch", "64"});
    ASSERT_NE(node_, nullptr);
    kvpool_options o;
    kvpool_options_init(&o);
    o.socket_path = node_->socket().c_str();
    kvpool_status st;
    client_ = kvpool_open(&o, &st);
    ASSERT_NE(client_, nullptr);
    for (int i = 0; i < 20; ++i) {
      values_.push_back(Pattern(i, 5000 + i));
      ids_.push_back(Client::KeyId("keep", std::to_string(i)));
      const void* p = values_.back().data();
      uint64_t size = values_.back().size();
      ASSERT_EQ(kvpool_put(client_, &ids_.back(), &p, &size, 1, &st), KVPOOL_OK);
    }
  }
  void TearDown() override {
    if (client_ == nullptr) return;
    // Everything stored is still there, byte for byte, and the node serves.
    for (size_t i = 0; i < ids_.size(); ++i) {
      std::vector<uint8_t> out(10000);
      void* b = out.data();
      uint64_t cap = out.size(), got = 0;
      kvpool_status st;
      ASSERT_EQ(kvpool_get(client_, &ids_[i], &b, &cap, 1, &got, &st), KVPOOL_OK);
      ASSERT_EQ(st, KVPOOL_OK);
      ASSERT_EQ(got, values_[i].size());
      ASSERT_EQ(0, memcmp(out.data(), values_[i].data(), got));
    }
    kvpool_close(client_);
  }
  double Errors(const std::string& reason) {
    return node_->Metric("kvpool_protocol_errors_total{reason=\"" + reason + "\"}");
  }
  void ExpectErrorThenClose(Raw& r, const std::string& text) {
    FrameHeader h;
    std::vector<uint8_t> body;
    ASSERT_TRUE(r.Read(&h, &body));
    EXPECT_EQ(h.type, kErrorReply);
    EXPECT_EQ(h.status, static_cast<int32_t>(StatusCode::kInvalidArgument));
    std::string msg;
    ASSERT_TRUE(protocol::DecodeString(body, &msg).ok());
    EXPECT_NE(msg.find(text), std::string::npos) << msg;
    EXPECT_TRUE(r.AtEof());
  }

  std::unique_ptr<NodeProcess> node_;
  kvpool_client* client_ = nullptr;
  std::vector<std::vector<uint8_t>> values_;
  std::vector<kvpool_key_id> ids_;
};

TEST_F(MalformedInput, BadMagicIsAnsweredAndClosed) {
  Raw r(node_->socket());
  r.Send(Raw::Frame(MessageType::kHello, {}, 0xdeadbeef));
  ExpectErrorThenClose(r, "bad magic");
  EXPECT_EQ(Errors("bad_magic"), 1);
}

TEST_F(MalformedInput, BadVersionIsAnsweredAndClosed) {
  Raw r(node_->socket());
  r.Send(Raw::Frame(MessageType::kHello, {}, protocol::kMagic, 9));
  ExpectErrorThenClose(r, "unsupported protocol version 9");
  EXPECT_EQ(Errors("bad_version"), 1);
}

TEST_F(MalformedInput, OversizedFramesAreRefusedBeforeAllocation) {
  {
    Raw r(node_->socket());  // before the handshake: 4 KiB at most
    r.Send(
        Raw::Frame(MessageType::kHello, {}, protocol::kMagic, protocol::kProtocolVersion, 1 << 20));
    ExpectErrorThenClose(r, "over the limit of 4096");
  }
  {
    Raw r(node_->socket());  // after it: the frame limit, here a 2 GiB claim
    r.Hello();
    r.Send(Raw::Frame(MessageType::kPut, {}, protocol::kMagic, protocol::kProtocolVersion,
                      0x7fffffff));
    ExpectErrorThenClose(r, "over the limit");
  }
  EXPECT_EQ(Errors("frame_too_large"), 2);
}

TEST_F(MalformedInput, RequestBeforeHandshakeIsRefused) {
  Raw r(node_->socket());
  std::vector<uint8_t> body;
  protocol::EncodeKeys(std::vector<KeyId>{MakeKeyId("a", "b")}, &body);
  r.Send(Raw::Frame(MessageType::kExists, body));
  FrameHeader h;
  std::vector<uint8_t> rb;
  ASSERT_TRUE(r.Read(&h, &rb));
  EXPECT_EQ(h.type, kErrorReply);
  EXPECT_EQ(h.status, static_cast<int32_t>(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(r.AtEof());
  EXPECT_EQ(Errors("no_handshake"), 1);
}

TEST_F(MalformedInput, UnknownTypeAndBadBodiesKeepTheConnection) {
  Raw r(node_->socket());
  r.Hello();
  FrameHeader h;
  std::vector<uint8_t> rb;
  // Unknown message type.
  r.Send(Raw::Frame(static_cast<MessageType>(999), {1, 2, 3}));
  ASSERT_TRUE(r.Read(&h, &rb));
  EXPECT_EQ(h.type, kErrorReply);
  EXPECT_EQ(h.status, static_cast<int32_t>(StatusCode::kInvalidArgument));
  // A batch over the node's limit (64 here).
  std::vector<KeyId> many(65, MakeKeyId("a", "b"));
  std::vector<uint8_t> body;
  protocol::EncodeKeys(many, &body);
  r.Send(Raw::Frame(MessageType::kExists, body));
  ASSERT_TRUE(r.Read(&h, &rb));
  EXPECT_EQ(h.type, kErrorReply);
  std::string msg;
  ASSERT_TRUE(protocol::DecodeString(rb, &msg).ok());
  EXPECT_NE(msg.find("batch limit"), std::string::npos) << msg;
  // A count larger than the body.
  r.Send(Raw::Frame(MessageType::kAcquire, {0x40, 0, 0, 0, 1, 2}));
  ASSERT_TRUE(r.Read(&h, &rb));
  EXPECT_EQ(h.type, kErrorReply);
  // Put whose sizes do not add up to the bytes sent.
  std::vector<protocol::SizedKey> items = {{MakeKeyId("keep", "zz"), 5}};
  body.clear();
  protocol::EncodeSizedKeys(items, &body);
  body.resize(body.size() + 10);
  r.Send(Raw::Frame(MessageType::kPut, body));
  ASSERT_TRUE(r.Read(&h, &rb));
  EXPECT_EQ(h.type, kErrorReply);
  ASSERT_TRUE(protocol::DecodeString(rb, &msg).ok());
  EXPECT_NE(msg.find("do not add up"), std::string::npos) << msg;
  // The connection still works.
  body.clear();
  protocol::EncodeKeys(std::vector<KeyId>{MakeKeyId("keep", "0")}, &body);
  r.Send(Raw::Frame(MessageType::kExists, body));
  ASSERT_TRUE(r.Read(&h, &rb));
  EXPECT_EQ(h.type, static_cast<uint16_t>(MessageType::kExists) | protocol::kReplyBit);
  protocol::ExistsReply e;
  ASSERT_TRUE(protocol::DecodeExistsReply(rb, 64, &e).ok());
  EXPECT_EQ(e.hits, std::vector<uint8_t>{1});
  EXPECT_EQ(Errors("unknown_type"), 1);
  EXPECT_EQ(Errors("malformed_body"), 3);
}

TEST_F(MalformedInput, OneByteWritesAreReassembled) {
  Raw r(node_->socket());
  std::vector<uint8_t> body;
  protocol::HelloRequest hello;
  hello.client_name = "slow";
  protocol::EncodeHello(hello, &body);
  auto frame = Raw::Frame(MessageType::kHello, body);
  for (uint8_t b : frame) r.Send({b});
  FrameHeader h;
  std::vector<uint8_t> rb;
  ASSERT_TRUE(r.Read(&h, &rb));
  EXPECT_EQ(h.type, static_cast<uint16_t>(MessageType::kHello) | protocol::kReplyBit);
  EXPECT_EQ(h.status, 0);
}

TEST_F(MalformedInput, GarbageAfterAValidFrameAndTruncatedFrames) {
  {
    Raw r(node_->socket());
    r.Hello();
    std::vector<uint8_t> body;
    protocol::EncodeKeys(std::vector<KeyId>{MakeKeyId("keep", "1")}, &body);
    auto frame = Raw::Frame(MessageType::kExists, body);
    std::vector<uint8_t> garbage(100, 0x41);
    frame.insert(frame.end(), garbage.begin(), garbage.end());
    r.Send(frame);
    FrameHeader h;
    std::vector<uint8_t> rb;
    ASSERT_TRUE(r.Read(&h, &rb));  // the valid frame is answered
    EXPECT_EQ(h.type, static_cast<uint16_t>(MessageType::kExists) | protocol::kReplyBit);
    ExpectErrorThenClose(r, "bad magic");  // then the stream is dropped
  }
  {
    Raw r(node_->socket());
    r.Hello();
    auto frame = Raw::Frame(MessageType::kExists, std::vector<uint8_t>(40, 0));
    frame.resize(30);  // header plus a few body bytes, then the client goes away
    r.Send(frame);
  }
  EXPECT_EQ(Errors("bad_magic"), 1);
}

}  // namespace
}  // namespace kvpool::testing
