// Internal to the UCX transport: the state shared by the public wrapper and
// the progress thread. Not a public header.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transport/bootstrap_format.h"
#include "transport/peer_format.h"
#include "transport/peer_seal.h"
#include "transport/ucx_transport.h"

namespace kvpool::transport {

// Helpers shared by the UCX transport files.
Status FromUcs(ucs_status_t s, std::string_view what);
Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port);
socklen_t AddrLen(const sockaddr_storage& ss);
bool SplitAddress(const std::string& a, std::string* host, uint16_t* port);
std::string FormatAddr(const sockaddr_storage& ss);
// The UCX_NET_DEVICES value for these options (see net_devices); empty keeps
// UCX's choice.
Result<std::string> NetDevices(const UcxTransportOptions& o);

// Buffers for encrypted payloads, reused so that a stream of large messages
// does not fault in fresh pages for each one. Capacities are powers of two
// from 4 KiB; at most kKeepBytes are kept. Progress thread only.
class SealBuffers {
 public:
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t capacity = 0;
  };
  static constexpr size_t kKeepBytes = size_t{64} << 20;
  Buffer Take(size_t bytes) {
    size_t cap = 4096;
    while (cap < bytes) cap <<= 1;
    auto& list = free_[cap];
    if (!list.empty()) {
      Buffer b = std::move(list.back());
      list.pop_back();
      kept_ -= cap;
      return b;
    }
    return Buffer{std::unique_ptr<uint8_t[]>(new uint8_t[cap]), cap};  // not zeroed
  }
  void Give(Buffer b) {
    if (b.data == nullptr || kept_ + b.capacity > kKeepBytes) return;
    kept_ += b.capacity;
    free_[b.capacity].push_back(std::move(b));
  }

 private:
  std::unordered_map<size_t, std::vector<Buffer>> free_;
  size_t kept_ = 0;
};

// Everything below marked "progress thread" is touched by that thread only,
// which is why it needs no lock.
struct UcxTransport::Core : std::enable_shared_from_this<UcxTransport::Core> {
  // One peer connection and its bootstrap TCP socket (kept open, silent, for
  // the connection's life). A client endpoint owns the UCX endpoint it
  // created to the listener's worker (from the welcome) and sends requests
  // on it. A server endpoint creates nothing from what a connector sent: it
  // answers on the reply endpoint UCX hands over with the connection's
  // requests (reply_ep), which UCX owns and may destroy once that
  // connection fails, so it is used only while the bootstrap socket is open
  // (see SendReply).
  struct Endpoint {
    Core* core;
    uint64_t id;
    ucp_ep_h ep = nullptr;        // client: owned
    ucp_ep_h reply_ep = nullptr;  // server: UCX's, not owned
    std::string peer;
    bool client = false;
    bool failed = false;
    std::unordered_set<uint64_t> calls;
    SteadyClock::time_point last_used{};  // client: a call started or settled
    SteadyClock::time_point last_reply{};  // client: a reply arrived
    // client: no new call goes on it (a call passed its deadline with nothing
    // received since it was sent); it closes once its calls are settled.
    bool retired = false;
    SteadyClock::time_point last_request{};  // server: a request arrived or was answered
    uint32_t in_service = 0;                 // server: requests dispatched, not yet answered
    int fd = -1;
    uint32_t token = 0;
    bool ready = false;                // client: welcome received, ep created
    Deadline bootstrap_deadline{};     // client: until ready
    std::vector<uint8_t> in;           // client: the welcome as it arrives
    std::vector<uint8_t> out;          // bytes still to write on fd
    std::vector<std::function<void()>> waiting;  // client: sends held until ready
    std::unique_ptr<AuthConnector> auth;  // client with cluster keys
    bool challenged = false;              // client: the challenge was answered
    std::string principal;                // server: a client token's name (empty: a member)
    std::unique_ptr<PeerSeal> seal;       // encrypted connections
  };
  // An accepted connection that has not finished its hello.
  struct Pending {
    Deadline deadline;
    std::string peer;
    std::vector<uint8_t> in;
    std::unique_ptr<AuthListener> auth;  // set once a hello was challenged
  };
  struct CallState {
    ReplyCallback done;
    uint64_t ep_id = 0;
    std::span<uint8_t> sink;
    SteadyClock::time_point start;
    int refs = 0;           // UCX operations still using the caller's payload or sink
    bool answered = false;  // the peer replied (whatever its status)
    Reply partial;          // a reply whose payload is still landing
    std::optional<Reply> verdict;
  };
  struct SendOp {
    Core* core;
    std::vector<uint8_t> am_header;  // must live until the send completes
    uint64_t call_id = 0;
    bool holds_ref = false;
    std::function<void()> release;
    size_t bytes = 0;
    SealBuffers::Buffer sealed;  // an encrypted payload, until sent
  };
  struct RecvOp {
    Core* core;
    bool is_request = false;
    uint64_t call_id = 0;  // replies
    uint64_t ep_id = 0;    // requests
    Frame frame;
    std::vector<uint8_t> header;
    std::vector<uint8_t> payload;  // requests
    std::vector<uint8_t> sealed;   // encrypted: the AM header as received
  };

