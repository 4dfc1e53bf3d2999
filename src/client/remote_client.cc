#include "client/remote_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "common/thread_annotations.h"
#include "membership/membership.h"
#include "membership/shard_map.h"
#include "peer/peer_messages_format.h"
#include "peer/route_fetch.h"
#include "transport/ucx_transport.h"

namespace kvpool::client {

using transport::CallArgs;
using transport::Deadline;
using transport::Reply;
using transport::SteadyClock;

namespace {

// Calls in flight per batch step: bounds the memory UCX holds for a batch
// of large values.
constexpr size_t kWindow = 64;

int32_t Code(const Status& s) { return static_cast<int32_t>(s.code()); }

// Waits for a known number of asynchronous calls. The transport runs every
// callback by its deadline, so Wait() is bounded by the calls' deadlines;
// it must not return earlier, as callbacks write into the caller's state.
class Countdown {
 public:
  explicit Countdown(size_t n) : left_(n) {}
  void Done() {
    std::lock_guard lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t left_;
};

// The membership as this client last learned it, and the map it implies
// (a client is no member: no `self`). Immutable once built.
struct Routing {
  cluster::Routes routes;
  const MembershipView& view() const { return *routes.view; }
  const ShardMap& map() const { return *routes.map; }
};

// What the homes answered for the keys of one call.
struct Found {
  std::shared_ptr<cluster::LookupBatch> batch;
  std::vector<uint8_t> answered;      // answered[i]: batch->results[i] is the home's answer
  std::shared_ptr<const Routing> routing;  // the view the answers came from
};

}  // namespace

Status RemoteClientOptions::Validate() const {
  if (seeds.empty()) return InvalidArgument("remote_peers lists no address");
  if (timeout.count() <= 0) return InvalidArgument("timeout must be > 0");
  if (refresh_interval.count() <= 0) return InvalidArgument("refresh interval must be > 0");
  return Status::Ok();
}

Result<std::vector<std::string>> ParsePeerList(std::string_view list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view e = list.substr(pos, comma - pos);
    while (!e.empty() && e.front() == ' ') e.remove_prefix(1);
    while (!e.empty() && e.back() == ' ') e.remove_suffix(1);
    pos = comma + 1;
    if (e.empty()) continue;
    size_t colon = e.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == e.size() ||
        e.substr(colon + 1).find_first_not_of("0123456789") != std::string_view::npos) {
      return InvalidArgument(fmt::format("remote_peers entry '{}' is not host:port", e));
    }
    out.emplace_back(e);
  }
  if (out.empty()) return InvalidArgument("remote_peers lists no address");
  return out;
}

struct RemoteClient::Impl {
  RemoteClientOptions opts;
  std::mutex mu;
  std::shared_ptr<const Routing> routing GUARDED_BY(mu);
  SteadyClock::time_point refreshed_at GUARDED_BY(mu){};
  std::atomic<bool> refresh_in_flight{false};
  // Lookups and fetches, without cool-downs or a lookup cache: each call
  // asks the homes afresh and tries every holder.
  std::unique_ptr<cluster::RouteFetcher> fetcher;
  // Declared last: destroyed first, which runs every pending callback while
  // the members above are still alive.
  std::unique_ptr<transport::UcxTransport> transport;

  std::shared_ptr<const Routing> Current() {
    std::lock_guard lock(mu);
    return routing;
  }

  void Install(MembershipView view) {
    auto r = std::make_shared<Routing>();
    r->routes.map = std::make_shared<const ShardMap>(ShardMap::Compute(view));
    r->routes.view = std::make_shared<const MembershipView>(std::move(view));
    std::lock_guard lock(mu);
    refreshed_at = SteadyClock::now();
    // A node that lags behind (older epoch) does not undo a newer view.
    if (!routing || r->view().epoch >= routing->view().epoch) routing = std::move(r);
  }

  std::vector<std::string> Candidates() {
    std::vector<std::string> out = opts.seeds;
    if (auto r = Current()) {
      for (const auto& m : r->view().members) {
        if (std::find(out.begin(), out.end(), m.address) == out.end()) out.push_back(m.address);
      }
    }
    return out;
  }

