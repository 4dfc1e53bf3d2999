#include "cluster/scale_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/holdings_announcer.h"
#include "cluster/peer_server.h"
#include "cluster/remote_reader.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "peer/peer_messages_format.h"
#include "store/tiered_store.h"
#include "transport/in_process_transport.h"

namespace kvpool::cluster {
namespace {

using std::chrono::milliseconds;

std::string SimNodeId(size_t i) { return fmt::format("n{:04d}", i); }

// Wall times per message type of the real handlers (at receivers) and
// sends (at senders), the first kMaxSamples of each. The latency model's
// CPU costs are the handlers' medians and the sends' tenth percentiles: a
// send here also waits for the in-process network's one delivery thread
// (its lock, its wake-up), which a real sender does not.
class SimCosts {
 public:
  static constexpr size_t kMaxSamples = 1u << 16;
  void Add(bool handler, uint16_t type, double us) {
    std::lock_guard lock(mu_);
    auto& v = (handler ? handlers_ : sends_)[type];
    if (v.size() < kMaxSamples) v.push_back(us);
  }
  SimCostTable Medians() const {
    std::lock_guard lock(mu_);
    SimCostTable t;
    auto quantile = [](std::vector<double> v, double q) {
      const auto at = static_cast<ptrdiff_t>(q * static_cast<double>(v.size() - 1));
      std::nth_element(v.begin(), v.begin() + at, v.end());
      return v[static_cast<size_t>(at)];
    };
    for (const auto& [type, samples] : handlers_) t.handler_us[type] = quantile(samples, 0.5);
    for (const auto& [type, samples] : sends_) t.send_us[type] = quantile(samples, 0.1);
    return t;
  }

 private:
  mutable std::mutex mu_;
  std::map<uint16_t, std::vector<double>> handlers_, sends_;  // protected by mu_
};

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

class CountingTransport;
// The call whose reply callback this thread is running, if any: a call
// sent from there was caused by that reply.
struct ReplyContext {
  const CountingTransport* transport = nullptr;
  uint64_t window = 0;
  int call = -1;
};
thread_local ReplyContext tl_reply;

// The calls a node sends: per message type, their peers and bytes, and the
// graph of which reply each was sent from. A window (BeginWindow .. Take)
// is one request's.
class CountingTransport final : public transport::Transport {
 public:
  CountingTransport(std::unique_ptr<transport::Transport> inner, uint32_t self,
                    const std::map<std::string, uint32_t>* index, SimCosts* costs)
      : inner_(std::move(inner)), self_(self), index_(index), costs_(costs) {}
  std::string address() const override { return inner_->address(); }
  void RegisterHandler(transport::MessageType type, transport::Handler h) override {
    inner_->RegisterHandler(
        type, [this, type, h = std::move(h)](transport::Incoming in, transport::Responder r) {
          if (down_.load()) return r.Respond(Unavailable("crashed"));
          const auto t0 = std::chrono::steady_clock::now();
          h(std::move(in), std::move(r));
          costs_->Add(true, type, MicrosSince(t0));
        });
  }
  void Call(const transport::CallArgs& args, transport::ReplyCallback done) override {
    if (down_.load()) return done(transport::Reply{Unavailable("crashed"), {}, 0, {}});
    int idx = -1;
    uint64_t window = 0;
    {
      std::lock_guard lock(mu_);
      ++window_.messages;
      window_.bytes += args.request.size() + args.payload.size();
      if (args.type == kPeerLookup) ++window_.lookups;
      if (args.type == kPeerHolderLookup) ++window_.holder_lookups;
      if (args.type == kPeerFetch) ++window_.fetches;
      if (args.type == kPeerPublish) ++window_.publishes;
      if (args.type == kPeerStore) ++window_.stores;
      if (args.type == kPeerLookup || args.type == kPeerHolderLookup || args.type == kPeerPublish) {
        homes_.insert(args.peer);
      }
      peers_.insert(args.peer);
      SimCall c;
      const ReplyContext& ctx = tl_reply;
      c.parent = ctx.transport == this && ctx.window == generation_ ? ctx.call : -1;
      c.from = self_;
      auto to = index_->find(args.peer);
      c.to = to == index_->end() ? self_ : to->second;
      c.type = args.type;
      c.request_bytes = args.request.size() + args.payload.size();
      idx = static_cast<int>(window_.calls.size());
      window_.calls.push_back(c);
      window = generation_;
    }
    const auto t0 = std::chrono::steady_clock::now();
    inner_->Call(args, [this, idx, window, done = std::move(done)](transport::Reply r) {
      {
        std::lock_guard lock(mu_);
        if (window == generation_) {
          window_.calls[static_cast<size_t>(idx)].reply_bytes = r.header.size() + r.payload_bytes;
        }
      }
      const ReplyContext before = tl_reply;
      tl_reply = {this, window, idx};
      done(std::move(r));
      tl_reply = before;
    });
    costs_->Add(false, args.type, MicrosSince(t0));
  }
  void Stop() override { inner_->Stop(); }

