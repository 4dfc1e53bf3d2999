#include "cluster/scale_sim.h"

#include <fmt/format.h>

#include <chrono>
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
#include "membership/static_membership.h"
#include "peer/peer_messages_format.h"
#include "store/tiered_store.h"
#include "transport/in_process_transport.h"

namespace kvpool::cluster {
namespace {

using std::chrono::milliseconds;

std::string SimNodeId(size_t i) { return fmt::format("n{:04d}", i); }

// The calls a node sends: per message type, their peers and bytes. A window
// (BeginWindow .. Take) is one request's.
class CountingTransport final : public transport::Transport {
 public:
  explicit CountingTransport(std::unique_ptr<transport::Transport> inner)
      : inner_(std::move(inner)) {}
  std::string address() const override { return inner_->address(); }
  void RegisterHandler(transport::MessageType type, transport::Handler h) override {
    inner_->RegisterHandler(type, std::move(h));
  }
  void Call(const transport::CallArgs& args, transport::ReplyCallback done) override {
    {
      std::lock_guard lock(mu_);
      ++window_.messages;
      window_.bytes += args.request.size() + args.payload.size();
      if (args.type == kPeerLookup) ++window_.lookups;
      if (args.type == kPeerFetch) ++window_.fetches;
      if (args.type == kPeerPublish) ++window_.publishes;
      if (args.type == kPeerStore) ++window_.stores;
      if (args.type == kPeerLookup || args.type == kPeerPublish) homes_.insert(args.peer);
      peers_.insert(args.peer);
    }
    inner_->Call(args, std::move(done));
  }
  void Stop() override { inner_->Stop(); }

  void BeginWindow() {
    std::lock_guard lock(mu_);
    window_ = {};
    homes_.clear();
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
  std::mutex mu_;
  RequestCost window_;           // protected by mu_
  std::set<std::string> homes_;  // this window's; protected by mu_
  std::set<std::string> peers_;  // ever called; protected by mu_
};

// The bytes of key's value at offset j: checkable without keeping them.
uint8_t ValueByte(const KeyId& key, uint64_t j) {
  return static_cast<uint8_t>((key.hi >> ((j % 8) * 8)) ^ (key.lo >> ((j % 7) * 8)) ^ j);
}

}  // namespace

struct ScaleSimNode {
  MetricsRegistry metrics;  // outlives everything below
  std::unique_ptr<TieredStore> tiered;
  CountingTransport* counter = nullptr;  // owned by cluster
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<Directory> directory;
  std::unique_ptr<HoldingsAnnouncer> announcer;
  std::unique_ptr<PeerServer> server;
  std::unique_ptr<RemoteReader> reader;
};

struct ScaleSim::Impl {
  ScaleSimOptions opts;
  transport::InProcessNetwork net;  // outlives the nodes' transports
  std::unique_ptr<ThreadPool> pool;
  std::vector<std::unique_ptr<ScaleSimNode>> nodes;
  std::vector<std::string> ids;

  ~Impl() {
    for (auto& n : nodes) {
      n->announcer->Stop();
      n->reader->Stop();
    }
    if (pool) pool->Stop();
    for (auto& n : nodes) {
      n->cluster.reset();
      n->server.reset();
      n->reader.reset();
      n->announcer.reset();
      n->directory.reset();
    }
    nodes.clear();
  }
};

ScaleSim::ScaleSim(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ScaleSim::~ScaleSim() = default;

Result<std::unique_ptr<ScaleSim>> ScaleSim::Open(const ScaleSimOptions& options) {
  if (options.nodes < 1 || options.nodes > 4096) {
    return InvalidArgument("scale sim: nodes must be in 1..4096");
  }
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->pool = std::make_unique<ThreadPool>(static_cast<int>(std::max<size_t>(1, options.threads)),
                                            "kvpool-sim");
  std::vector<Member> members;
  for (size_t i = 0; i < options.nodes; ++i) {
    impl->ids.push_back(SimNodeId(i));
    Member m;
    m.node_id = impl->ids.back();
    m.address = m.node_id + ":1";
    members.push_back(m);
  }
  for (size_t i = 0; i < options.nodes; ++i) {
    auto n = std::make_unique<ScaleSimNode>();
    DramOptions d;
    d.capacity_bytes = options.dram_bytes;
    d.slab_bytes = 1u << 20;
    d.max_value_bytes = 1u << 20;
    d.huge_pages = false;
    d.prefault = false;
    d.eviction = "lru";
    KVPOOL_ASSIGN_OR_RETURN(n->tiered,
                            TieredStore::Open(d, nullptr, impl->pool.get(), impl->pool.get(),
                                              TieringOptions{}, &n->metrics));
    // Incarnation 0: no home learns a new view from a peer's publish.
    KVPOOL_ASSIGN_OR_RETURN(auto membership,
                            StaticMembership::Open({impl->ids[i], 0, members}, &n->metrics));
    auto counter = std::make_unique<CountingTransport>(impl->net.AddNode(members[i].address));
    n->counter = counter.get();
    n->cluster = Cluster::Assemble(impl->ids[i], std::move(counter), std::move(membership));
    n->directory = std::make_unique<Directory>(DirectoryOptions{}, &n->metrics);
    HoldingsAnnouncerOptions ao;
    ao.publish_interval = milliseconds(0);  // Put flushes
    n->announcer = std::make_unique<HoldingsAnnouncer>(
        ao, n->cluster.get(), n->directory.get(), n->tiered.get(), impl->pool.get(), &n->metrics);
    n->server =
        std::make_unique<PeerServer>(n->cluster.get(), n->directory.get(), n->announcer.get(),
                                     n->tiered.get(), impl->pool.get(), nullptr, &n->metrics);
    RemoteReaderOptions ro;
    ro.lookup_timeout = milliseconds(5000);
    ro.fetch_timeout = milliseconds(5000);
    ro.lookup_cache_ttl = milliseconds(0);  // every read pays its lookups
    ro.replicas = RemoteReaderOptions::Replicas::kNone;
    n->reader = std::make_unique<RemoteReader>(ro, n->cluster.get(), n->directory.get(),
                                               n->tiered.get(), impl->pool.get(), &n->metrics);
    n->announcer->Start();
    impl->nodes.push_back(std::move(n));
  }
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
  ScaleSimNode& n = *impl_->nodes.at(reader);
  n.counter->BeginWindow();
  std::promise<std::vector<TieredStore::Pin>> done;
  auto got = done.get_future();
  n.reader->Fetch(std::vector<KeyId>(keys.begin(), keys.end()),
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
  return Status::Ok();
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