  // Asks every known node for its view at once; the first answer is
  // installed. wait: block until then (or until all failed) and return the
  // outcome; else return at once.
  Status Refresh(Deadline deadline, bool wait) {
    struct Op {
      std::mutex mu;
      std::condition_variable cv;
      size_t left = 0;
      bool installed = false;
      Status last = Unavailable("no node to ask for the membership");
    };
    auto op = std::make_shared<Op>();
    std::vector<std::string> cands = Candidates();
    op->left = cands.size();
    refresh_in_flight.store(true);
    for (const auto& addr : cands) {
      CallArgs args;
      args.peer = addr;
      args.type = cluster::kPeerMembers;
      args.deadline = deadline;
      transport->Call(args, [this, op, addr](Reply rep) {
        MembershipView view;
        Status s = rep.status;
        if (s.ok()) s = cluster::DecodeMembersReply(rep.payload, &view);
        if (s.ok() && view.members.empty()) s = Unavailable("node reports no members");
        std::lock_guard lock(op->mu);
        if (s.ok() && !op->installed) {
          Install(std::move(view));
          op->installed = true;
        } else if (!s.ok()) {
          op->last = Status(s.code(), fmt::format("{}: {}", addr, s.message()));
        }
        if (--op->left == 0) refresh_in_flight.store(false);
        op->cv.notify_all();
      });
    }
    if (!wait) return Status::Ok();
    std::unique_lock lock(op->mu);
    op->cv.wait(lock, [&] { return op->installed || op->left == 0; });
    if (op->installed) return Status::Ok();
    std::string text =
        fmt::format("no node answered the membership request (last: {})", op->last.ToString());
    // Nodes that refused this client's credentials will refuse them again.
    return op->last.code() == StatusCode::kPermissionDenied ? PermissionDenied(text)
                                                            : Unavailable(text);
  }

  // The routing for a call, starting a background refresh when it is due.
  std::shared_ptr<const Routing> ForCall(Deadline deadline) {
    bool due;
    std::shared_ptr<const Routing> r;
    {
      std::lock_guard lock(mu);
      r = routing;
      due = SteadyClock::now() - refreshed_at > opts.refresh_interval;
    }
    if (due && !refresh_in_flight.exchange(true)) (void)Refresh(deadline, /*wait=*/false);
    return r;
  }

  // After a node did not answer: a fresh view (waiting for it), or null.
  std::shared_ptr<const Routing> RefreshNow(Deadline deadline) {
    if (SteadyClock::now() >= deadline) return nullptr;
    if (!Refresh(deadline, /*wait=*/true).ok()) return nullptr;
    return Current();
  }

  // Lookup of batch->keys[idx] at their homes (batched per home), waiting
  // for every answer. Sets answered[i] for items whose home answered;
  // returns the last failure of a home (Ok when all answered).
  Status LookupAll(const Routing& r, const std::shared_ptr<cluster::LookupBatch>& batch,
                   const std::vector<size_t>& idx, Deadline deadline,
                   std::vector<uint8_t>* answered) {
    std::mutex wait_mu;
    std::condition_variable cv;
    size_t left = idx.size();
    Status last = Status::Ok();
    fetcher->Lookup(r.routes, batch, idx, deadline, nullptr,
                    [&](std::vector<size_t> part, const Status& s,
                        cluster::RouteFetcher::ResolvedOn) {
                      std::lock_guard lock(wait_mu);
                      if (s.ok()) {
                        for (size_t i : part) (*answered)[i] = 1;
                      } else {
                        last = s;
                      }
                      left -= part.size();
                      if (left == 0) cv.notify_all();
                    });
    std::unique_lock lock(wait_mu);
    cv.wait(lock, [&] { return left == 0; });
    return last;
  }

