#include "transport/transport_contract_test.h"

#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "testing/wait_for.h"

namespace kvpool::transport::testing {
namespace {

using std::chrono::milliseconds;

constexpr MessageType kEcho = 1;      // reply = request reversed, payload echoed
constexpr MessageType kBigGet = 2;    // reply payload = the 64 MiB pattern
constexpr MessageType kSilent = 3;    // never answers (keeps the responder)
constexpr MessageType kFail = 4;      // answers NotFound("nope")
constexpr MessageType kDrop = 5;      // drops the responder
constexpr MessageType kLater = 6;     // answers from another thread
constexpr MessageType kChecksum = 7;  // reply = u64 sum of the request payload

constexpr size_t kBig = 64u << 20;

const std::vector<uint8_t>& Pattern() {
  static const std::vector<uint8_t> p = [] {
    std::vector<uint8_t> v(kBig);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < v.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(&v[i], &x, 8);
    }
    return v;
  }();
  return p;
}

uint64_t Sum(std::span<const uint8_t> b) {
  uint64_t s = 0;
  for (size_t i = 0; i < b.size(); ++i) s = s * 31 + b[i];
  return s;
}

Deadline In(milliseconds ms) { return SteadyClock::now() + ms; }

struct Server {
  std::mutex mu;
  std::vector<Responder> held;  // kSilent responders, answered never
};

void InstallHandlers(Transport* t, Server* s) {
  t->RegisterHandler(kEcho, [](Incoming in, Responder r) {
    std::vector<uint8_t> h(in.request.rbegin(), in.request.rend());
    auto copy = std::make_shared<std::vector<uint8_t>>(in.payload.begin(), in.payload.end());
    r.Respond(ServerReply{Status::Ok(), std::move(h), *copy, [copy] {}});
  });
  t->RegisterHandler(kBigGet, [](Incoming, Responder r) {
    r.Respond(ServerReply{Status::Ok(), {1, 2, 3}, Pattern(), nullptr});
  });
  t->RegisterHandler(kSilent, [s](Incoming, Responder r) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->held.push_back(std::move(r));
  });
  t->RegisterHandler(kFail, [](Incoming, Responder r) { r.Respond(NotFound("nope")); });
  t->RegisterHandler(kDrop, [](Incoming, Responder r) {});
  t->RegisterHandler(kLater, [](Incoming in, Responder r) {
    // Answered from another thread, once the handler is done with the call.
    std::promise<void> handed;
    std::thread([r = std::move(r), h = std::vector<uint8_t>(in.request.begin(), in.request.end()),
                 done = handed.get_future()]() mutable {
      done.wait();
      r.Respond(Status::Ok(), std::move(h));
    }).detach();
    handed.set_value();
  });
  t->RegisterHandler(kChecksum, [](Incoming in, Responder r) {
    uint64_t sum = Sum(in.payload);
    std::vector<uint8_t> h(8);
    std::memcpy(h.data(), &sum, 8);
    r.Respond(Status::Ok(), std::move(h));
  });
}

CallArgs Args(Transport* to, MessageType type, std::string_view request, milliseconds budget) {
  CallArgs a;
  a.peer = to->address();
  a.type = type;
  a.request = AsBytes(request);
  a.deadline = In(budget);
  return a;
}

TEST_P(TransportContractTest, RoundTrip) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  std::string payload = "payload bytes";
  CallArgs a = Args(server, kEcho, "abc", milliseconds(10000));
  a.payload = AsBytes(payload);
  Reply r = client->CallSync(a);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(AsString(r.header), "cba");
  EXPECT_EQ(AsString(r.payload), payload);
  EXPECT_EQ(r.payload_bytes, payload.size());
}

TEST_P(TransportContractTest, HandlerStatusAndMissingHandler) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  Reply r = client->CallSync(Args(server, kFail, "", milliseconds(10000)));
  EXPECT_EQ(r.status.code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status.message(), "nope");
  r = client->CallSync(Args(server, 999, "", milliseconds(10000)));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();
  r = client->CallSync(Args(server, kDrop, "", milliseconds(10000)));
  EXPECT_EQ(r.status.code(), StatusCode::kInternal) << r.status.ToString();
  r = client->CallSync(Args(server, kLater, "later", milliseconds(10000)));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(AsString(r.header), "later");
}

TEST_P(TransportContractTest, ConcurrentCallsFromSeveralThreads) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  constexpr int kThreads = 4, kCalls = 200;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        std::string req = std::to_string(t) + ":" + std::to_string(i);
        std::string payload(static_cast<size_t>(i * 37 % 5000), static_cast<char>('a' + t));
        CallArgs a = Args(server, kEcho, req, milliseconds(20000));
        a.payload = AsBytes(payload);
        Reply r = client->CallSync(a);
        if (r.status.ok() && AsString(r.header) == std::string(req.rbegin(), req.rend()) &&
            AsString(r.payload) == payload) {
          ok.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kCalls);
}

