// kvpool-transport-bench: request/reply rate and large-payload throughput of
// the UCX transport, for comparison with iperf3 on the same link.
//
//   kvpool-transport-bench server [--listen HOST:PORT] [--tls tcp]
//   kvpool-transport-bench client --peer HOST:PORT [--op rr|get|put]
//                          [--size BYTES] [--seconds S] [--depth N] [--tls tcp]
//   kvpool-transport-bench loopback [same client flags]   (both in one process)
//
// rr: small request, empty reply (calls/s). get: the reply carries --size
// bytes landing in a caller sink (GB/s). put: the request carries them.
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "transport/ucx_transport.h"

namespace kvpool::transport {
namespace {

constexpr MessageType kRr = 1, kGet = 2, kPut = 3;

struct Flags {
  std::string mode, listen = "127.0.0.1:0", peer, op = "rr", tls = "tcp";
  size_t size = 4 << 20;
  double seconds = 5;
  int depth = 8;
};

bool Parse(int argc, char** argv, Flags* f) {
  if (argc < 2) return false;
  f->mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--listen") f->listen = v;
    else if (k == "--peer") f->peer = v;
    else if (k == "--op") f->op = v;
    else if (k == "--tls") f->tls = v;
    else if (k == "--size") f->size = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--seconds") f->seconds = std::strtod(v.c_str(), nullptr);
    else if (k == "--depth") f->depth = std::atoi(v.c_str());
    else return false;
  }
  return f->mode == "server" || f->mode == "client" || f->mode == "loopback";
}

std::unique_ptr<UcxTransport> Open(const Flags& f, const std::string& listen) {
  UcxTransportOptions o;
  size_t colon = listen.rfind(':');
  o.listen_host = listen.substr(0, colon);
  o.listen_port = static_cast<uint16_t>(std::atoi(listen.c_str() + colon + 1));
  o.tls = f.tls;
  auto t = UcxTransport::Open(o);
  if (!t.ok()) {
    std::fprintf(stderr, "open: %s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(t).value();
}

void Serve(Transport* t) {
  static std::vector<uint8_t> source;  // served by get; sized on first use
  static std::mutex mu;
  t->RegisterHandler(kRr, [](Incoming, Responder r) { r.Respond(Status::Ok()); });
  t->RegisterHandler(kPut, [](Incoming, Responder r) { r.Respond(Status::Ok()); });
  t->RegisterHandler(kGet, [](Incoming in, Responder r) {
    uint64_t size = 0;
    if (in.request.size() == 8) std::memcpy(&size, in.request.data(), 8);
    std::lock_guard<std::mutex> lock(mu);
    if (source.size() < size) source.assign(size, 0x5A);
    r.Respond(ServerReply{Status::Ok(), {}, std::span<const uint8_t>(source.data(), size), nullptr});
  });
}

void RunClient(Transport* t, const Flags& f) {
  const bool bulk = f.op != "rr";
  std::vector<std::vector<uint8_t>> bufs(f.depth, std::vector<uint8_t>(bulk ? f.size : 0, 1));
  uint64_t size = f.size;
  std::vector<uint8_t> get_req(8);
  std::memcpy(get_req.data(), &size, 8);
  std::mutex mu;
  std::condition_variable cv;
  uint64_t done = 0, failed = 0;
  int in_flight = 0;
  auto start = SteadyClock::now();
  auto end = start + std::chrono::duration_cast<SteadyClock::duration>(
                         std::chrono::duration<double>(f.seconds));
  std::function<void(int)> issue = [&](int slot) {
    CallArgs a;
    a.peer = f.peer;
    a.deadline = SteadyClock::now() + std::chrono::seconds(10);
    if (f.op == "rr") {
      a.type = kRr;
    } else if (f.op == "get") {
      a.type = kGet;
      a.request = get_req;
      a.sink = bufs[slot];
    } else {
      a.type = kPut;
      a.payload = bufs[slot];
    }
    t->Call(a, [&, slot](Reply r) {
      std::unique_lock<std::mutex> lock(mu);
      if (r.status.ok()) ++done; else ++failed;
      if (SteadyClock::now() < end && failed < 100) {
        lock.unlock();
        issue(slot);
        return;
      }
      --in_flight;
      cv.notify_all();
    });
  };
  {
    std::lock_guard<std::mutex> lock(mu);
    in_flight = f.depth;
  }
  for (int i = 0; i < f.depth; ++i) issue(i);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return in_flight == 0; });
  double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  std::printf("op=%s size=%zu depth=%d tls=%s: %llu calls in %.2f s = %.0f calls/s",
              f.op.c_str(), bulk ? f.size : size_t{0}, f.depth, f.tls.c_str(),
              static_cast<unsigned long long>(done), secs, done / secs);
  if (bulk) std::printf(", %.2f GB/s", done * static_cast<double>(f.size) / secs / 1e9);
  std::printf(" (%llu failed)\n", static_cast<unsigned long long>(failed));
}

int Main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, &f)) {
    std::fprintf(stderr,
                 "usage: %s server|client|loopback [--listen H:P] [--peer H:P] "
                 "[--op rr|get|put] [--size N] [--seconds S] [--depth N] [--tls T]\n",
                 argv[0]);
    return 2;
  }
  if (f.mode == "server") {
    auto t = Open(f, f.listen);
    Serve(t.get());
    std::printf("listening on %s\n", t->address().c_str());
    std::fflush(stdout);
    while (true) pause();
  }
  std::unique_ptr<UcxTransport> server;
  if (f.mode == "loopback") {
    server = Open(f, f.listen);
    Serve(server.get());
    f.peer = server->address();
  }
  auto client = Open(f, "127.0.0.1:0");
  RunClient(client.get(), f);
  return 0;
}

}  // namespace
}  // namespace kvpool::transport

int main(int argc, char** argv) { return kvpool::transport::Main(argc, argv); }