  // Lookup with one retry on a fresh view for the homes that did not answer.
  // Returns the failure when no item was answered.
  Status Lookups(std::span<const KeyId> keys, Deadline deadline, Found* found) {
    auto r = ForCall(deadline);
    auto* batch = &found->batch;
    auto* answered = &found->answered;
    *batch = std::make_shared<cluster::LookupBatch>(
        std::vector<KeyId>(keys.begin(), keys.end()));
    answered->assign(keys.size(), 0);
    std::vector<size_t> idx(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) idx[i] = i;
    Status s = LookupAll(*r, *batch, idx, deadline, answered);
    if (!s.ok()) {
      if (auto fresh = RefreshNow(deadline)) {
        r = fresh;
        idx.clear();
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!(*answered)[i]) idx.push_back(i);
        }
        s = LookupAll(*r, *batch, idx, deadline, answered);
      }
    }
    found->routing = r;
    if (!s.ok() && !keys.empty() &&
        std::none_of(answered->begin(), answered->end(), [](uint8_t a) { return a != 0; })) {
      return s;
    }
    return Status::Ok();
  }
};

RemoteClient::RemoteClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteClient::~RemoteClient() = default;

Result<std::unique_ptr<RemoteClient>> RemoteClient::Open(const RemoteClientOptions& options) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  transport::UcxTransportOptions topts;
  // Client only: nodes answer over the connection this client opens, so it
  // has no peer port for anyone to call.
  topts.listen = false;
  // Connections to the nodes stay open while idle (a reconnect would add a
  // handshake to an engine's next request); past 64 nodes the least
  // recently used idle one closes to make room.
  topts.max_endpoints = 64;
  topts.idle_close = std::chrono::milliseconds(0);
  if (!options.token_file.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(std::vector<transport::ClusterKey> tokens,
                            transport::LoadClientTokenFile(options.token_file));
    topts.cluster_keys = {tokens.front()};
    topts.identity = "client:" + tokens.front().principal;
  }
  KVPOOL_ASSIGN_OR_RETURN(impl->transport, transport::UcxTransport::Open(topts));
  cluster::RouteFetcherOptions fo;
  fo.cooldown = std::chrono::milliseconds(0);
  fo.lookup_cache_ttl = std::chrono::milliseconds(0);
  impl->fetcher = std::make_unique<cluster::RouteFetcher>(fo, impl->transport.get(), nullptr);
  KVPOOL_RETURN_IF_ERROR(impl->Refresh(SteadyClock::now() + options.timeout, /*wait=*/true));
  return std::unique_ptr<RemoteClient>(new RemoteClient(std::move(impl)));
}

Status RemoteClient::Put(std::span<const KeyId> keys, const void* const* values,
                         const uint64_t* sizes, int32_t* statuses) {
  Impl& im = *impl_;
  Deadline deadline = SteadyClock::now() + im.opts.timeout;
  auto r = im.ForCall(deadline);
  std::vector<size_t> todo;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (sizes[i] == 0 || sizes[i] > kMaxValueBytes) {
      statuses[i] = Code(InvalidArgument(""));
    } else {
      todo.push_back(i);
    }
  }
  Status last = Status::Ok();
  bool reached = false;
  for (int attempt = 0; attempt < 2 && !todo.empty(); ++attempt) {
    std::mutex err_mu;
    for (size_t off = 0; off < todo.size(); off += kWindow) {
      size_t m = std::min(kWindow, todo.size() - off);
      std::vector<std::vector<uint8_t>> headers(m);
      Countdown cd(m);
      for (size_t k = 0; k < m; ++k) {
        size_t i = todo[off + k];
        const Member* home = r->map().HomeOf(keys[i]);
        if (home == nullptr) {
          statuses[i] = Code(Unavailable(""));
          cd.Done();
          continue;
        }
        cluster::EncodeStore(keys[i], sizes[i], nullptr, 0, &headers[k]);
        CallArgs args;
        args.peer = home->address;
        args.type = cluster::kPeerStore;
        args.request = headers[k];
        args.payload = {static_cast<const uint8_t*>(values[i]), sizes[i]};
        args.deadline = deadline;
        im.transport->Call(args, [&, i, addr = home->address](Reply rep) {
          statuses[i] = Code(rep.status);
          {
            std::lock_guard lock(err_mu);
            if (rep.status.ok()) {
              reached = true;
            } else {
              if (rep.status.code() != StatusCode::kUnavailable) reached = true;
              last = Status(rep.status.code(),
                            fmt::format("store at {}: {}", addr, rep.status.message()));
            }
          }
          cd.Done();
        });
      }
      cd.Wait();
    }
    std::vector<size_t> retry;
    for (size_t i : todo) {
      if (statuses[i] == Code(Unavailable(""))) retry.push_back(i);
    }
    if (retry.empty() || attempt == 1) break;
    r = im.RefreshNow(deadline);
    if (r == nullptr) break;
    todo = std::move(retry);
  }
  if (!reached && !keys.empty() && !last.ok()) return last;
  return Status::Ok();
}