  // A crash: from now on it neither sends nor answers.
  void Crash() { down_.store(true); }

  void BeginWindow() {
    std::lock_guard lock(mu_);
    window_ = {};
    homes_.clear();
    ++generation_;
  }
  RequestCost Take() {
    std::lock_guard lock(mu_);
    RequestCost c = window_;
    c.homes = homes_.size();
    return c;
  }
  uint64_t peers() {
    std::lock_guard lock(mu_);
    return peers_.size();
  }

 private:
  std::unique_ptr<transport::Transport> inner_;
  const uint32_t self_;
  const std::map<std::string, uint32_t>* const index_;  // address -> node index
  SimCosts* const costs_;
  std::atomic<bool> down_{false};
  std::mutex mu_;
  RequestCost window_;           // protected by mu_
  uint64_t generation_ = 0;      // the window's; protected by mu_
  std::set<std::string> homes_;  // this window's; protected by mu_
  std::set<std::string> peers_;  // ever called; protected by mu_
};

// A membership whose views the simulation sets: every node starts with the
// same view, and a join or a leave publishes the next one to each node.
class SimMembership final : public Membership {
 public:
  SimMembership(const std::string& node_id, std::vector<Member> members, uint64_t epoch,
                MetricsRegistry* metrics)
      : Membership(node_id, metrics) {
    Publish(std::move(members), epoch);
  }
  void Set(std::vector<Member> members, uint64_t epoch) { Publish(std::move(members), epoch); }
};

// A uniform draw in (0, 1) from (seed, a, b).
double Uniform(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t x = seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (static_cast<double>(x >> 11) + 0.5) / static_cast<double>(1ull << 53);
}

// The bytes of key's value at offset j: checkable without keeping them.
uint8_t ValueByte(const KeyId& key, uint64_t j) {
  return static_cast<uint8_t>((key.hi >> ((j % 8) * 8)) ^ (key.lo >> ((j % 7) * 8)) ^ j);
}

}  // namespace

struct ScaleSimNode {
  MetricsRegistry metrics;  // outlives everything below
  std::unique_ptr<TieredStore> tiered;
  CountingTransport* counter = nullptr;  // owned by cluster
  SimMembership* membership = nullptr;   // owned by cluster
  bool up = true;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<Directory> directory;
  std::unique_ptr<HoldingsAnnouncer> announcer;
  std::unique_ptr<PeerServer> server;
  std::unique_ptr<RemoteReader> reader;
  std::unique_ptr<RemoteReader> chain_reader;    // chain reads on
  std::unique_ptr<RemoteReader> keeping_reader;  // chain reads on, keeping what it fetched
};

struct ScaleSim::Impl {
  ScaleSimOptions opts;
  transport::InProcessNetwork net;  // outlives the nodes' transports
  std::unique_ptr<ThreadPool> pool;
  std::vector<std::unique_ptr<ScaleSimNode>> nodes;
  std::vector<std::string> ids;
  std::map<std::string, uint32_t> index;  // address -> node
  SimCosts costs;
  std::vector<Member> members;  // the current view's
  uint64_t epoch = 1;
  // Every key Put stored, and the node holding it.
  std::vector<std::pair<KeyId, uint32_t>> held;

