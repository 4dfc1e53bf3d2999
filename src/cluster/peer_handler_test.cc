// ServePeer on its own: the wrapper every peer handler is registered
// through. Node A serves one message type, B (a bare in-process transport)
// calls it: every request is counted, a fenced A refuses without running
// the body, a body's error is answered for it and an InvalidArgument is
// counted as malformed, and WhenFenced::kServe answers while fenced.
#include "cluster/peer_handler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "transport/in_process_transport.h"

namespace kvpool::cluster {
namespace {

using std::chrono::milliseconds;
using transport::Incoming;
using transport::Responder;

// A membership whose fence the test sets.
class TestMembership : public Membership {
 public:
  explicit TestMembership(MetricsRegistry* metrics) : Membership("a", metrics) {
    SetIncarnation(1);
    Publish({{"a", "a:1", 1, 1.0}, {"b", "b:1", 0, 1.0}}, 1);
  }
  using Membership::SetFenced;
};

constexpr transport::MessageType kEcho = 0x7e01;
constexpr transport::MessageType kProbe = 0x7e02;

class PeerHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = std::make_unique<TestMembership>(&metrics_);
    membership_ = m.get();
    cluster_ = Cluster::Assemble("a", net_.AddNode("a:1"), std::move(m));
    // Echo: the request back as the payload; a request starting with 'x'
    // is malformed, one starting with 'n' is not found.
    ServePeer(cluster_.get(), &metrics_, {kEcho, "echo"}, [this](Incoming& in, Responder& r) {
      ++bodies_;
      if (!in.request.empty() && in.request[0] == 'x') return InvalidArgument("echo: bad");
      if (!in.request.empty() && in.request[0] == 'n') return NotFound("echo: none");
      RespondWithBody(r, std::vector<uint8_t>(in.request.begin(), in.request.end()));
      return Status::Ok();
    });
    ServePeer(cluster_.get(), &metrics_, {kProbe, "probe", WhenFenced::kServe},
              [](Incoming&, Responder& r) {
                RespondEncoded(r, [](std::vector<uint8_t>* b) { b->assign({'o', 'k'}); });
                return Status::Ok();
              });
    b_ = net_.AddNode("b:1");
  }
  void TearDown() override {
    b_.reset();
    cluster_.reset();
  }

  transport::Reply Call(transport::MessageType type, const std::string& request) {
    transport::CallArgs args;
    args.peer = "a:1";
    args.type = type;
    args.request =
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(request.data()), request.size());
    args.deadline = transport::SteadyClock::now() + milliseconds(5000);
    return b_->CallSync(args);
  }
  double Count(const std::string& name, const std::string& type) {
    return metrics_.ValueOf(name, {{"type", type}});
  }
  static std::string Text(const transport::Reply& r) {
    return std::string(r.payload.begin(), r.payload.end());
  }

  MetricsRegistry metrics_;
  transport::InProcessNetwork net_;
  TestMembership* membership_ = nullptr;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<transport::Transport> b_;
  std::atomic<int> bodies_{0};
};

TEST_F(PeerHandlerTest, AnswersCountsAndAnswersABodysErrorForIt) {
  auto ok = Call(kEcho, "hello");
  ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
  EXPECT_EQ(Text(ok), "hello");
  auto bad = Call(kEcho, "xyz");
  EXPECT_EQ(bad.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status.message(), "echo: bad");
  auto none = Call(kEcho, "nope");
  EXPECT_EQ(none.status.code(), StatusCode::kNotFound);
  EXPECT_EQ(bodies_.load(), 3);
  EXPECT_EQ(Count("kvpool_peer_requests_total", "echo"), 3);
  EXPECT_EQ(Count("kvpool_peer_bad_requests_total", "echo"), 1);  // NotFound is no bad request
  EXPECT_EQ(Count("kvpool_peer_refused_total", "echo"), 0);
  EXPECT_EQ(Count("kvpool_peer_requests_total", "probe"), 0);
}

TEST_F(PeerHandlerTest, AFencedNodeRefusesWithoutRunningTheBodyUnlessServedWhileFenced) {
  membership_->SetFenced(true);
  auto refused = Call(kEcho, "hello");
  EXPECT_EQ(refused.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(refused.status.message(), "node is fenced");
  EXPECT_EQ(bodies_.load(), 0);
  auto probe = Call(kProbe, "");
  ASSERT_TRUE(probe.status.ok()) << probe.status.ToString();
  EXPECT_EQ(Text(probe), "ok");
  EXPECT_EQ(Count("kvpool_peer_requests_total", "echo"), 1);
  EXPECT_EQ(Count("kvpool_peer_refused_total", "echo"), 1);
  EXPECT_EQ(Count("kvpool_peer_refused_total", "probe"), 0);
  // Unfenced: served again.
  membership_->SetFenced(false);
  auto back = Call(kEcho, "again");
  ASSERT_TRUE(back.status.ok());
  EXPECT_EQ(Text(back), "again");
  EXPECT_EQ(bodies_.load(), 1);
}

}  // namespace
}  // namespace kvpool::cluster