Status RemoteClient::Get(std::span<const KeyId> keys, void* const* buffers,
                         const uint64_t* capacities, uint64_t* sizes, int32_t* statuses) {
  Impl& im = *impl_;
  Deadline deadline = SteadyClock::now() + im.opts.timeout;
  Found f;
  KVPOOL_RETURN_IF_ERROR(im.Lookups(keys, deadline, &f));
  // Candidate holders per key, in the home's order. A key the home has no
  // record of is still tried at the home itself: a value just stored there
  // is published to the home's own directory only on its next flush (5 ms),
  // and a get right after a put must see it.
  std::vector<std::vector<std::string>> cands(keys.size());
  std::vector<size_t> pending;
  for (size_t i = 0; i < keys.size(); ++i) {
    sizes[i] = 0;
    statuses[i] = Code(NotFound(""));
    if (!f.answered[i]) continue;
    const cluster::LookupResult& lr = f.batch->results[i];
    if (lr.size > 0 && lr.size > capacities[i]) {
      sizes[i] = lr.size;
      statuses[i] = Code(ResourceExhausted(""));
      continue;
    }
    cands[i] = im.fetcher->Candidates(f.routing->routes, lr);
    if (lr.size == 0) {
      if (const Member* home = f.routing->map().HomeOf(keys[i])) cands[i].push_back(home->address);
    }
    if (!cands[i].empty() && capacities[i] > 0) pending.push_back(i);
  }
  // Each pending key is fetched from its candidates in turn, kWindow keys
  // at a time.
  for (size_t off = 0; off < pending.size(); off += kWindow) {
    size_t m = std::min(kWindow, pending.size() - off);
    Countdown cd(m);
    for (size_t k = 0; k < m; ++k) {
      size_t i = pending[off + k];
      cluster::FetchRequest req;
      req.key = keys[i];
      req.peers = std::move(cands[i]);
      req.sink = {static_cast<uint8_t*>(buffers[i]), capacities[i]};
      req.deadline = deadline;
      im.fetcher->Fetch(std::move(req), nullptr, [&, i](const Status& s, uint64_t size) {
        if (s.ok()) {
          sizes[i] = size;
          statuses[i] = Code(s);
        } else if (s.code() == StatusCode::kResourceExhausted) {
          sizes[i] = f.batch->results[i].size;
          statuses[i] = Code(s);
        } else if (s.code() == StatusCode::kDeadlineExceeded) {
          statuses[i] = Code(s);
        }
        cd.Done();
      });
    }
    cd.Wait();
  }
  return Status::Ok();
}

Status RemoteClient::Exists(std::span<const KeyId> keys, uint8_t* hits) {
  Impl& im = *impl_;
  Deadline deadline = SteadyClock::now() + im.opts.timeout;
  Found f;
  KVPOOL_RETURN_IF_ERROR(im.Lookups(keys, deadline, &f));
  for (size_t i = 0; i < keys.size(); ++i) {
    const cluster::LookupResult& lr = f.batch->results[i];
    hits[i] = f.answered[i] && lr.size > 0 && !lr.holders.empty() ? 1 : 0;
  }
  return Status::Ok();
}

}  // namespace kvpool::client