  // Adds node i (named ids[i]) with the current view.
  Status AddNode(size_t i);

  ~Impl() {
    for (auto& n : nodes) {
      n->announcer->Stop();
      n->reader->Stop();
      n->chain_reader->Stop();
      n->keeping_reader->Stop();
    }
    if (pool) pool->Stop();
    for (auto& n : nodes) {
      n->cluster.reset();
      n->server.reset();
      n->reader.reset();
      n->chain_reader.reset();
      n->keeping_reader.reset();
      n->announcer.reset();
      n->directory.reset();
    }
    nodes.clear();
  }
};

ScaleSim::ScaleSim(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ScaleSim::~ScaleSim() = default;

Status ScaleSim::Impl::AddNode(size_t i) {
  auto n = std::make_unique<ScaleSimNode>();
  DramOptions d;
  d.capacity_bytes = opts.dram_bytes;
  d.slab_bytes = 1u << 20;
  d.max_value_bytes = 1u << 20;
  d.huge_pages = false;
  d.prefault = false;
  d.eviction = "lru";
  KVPOOL_ASSIGN_OR_RETURN(n->tiered, TieredStore::Open(d, nullptr, pool.get(), pool.get(),
                                                       TieringOptions{}, &n->metrics));
  // Incarnation 0 throughout: views change only when the simulation says.
  auto membership = std::make_unique<SimMembership>(ids[i], members, epoch, &n->metrics);
  n->membership = membership.get();
  auto counter = std::make_unique<CountingTransport>(net.AddNode(ids[i] + ":1"),
                                                     static_cast<uint32_t>(i), &index, &costs);
  n->counter = counter.get();
  n->cluster = Cluster::Assemble(ids[i], std::move(counter), std::move(membership));
  n->directory = std::make_unique<Directory>(DirectoryOptions{}, &n->metrics);
  HoldingsAnnouncerOptions ao;
  ao.publish_interval = milliseconds(0);  // Put flushes, and so do Join and Leave
  n->announcer = std::make_unique<HoldingsAnnouncer>(ao, n->cluster.get(), n->directory.get(),
                                                     n->tiered.get(), pool.get(), &n->metrics);
  n->server = std::make_unique<PeerServer>(n->cluster.get(), n->directory.get(), n->announcer.get(),
                                           n->tiered.get(), pool.get(), nullptr, &n->metrics);
  RemoteReaderOptions ro;
  ro.lookup_timeout = milliseconds(5000);
  ro.fetch_timeout = milliseconds(5000);
  ro.lookup_cache_ttl = milliseconds(0);  // every read pays its lookups
  ro.replicas = RemoteReaderOptions::Replicas::kNone;
  ro.chain_reads = opts.chain_reads;
  n->reader = std::make_unique<RemoteReader>(ro, n->cluster.get(), n->directory.get(),
                                             n->tiered.get(), pool.get(), &n->metrics);
  ro.chain_reads = true;
  n->chain_reader = std::make_unique<RemoteReader>(ro, n->cluster.get(), n->directory.get(),
                                                   n->tiered.get(), pool.get(), &n->metrics);
  ro.replicas = RemoteReaderOptions::Replicas::kAll;
  n->keeping_reader = std::make_unique<RemoteReader>(ro, n->cluster.get(), n->directory.get(),
                                                     n->tiered.get(), pool.get(), &n->metrics);
  n->announcer->Start();
  nodes.push_back(std::move(n));
  return Status::Ok();
}

Result<std::unique_ptr<ScaleSim>> ScaleSim::Open(const ScaleSimOptions& options) {
  if (options.nodes < 1 || options.nodes > 4096) {
    return InvalidArgument("scale sim: nodes must be in 1..4096");
  }
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->pool = std::make_unique<ThreadPool>(static_cast<int>(std::max<size_t>(1, options.threads)),
                                            "kvpool-sim");
  // Named (and indexed) up front, joiners included: the index is read by
  // every node's transport.
  for (size_t i = 0; i < options.nodes + ScaleSim::kMaxJoins; ++i) {
    impl->ids.push_back(SimNodeId(i));
    impl->index[impl->ids.back() + ":1"] = static_cast<uint32_t>(i);
    if (i >= options.nodes) continue;
    Member m;
    m.node_id = impl->ids.back();
    m.address = m.node_id + ":1";
    impl->members.push_back(m);
  }
  for (size_t i = 0; i < options.nodes; ++i) KVPOOL_RETURN_IF_ERROR(impl->AddNode(i));
  return std::unique_ptr<ScaleSim>(new ScaleSim(std::move(impl)));
}

size_t ScaleSim::size() const { return impl_->nodes.size(); }
const std::string& ScaleSim::node_id(size_t node) const { return impl_->ids.at(node); }

Status ScaleSim::Put(size_t writer, std::span<const KeyId> keys, uint64_t value_bytes,
                     RequestCost* cost) {
  ScaleSimNode& n = *impl_->nodes.at(writer);
  const uint64_t before = directory_entries();
  uint64_t fresh = 0;
  for (const KeyId& key : keys) {
    auto slot = n.tiered->Reserve(key, value_bytes);
    if (!slot.ok()) {
      if (slot.status().code() == StatusCode::kAlreadyExists) continue;
      return slot.status();
    }
    for (uint64_t j = 0; j < value_bytes; ++j) slot->data()[j] = ValueByte(key, j);
    KVPOOL_RETURN_IF_ERROR(n.tiered->Commit(std::move(slot).value()));
    impl_->held.emplace_back(key, static_cast<uint32_t>(writer));
    ++fresh;
  }
  n.counter->BeginWindow();
  n.announcer->Flush();
  // Published once every home lists them (self-homed ones at once).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (directory_entries() < before + fresh) {
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceeded(fmt::format("scale sim: {} of {} keys published in 30 s",
                                          directory_entries() - before, fresh));
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  if (cost != nullptr) *cost = n.counter->Take();
  return Status::Ok();
}

Status ScaleSim::Read(size_t reader, std::span<const KeyId> keys, size_t* found,
                      RequestCost* cost) {
  return Read(reader, impl_->opts.chain_reads ? ReadKind::kChain : ReadKind::kHomes, keys, found,
              cost);
}

Status ScaleSim::Read(size_t reader, ReadKind kind, std::span<const KeyId> keys, size_t* found,
                      RequestCost* cost) {
  ScaleSimNode& n = *impl_->nodes.at(reader);
  n.counter->BeginWindow();
  std::promise<std::vector<TieredStore::Pin>> done;
  auto got = done.get_future();
  RemoteReader* r = kind == ReadKind::kHomes   ? n.reader.get()
                    : kind == ReadKind::kChain ? n.chain_reader.get()
                                               : n.keeping_reader.get();
  r->Fetch(std::vector<KeyId>(keys.begin(), keys.end()),
           [&done](std::vector<TieredStore::Pin> pins) { done.set_value(std::move(pins)); });
  if (got.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return DeadlineExceeded("scale sim: a read did not end in 30 s");
  }
  std::vector<TieredStore::Pin> pins = got.get();
  size_t ok = 0;
  for (const TieredStore::Pin& p : pins) {
    bool exact = true;
    for (uint64_t j = 0; j < p.size() && exact; ++j) exact = p.data()[j] == ValueByte(p.key(), j);
    if (!exact) return Corruption("scale sim: a read returned wrong bytes");
    ++ok;
  }
  if (found != nullptr) *found = ok;
  if (cost != nullptr) *cost = n.counter->Take();
  if (kind != ReadKind::kChainKeep) return Status::Ok();
  // The copies kept here are published: once every key's home lists this
  // node, the next reader can be sent here.
  n.announcer->Flush();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const auto map = n.cluster->shard_map();
  for (const TieredStore::Pin& p : pins) {
    const Member* home = map->HomeOf(p.key());
    if (home == nullptr) continue;
    Directory& d = *impl_->nodes.at(impl_->index.at(home->address))->directory;
    for (;;) {
      const KeyId key = p.key();
      auto res = d.Lookup(std::span<const KeyId>(&key, 1));
      if (std::any_of(res[0].holders.begin(), res[0].holders.end(),
                      [&](const HolderRef& h) { return h.node_id == n.cluster->node_id(); })) {
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return DeadlineExceeded("scale sim: a kept copy was not published in 30 s");
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
  }
  return Status::Ok();
}

Status ScaleSim::Join(ViewChange* change) {
  Impl& im = *impl_;
  const size_t i = im.nodes.size();
  if (i >= im.ids.size()) return FailedPrecondition("scale sim: no more joins");
  const auto before = im.nodes.front()->cluster->shard_map();
  Member m;
  m.node_id = im.ids[i];
  m.address = m.node_id + ":1";
  im.members.push_back(m);
  ++im.epoch;
  KVPOOL_RETURN_IF_ERROR(im.AddNode(i));  // with the new view
  return ChangeView(before, change);
}

Status ScaleSim::Leave(size_t node, ViewChange* change) {
  Impl& im = *impl_;
  ScaleSimNode& n = *im.nodes.at(node);
  if (!n.up) return FailedPrecondition("scale sim: that node is down already");
  const auto before = n.cluster->shard_map();
  n.counter->Crash();
  n.up = false;
  std::erase_if(im.members, [&](const Member& m) { return m.node_id == im.ids[node]; });
  ++im.epoch;
  return ChangeView(before, change);
}

Status ScaleSim::ChangeView(const std::shared_ptr<const ShardMap>& before, ViewChange* change) {
  Impl& im = *impl_;
  ViewChange c;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& n : im.nodes) {
    if (n->up) n->membership->Set(im.members, im.epoch);
  }
  c.views_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::shared_ptr<const ShardMap> after;
  for (auto& n : im.nodes) {
    if (n->up) after = n->cluster->shard_map();
  }
  if (after == nullptr) return FailedPrecondition("scale sim: no node is up");
  std::vector<bool> moved(kNumShards, false);
  for (uint32_t shard : ShardMap::Moved(*before, *after)) {
    moved[shard] = true;
    ++c.shards_moved;
  }
  // The keys whose home moved, held by a node still up: unreachable until
  // a holder has told the new home.
  std::vector<std::pair<KeyId, uint32_t>> waiting;
  for (const auto& [key, holder] : im.held) {
    if (!im.nodes[holder]->up) {
      ++c.keys_lost;
    } else if (moved[ShardOf(key)]) {
      waiting.emplace_back(key, holder);
    }
  }
  c.keys_moved = waiting.size();
  // Until each is listed at its new home; the publishers flushed every 5
  // ms, as a node's --publish-interval does.
  const auto t1 = std::chrono::steady_clock::now();
  const auto limit = t1 + std::chrono::seconds(300);
  while (!waiting.empty()) {
    if (std::chrono::steady_clock::now() > limit) {
      c.whole_s = -1;
      if (change != nullptr) *change = c;
      return Status::Ok();
    }
    for (auto& n : im.nodes) {
      if (n->up) n->announcer->Flush();
    }
    std::this_thread::sleep_for(milliseconds(5));
    std::erase_if(waiting, [&](const std::pair<KeyId, uint32_t>& kh) {
      const Member* home = after->HomeOf(kh.first);
      if (home == nullptr) return false;
      const auto res = im.nodes[im.index.at(home->address)]->directory->Lookup(
          std::span<const KeyId>(&kh.first, 1));
      // Reachable again: its new home names a holder that is up (a home
      // names at most kDirectoryHoldersPerKey, the others are spares).
      return std::any_of(res[0].holders.begin(), res[0].holders.end(), [&](const HolderRef& h) {
        auto at = im.index.find(h.node_id + ":1");
        return at != im.index.end() && at->second < im.nodes.size() && im.nodes[at->second]->up;
      });
    });
  }
  c.whole_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (change != nullptr) *change = c;
  return Status::Ok();
}

double SimCostTable::Handler(uint16_t type) const {
  auto it = handler_us.find(type);
  return it == handler_us.end() ? 0.0 : it->second;
}
double SimCostTable::Send(uint16_t type) const {
  auto it = send_us.find(type);
  return it == send_us.end() ? 0.0 : it->second;
}

SimCostTable ScaleSim::costs() const { return impl_->costs.Medians(); }

double ScaleSim::LatencyUs(const std::vector<SimCall>& calls, const LinkModel& link,
                           const SimCostTable& costs, uint64_t seed,
                           std::vector<double>* replied_at) {
  const double bytes_per_us = link.gbit * 1e3 / 8;
  // One way: the latency with its jitter (draw k of the call).
  auto trip = [&](size_t call, uint64_t k) {
    double extra = -link.jitter * std::log(Uniform(seed, call, 2 * k));
    if (link.slow_every > 0 && Uniform(seed, call, 2 * k + 1) < 1.0 / link.slow_every) {
      extra += link.slow_factor;
    }
    return link.latency_us * (1 + extra);
  };
  std::vector<double> replied(calls.size(), 0);
  // When each node's CPU (handlers, sends) and each node's link out are
  // free next.
  std::map<uint32_t, double> cpu_free, wire_free;
  double end = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    const SimCall& c = calls[i];
    const double ready = c.parent < 0 ? 0 : replied[static_cast<size_t>(c.parent)];
    double& sender = cpu_free[c.from];
    const double sent = std::max(ready, sender) + costs.Send(c.type);
    sender = sent;
    double& out = wire_free[c.from];
    out = std::max(out, sent) + static_cast<double>(c.request_bytes) / bytes_per_us;
    const double arrived = out + trip(i, 0);
    double& receiver = cpu_free[c.to];
    receiver = std::max(receiver, arrived) + costs.Handler(c.type);
    double& back = wire_free[c.to];
    back = std::max(back, receiver) + static_cast<double>(c.reply_bytes) / bytes_per_us;
    replied[i] = back + trip(i, 1);
    end = std::max(end, replied[i]);
  }
  if (replied_at != nullptr) *replied_at = std::move(replied);
  return end;
}

uint64_t ScaleSim::directory_entries() const {
  uint64_t n = 0;
  for (const auto& node : impl_->nodes) n += node->directory->entries();
  return n;
}

uint64_t ScaleSim::directory_bytes() const {
  uint64_t n = 0;
  for (const auto& node : impl_->nodes) n += node->directory->bytes();
  return n;
}

uint64_t ScaleSim::directory_bytes_max() const {
  uint64_t n = 0;
  for (const auto& node : impl_->nodes) n = std::max(n, node->directory->bytes());
  return n;
}

uint64_t ScaleSim::membership_bytes(size_t node) const {
  const ScaleSimNode& n = *impl_->nodes.at(node);
  auto view = n.cluster->view();
  // The view's members, and the shard map's copy of them and its table of
  // one 16-bit owner per shard (strings this short live inside Member).
  uint64_t members = 0;
  for (const Member& m : view->members) {
    members += sizeof(Member);
    if (m.node_id.size() > 15) members += m.node_id.capacity();
    if (m.address.size() > 15) members += m.address.capacity();
  }
  return 2 * members + kNumShards * sizeof(uint16_t);
}

uint64_t ScaleSim::peers_called(size_t node) const {
  return impl_->nodes.at(node)->counter->peers();
}

std::shared_ptr<const ShardMap> ScaleSim::shard_map() const {
  return impl_->nodes.front()->cluster->shard_map();
}

double ShardsMovedVsIdeal(size_t nodes, bool leave, uint64_t* moved) {
  MembershipView small, large;
  for (size_t i = 0; i <= nodes; ++i) {
    Member m;
    m.node_id = SimNodeId(i);
    m.address = m.node_id + ":1";
    if (i < nodes) small.members.push_back(m);
    large.members.push_back(m);
  }
  const ShardMap a = ShardMap::Compute(small);
  const ShardMap b = ShardMap::Compute(large);
  const uint64_t n = leave ? ShardMap::Moved(b, a).size() : ShardMap::Moved(a, b).size();
  if (moved != nullptr) *moved = n;
  const double ideal = static_cast<double>(kNumShards) / static_cast<double>(nodes + 1);
  return static_cast<double>(n) / ideal;
}

}  // namespace kvpool::cluster