TEST_P(TransportContractTest, LargePayloadLandsInCallerSink) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  std::vector<uint8_t> sink(kBig + 4096, 0xEE);
  CallArgs a = Args(server, kBigGet, "", milliseconds(20000));
  a.sink = std::span<uint8_t>(sink.data(), kBig);
  Reply r = client->CallSync(a);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.payload_bytes, kBig);
  EXPECT_TRUE(r.payload.empty());
  EXPECT_EQ(std::memcmp(sink.data(), Pattern().data(), kBig), 0);
  EXPECT_EQ(sink[kBig], 0xEE);  // nothing written past the sink
  EXPECT_EQ(r.header, (std::vector<uint8_t>{1, 2, 3}));

  // The other direction: a 64 MiB request payload (a remote put).
  a = Args(server, kChecksum, "", milliseconds(20000));
  a.payload = Pattern();
  r = client->CallSync(a);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  uint64_t sum = 0;
  ASSERT_EQ(r.header.size(), 8u);
  std::memcpy(&sum, r.header.data(), 8);
  EXPECT_EQ(sum, Sum(Pattern()));
}

TEST_P(TransportContractTest, SinkTooSmallIsResourceExhausted) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  std::vector<uint8_t> sink(1024);
  CallArgs a = Args(server, kBigGet, "", milliseconds(20000));
  a.sink = sink;
  Reply r = client->CallSync(a);
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted) << r.status.ToString();
  // The connection is still usable afterwards.
  r = client->CallSync(Args(server, kEcho, "x", milliseconds(10000)));
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
}

TEST_P(TransportContractTest, SilentPeerTimesOutByDeadline) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  // Warm the connection so the measured call is only the wait.
  ASSERT_TRUE(client->CallSync(Args(server, kEcho, "w", milliseconds(10000))).status.ok());
  auto start = SteadyClock::now();
  Reply r = client->CallSync(Args(server, kSilent, "", milliseconds(200)));
  auto took = SteadyClock::now() - start;
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded) << r.status.ToString();
  EXPECT_GE(took, milliseconds(200));
  EXPECT_LT(took, milliseconds(300));
  // A reply after the deadline is dropped and the connection stays usable.
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ASSERT_EQ(s.held.size(), 1u);
    s.held[0].Respond(Status::Ok(), {9});
  }
  r = client->CallSync(Args(server, kEcho, "ok", milliseconds(10000)));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(AsString(r.header), "ko");
}

TEST_P(TransportContractTest, DeadOrMissingPeerIsUnavailable) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  std::string server_address = server->address();
  ASSERT_TRUE(client->CallSync(Args(server, kEcho, "w", milliseconds(10000))).status.ok());

  CallArgs a = Args(server, kEcho, "", milliseconds(20000));
  auto start = SteadyClock::now();
  cluster_->Kill(server);
  Reply r;
  a.peer = server_address;
  a.deadline = In(milliseconds(20000));
  r = client->CallSync(a);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_LT(SteadyClock::now() - start, milliseconds(5000));

  CallArgs b;
  b.peer = cluster_->DeadAddress();
  b.type = kEcho;
  b.deadline = In(milliseconds(20000));
  start = SteadyClock::now();
  r = client->CallSync(b);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_LT(SteadyClock::now() - start, milliseconds(5000));
}

TEST_P(TransportContractTest, InFlightCallFailsWhenPeerDies) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  std::atomic<bool> done{false};
  Status st;
  SteadyClock::time_point finished;
  client->Call(Args(server, kSilent, "", milliseconds(20000)), [&](Reply r) {
    st = std::move(r.status);
    finished = SteadyClock::now();
    done = true;
  });
  while (true) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.held.empty()) break;
  }
  auto start = SteadyClock::now();
  cluster_->Kill(server);
  ASSERT_TRUE(
      kvpool::testing::WaitFor([&] { return done.load(); }, milliseconds(30000), milliseconds(1)));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_LT(finished - start, milliseconds(5000));
  // Responders may outlive their transport; answering then is a no-op.
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& r : s.held) r.Respond(Status::Ok());
}

TEST_P(TransportContractTest, OversizedRequestIsRejected) {
  Server s;
  Transport* server = cluster_->Add();
  Transport* client = cluster_->Add();
  InstallHandlers(server, &s);
  std::string huge(1 << 20, 'h');  // over the header limit
  Reply r = client->CallSync(Args(server, kEcho, huge, milliseconds(10000)));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();
}

}  // namespace
}  // namespace kvpool::transport::testing
