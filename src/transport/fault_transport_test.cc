#include "transport/fault_transport.h"

#include <gtest/gtest.h>

#include "transport/in_process_transport.h"

namespace kvpool::transport {
namespace {

using std::chrono::milliseconds;

class FaultTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = net_.AddNode("a:1");
    b_ = net_.AddNode("b:1");
    c_ = net_.AddNode("c:1");
    for (Transport* t : {static_cast<Transport*>(b_.get()), static_cast<Transport*>(c_.get())}) {
      t->RegisterHandler(1, [](Incoming in, Responder r) {
        r.Respond(Status::Ok(), std::vector<uint8_t>(in.request.begin(), in.request.end()));
      });
    }
    fault_ = std::make_unique<FaultTransport>(a_.get(), 42);
  }
  Reply CallTo(const std::string& peer, milliseconds budget) {
    CallArgs args;
    args.peer = peer;
    args.type = 1;
    args.request = AsBytes("hi");
    args.deadline = SteadyClock::now() + budget;
    return fault_->CallSync(args);
  }

  InProcessNetwork net_;
  std::unique_ptr<LocalTransport> a_, b_, c_;
  std::unique_ptr<FaultTransport> fault_;
};

TEST_F(FaultTransportTest, PassesThroughWithoutRules) {
  Reply r = CallTo("b:1", milliseconds(10000));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(AsString(r.header), "hi");
  EXPECT_EQ(fault_->address(), "a:1");
}

TEST_F(FaultTransportTest, DelayAppliesToTheChosenPeerOnly) {
  fault_->SetRule("b:1", FaultRule{.delay = milliseconds(100)});
  auto start = SteadyClock::now();
  EXPECT_TRUE(CallTo("b:1", milliseconds(10000)).status.ok());
  EXPECT_GE(SteadyClock::now() - start, milliseconds(100));
  // c has no rule; its call is not delayed (generous bound: only the order matters).
  start = SteadyClock::now();
  EXPECT_TRUE(CallTo("c:1", milliseconds(10000)).status.ok());
  EXPECT_LT(SteadyClock::now() - start, milliseconds(100));
}

TEST_F(FaultTransportTest, DelayPastTheDeadlineTimesOutByTheDeadline) {
  fault_->SetDefaultRule(FaultRule{.delay = milliseconds(5000)});
  auto start = SteadyClock::now();
  Reply r = CallTo("b:1", milliseconds(100));
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(SteadyClock::now() - start, milliseconds(1000));
}

TEST_F(FaultTransportTest, DropTimesOutAtTheDeadline) {
  fault_->SetRule("b:1", FaultRule{.drop_probability = 1.0});
  auto start = SteadyClock::now();
  Reply r = CallTo("b:1", milliseconds(150));
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(SteadyClock::now() - start, milliseconds(150));
  EXPECT_LT(SteadyClock::now() - start, milliseconds(1000));
}

TEST_F(FaultTransportTest, PartialDropLosesSomeCalls) {
  fault_->SetDefaultRule(FaultRule{.drop_probability = 0.5});
  int ok = 0, timed_out = 0;
  for (int i = 0; i < 40; ++i) {
    Reply r = CallTo("b:1", milliseconds(20));
    if (r.status.ok()) ++ok;
    if (r.status.code() == StatusCode::kDeadlineExceeded) ++timed_out;
  }
  EXPECT_GT(ok, 5);
  EXPECT_GT(timed_out, 5);
  EXPECT_EQ(ok + timed_out, 40);
}

TEST_F(FaultTransportTest, UnavailablePeerFailsFastAndHeals) {
  fault_->SetRule("b:1", FaultRule{.unavailable = true});
  auto start = SteadyClock::now();
  EXPECT_EQ(CallTo("b:1", milliseconds(10000)).status.code(), StatusCode::kUnavailable);
  EXPECT_LT(SteadyClock::now() - start, milliseconds(1000));
  fault_->ClearRules();
  EXPECT_TRUE(CallTo("b:1", milliseconds(10000)).status.ok());
}

}  // namespace
}  // namespace kvpool::transport