  explicit Core(const UcxTransportOptions& o) : opts(o), limits(o.limits) {
    if (opts.metrics == nullptr) own_metrics = std::make_unique<MetricsRegistry>();
    metrics = opts.metrics ? opts.metrics : own_metrics.get();
    const std::string calls_help = "Peer calls finished, by result";
    calls_ok = metrics->GetCounter("kvpool_transport_calls_total", calls_help, {{"result", "ok"}});
    calls_timeout =
        metrics->GetCounter("kvpool_transport_calls_total", calls_help, {{"result", "timeout"}});
    calls_unavailable = metrics->GetCounter("kvpool_transport_calls_total", calls_help,
                                            {{"result", "unavailable"}});
    calls_error =
        metrics->GetCounter("kvpool_transport_calls_total", calls_help, {{"result", "error"}});
    bytes_sent = metrics->GetCounter("kvpool_transport_bytes_sent_total",
                                     "Peer message bytes sent (headers and payloads)");
    bytes_received = metrics->GetCounter("kvpool_transport_bytes_received_total",
                                         "Peer message bytes received (headers and payloads)");
    endpoints_gauge = metrics->GetGauge("kvpool_transport_endpoints", "Open UCX endpoints");
    latency = metrics->GetHistogram("kvpool_transport_call_seconds", "Peer call latency");
    bootstrapping_gauge = metrics->GetGauge("kvpool_transport_bootstrapping",
                                            "Accepted peer-port connections in their bootstrap");
    idle_closed = metrics->GetCounter(
        "kvpool_transport_idle_closed_total",
        "Outgoing peer connections closed with no call in flight: idle for --peer-idle-close, "
        "or the least recently used one at --peer-max-connections");
    silent_closed = metrics->GetCounter(
        "kvpool_transport_silent_closed_total",
        "Outgoing peer connections closed because a call on them passed its deadline with "
        "nothing received since it was sent (new calls went on a new connection meanwhile)");
    const std::string auth_help = "Peer connections that passed cluster authentication, by side";
    authenticated_listener = metrics->GetCounter("kvpool_transport_authenticated_total", auth_help,
                                                 {{"side", "listener"}});
    authenticated_connector = metrics->GetCounter("kvpool_transport_authenticated_total",
                                                  auth_help, {{"side", "connector"}});
    const std::string enc_help = "Peer connections that encrypt their messages, by side";
    encrypted_listener = metrics->GetCounter("kvpool_transport_encrypted_connections_total",
                                             enc_help, {{"side", "listener"}});
    encrypted_connector = metrics->GetCounter("kvpool_transport_encrypted_connections_total",
                                              enc_help, {{"side", "connector"}});
  }

  // ---- Any thread --------------------------------------------------------
  bool Submit(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(sub_mu);
      if (!accepting) return false;
      submissions.push_back(std::move(fn));
      // Only the first submission of a batch wakes the thread: it drains the
      // whole queue, and it checks the queue under sub_mu before sleeping.
      if (submissions.size() > 1) return true;
    }
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof(one));
    (void)n;  // a full eventfd counter already means "wake up"
    return true;
  }
  void CountRefused(const char* reason) {
    metrics->GetCounter("kvpool_transport_bootstrap_refused_total",
                        "Connections to the peer port closed before or during their bootstrap",
                        {{"reason", reason}})
        ->Inc();
  }
  void CountError(const char* reason) {
    metrics->GetCounter("kvpool_transport_errors_total", "Malformed or rejected peer messages",
                        {{"reason", reason}})
        ->Inc();
  }

  void Stop() {
    KVPOOL_CHECK(std::this_thread::get_id() != thread.get_id());
    {
      std::lock_guard<std::mutex> lock(sub_mu);
      if (!accepting) return;
      submissions.push_back([this] { stopping = true; });
      accepting = false;
    }
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof(one));
    (void)n;
    thread.join();
  }

  // Resolves "host:port", with a cache. Runs on the calling thread.
  Result<sockaddr_storage> Lookup(const std::string& peer);

  // ---- Progress thread ---------------------------------------------------
  Status Init();
  void Loop();
  void Shutdown();
  void RunSubmissions();
  void RunDeferred();
  void SubmitHandlers();
  void FireTimers();
  void CloseFailedEndpoints();
  void CloseLingering(bool all);
  void ReapClosing();
  int NextTimeoutMs() const;

  // ---- Progress thread: the peer port and bootstrap sockets (ucx_bootstrap.cc)
  Status Listen();
  void PollSockets();
  void Accept();
  void OnPendingReadable(int fd);
  void Welcome(int fd, Pending p);
  bool SocketOpen(int fd) const;
  void Refuse(int fd, const char* reason, std::string_view message);
  void ClosePending(int fd);
  void OnEndpointSocket(uint64_t ep_id, uint32_t events);
  bool FlushOut(Endpoint* e);
  void ExpireBootstraps();
  // Closes the outgoing connections idle for opts.idle_close, at most a few
  // times per idle_close.
  void CloseIdleEndpoints();
  // Closes the least recently used idle outgoing connection; false: none.
  bool CloseLeastRecentIdle();
  // Connections open, those being closed left out.
  size_t OpenEndpoints() const { return endpoints.size() - to_close.size(); }
  static bool Idle(const Endpoint& e) {
    return e.client && e.ready && !e.failed && e.calls.empty() && e.waiting.empty();
  }
  // When each idle client endpoint was last used, either way: UCX may pair
  // a node's endpoint to a peer with the peer's endpoint to it, so the
  // peer's requests arrive (and are answered) on this node's endpoint; a
  // request on a connection whose replies go out on e.ep uses e too, and
  // while one is being served e is not idle (left out).
  std::vector<std::pair<uint64_t, SteadyClock::time_point>> LastUseOfIdleClients() const;
  std::chrono::milliseconds IdleSweepEvery() const {
    return std::clamp(opts.idle_close / 4, std::chrono::milliseconds(10),
                      std::chrono::milliseconds(1000));
  }
  Result<ucp_ep_h> CreateUcpEndpoint(Endpoint* e, std::span<const uint8_t> worker_address);
  Status WatchFd(int fd, uint32_t events);
  // Refuses a connection in its bootstrap for its credentials (logged at
  // most once a second, with how many were not logged).
  void RefuseAuth(int fd, const std::string& peer, const char* reason, std::string_view why);
  void OnHello(int fd, Pending* p, BootstrapMessage m);
  uint32_t NewToken();

  void StartCall(uint64_t id, std::string peer, Result<sockaddr_storage> addr,
                 std::vector<uint8_t> am_header, std::span<const uint8_t> payload,
                 std::span<uint8_t> sink, Deadline deadline, ReplyCallback done);
  Result<uint64_t> ClientEndpoint(const std::string& peer, const sockaddr_storage& addr);
  void SendRequest(uint64_t id, uint64_t ep_id, std::vector<uint8_t> am_header,
                   std::span<const uint8_t> payload);
  Endpoint* NewEndpoint(std::string peer, bool client);
  void SendReply(uint64_t ep_id, uint64_t request_id, MessageType type, Deadline deadline,
                 ServerReply r);
  void Settle(uint64_t id, Reply verdict);
  void MaybeFinish(uint64_t id);
  void FailEndpoint(uint64_t ep_id, const Status& why);
  // A call on client endpoint e passed its deadline unanswered, sent at
  // `sent`. If nothing was received on e since, the connection is taken as
  // stuck (a link that dropped packets leaves TCP retransmitting on a backed-
  // off timer long after it heals): new calls get a fresh connection, and e
  // closes once the calls already on it are settled.
  void RetireIfSilent(Endpoint* e, SteadyClock::time_point sent);
  // Something arrived on retired endpoint e (a reply, or the welcome of its
  // bootstrap): unless another connection to its peer replaced it
  // meanwhile, it takes new calls again.
  void Revive(Endpoint* e);
  // Closes retired endpoint e, whose last call was settled.
  void CloseRetired(Endpoint* e);
  void Dispatch(uint64_t ep_id, Frame frame, std::vector<uint8_t> header,
                std::vector<uint8_t> payload);
  void SendDone(SendOp* op, ucs_status_t status);
  void RecvDone(RecvOp* op, ucs_status_t status);
  ucs_status_t OnRequest(const void* header, size_t header_len, void* data, size_t len,
                         const ucp_am_recv_param_t* param);
  // A received frame checked against the limits and for the expected kind;
  // *reason names what was wrong (a metric label).
  Status DecodeIncoming(const void* header, size_t header_len, size_t len, FrameKind want,
                        Frame* f, std::span<const uint8_t>* hdr, const char** reason) const;
  // The header size check of a decoded frame on endpoint e (an encrypted
  // one carries the seal's trailer as well) and, when encrypted, the seal's
  // first check; *reason names what failed.
  bool CheckIncoming(const Endpoint& e, std::span<const uint8_t> hdr, const char** reason) const;
  // Seals an outgoing message on an encrypted endpoint: the header in place,
  // the payload into *sealed (which *payload then views).
  Status SealOutgoing(Endpoint* e, std::vector<uint8_t>* am_header,
                      std::span<const uint8_t>* payload, SealBuffers::Buffer* sealed);
  ucs_status_t OnReply(const void* header, size_t header_len, void* data, size_t len,
                       const ucp_am_recv_param_t* param);

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* e = static_cast<Endpoint*>(arg);
    e->core->FailEndpoint(e->id, FromUcs(status, "peer connection failed"));
  }
  static ucs_status_t OnRequestAm(void* arg, const void* h, size_t hl, void* d, size_t l,
                                  const ucp_am_recv_param_t* p) {
    return static_cast<Core*>(arg)->OnRequest(h, hl, d, l, p);
  }
  static ucs_status_t OnReplyAm(void* arg, const void* h, size_t hl, void* d, size_t l,
                                const ucp_am_recv_param_t* p) {
    return static_cast<Core*>(arg)->OnReply(h, hl, d, l, p);
  }
  static void OnSend(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    op->core->live_sends.erase(op);
    ucp_request_free(request);
    op->core->SendDone(op, status);
  }
  static void OnRecv(void* request, ucs_status_t status, size_t length, void* user_data) {
    auto* op = static_cast<RecvOp*>(user_data);
    op->core->live_recvs.erase(op);
    ucp_request_free(request);
    op->core->RecvDone(op, status);
  }

  const UcxTransportOptions opts;
  TransportLimits limits;  // written by Init before Open returns, then read-only
  std::unique_ptr<MetricsRegistry> own_metrics;
  MetricsRegistry* metrics;
  Counter *calls_ok, *calls_timeout, *calls_unavailable, *calls_error;
  Counter *bytes_sent, *bytes_received;
  Gauge* endpoints_gauge;
  Gauge* bootstrapping_gauge;
  Counter* idle_closed;
  Counter* silent_closed;
  Counter *authenticated_listener, *authenticated_connector;
  Counter *encrypted_listener, *encrypted_connector;
  Histogram* latency;

  std::mutex handlers_mu;
  std::unordered_map<MessageType, Handler> handlers;  // protected by handlers_mu

  std::mutex sub_mu;
  std::vector<std::function<void()>> submissions;  // protected by sub_mu
  bool accepting = true;                           // protected by sub_mu

  std::mutex addr_mu;
  std::unordered_map<std::string, sockaddr_storage> addr_cache;  // protected by addr_mu

  std::atomic<uint64_t> next_request_id{1};
  int wake_fd = -1;
  std::thread thread;
  std::string address;  // set by Init
  uint16_t port = 0;    // set by Init

  // Progress thread only.
  int epoll_fd = -1;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_mem_h mem = nullptr;
  int listen_fd = -1;
  int sock_epoll_fd = -1;  // the bootstrap sockets; itself watched by epoll_fd
  SteadyClock::time_point last_sock_poll{};
  std::vector<uint8_t> worker_address;  // what a welcome carries
  std::unordered_map<int, Pending> pending;        // accepted fd -> its bootstrap
  std::unordered_map<int, uint64_t> ep_by_fd;      // endpoint sockets
  std::unordered_map<uint32_t, uint64_t> ep_by_token;  // server endpoints
  std::unordered_set<uint64_t> bootstrapping;      // client endpoints not ready yet
  uint64_t rng_state = 0;
  std::string identity = opts.identity;  // SetIdentity submits changes
  // What a listener accepts in a hello: the cluster keys, then the client tokens.
  const std::vector<ClusterKey> accepted_keys = [this] {
    std::vector<ClusterKey> all = opts.cluster_keys;
    all.insert(all.end(), opts.client_tokens.begin(), opts.client_tokens.end());
    return all;
  }();
  SteadyClock::time_point auth_log_at{};  // last refusal logged
  uint64_t auth_unlogged = 0;            // refusals since, not logged
  bool stopping = false;
  uint64_t next_ep_id = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Endpoint>> endpoints;
  std::unordered_map<std::string, uint64_t> client_eps;
  std::vector<uint64_t> to_close;
  SteadyClock::time_point next_idle_sweep{};
  std::vector<std::pair<void*, std::unique_ptr<Endpoint>>> closing;
  // Client endpoints whose UCX endpoint closes at the time given (see
  // CloseFailedEndpoints).
  std::vector<std::pair<SteadyClock::time_point, std::unique_ptr<Endpoint>>> lingering;
  static constexpr std::chrono::milliseconds kCloseLinger{20};
  std::unordered_map<uint64_t, CallState> calls;
  std::set<std::pair<Deadline, uint64_t>> timers;
  std::vector<std::function<void()>> deferred;  // user code, run outside ucp_worker_progress
  // Requests for the handler executor, submitted together after each pass
  // (opts.max_handler_batch per task).
  std::vector<std::function<void()>> to_handle;
  std::unordered_set<SendOp*> live_sends;
  std::unordered_set<RecvOp*> live_recvs;
  SealBuffers seal_buffers;
};

}  // namespace kvpool::transport
