#include "cluster/peer_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "cluster/peer_handler.h"
#include "common/log.h"
#include "peer/peer_messages_format.h"
#include "protocol/codec.h"
#include "protocol/message_format.h"

namespace kvpool::cluster {

using transport::Incoming;
using transport::Responder;
using transport::ServerReply;

namespace {

// Answers a fetch from a pinned DRAM entry without copying: the pin lives
// until the transport releases the payload.
void ReplyWithPin(Responder& responder, TieredStore::Pin pin) {
  auto held = std::make_shared<TieredStore::Pin>(std::move(pin));
  std::vector<uint8_t> header;
  EncodeFetchReply(held->size(), &header);
  ServerReply reply;
  reply.status = Status::Ok();
  reply.header = std::move(header);
  reply.payload = held->bytes();
  reply.release = [held] {};
  responder.Respond(std::move(reply));
}

}  // namespace

const ClientTenant* PeerServer::TenantOf(const Incoming& in) const {
  if (in.principal.empty() || client_tenants_.empty()) return nullptr;
  auto it = client_tenants_.find(in.principal);
  return it == client_tenants_.end() ? nullptr : &it->second;
}

TieredStore* PeerServer::StoreFor(const Incoming& in, KeyId* key) const {
  const ClientTenant* t = TenantOf(in);
  if (t == nullptr) return store_;
  *key = t->keys.Bind(*key);
  return t->store;
}

void PeerServer::OwnLookup(TieredStore* store, const TenantKeys* bind, std::vector<KeyId> keys,
                           Responder r) {
  std::vector<LookupResult> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto size = store->SizeOf(bind != nullptr ? bind->Bind(keys[i]) : keys[i]);
    if (!size.ok()) continue;
    results[i].size = *size;
    results[i].holders.push_back({cluster_->node_id(), cluster_->incarnation()});
  }
  RespondEncoded(r, [&](std::vector<uint8_t>* body) { EncodeLookupReply(results, body); });
}

PeerServer::PeerServer(Cluster* cluster, Directory* directory, HoldingsAnnouncer* announcer,
                       TieredStore* store, Executor* executor, Executor* list_executor,
                       MetricsRegistry* metrics, ClientTenants client_tenants,
                       ClusterTenants cluster_tenants)
    : cluster_(cluster),
      directory_(directory),
      client_tenants_(std::move(client_tenants)),
      cluster_tenants_(std::move(cluster_tenants)),
      announcer_(announcer),
      store_(store),
      executor_(executor),
      list_executor_(list_executor != nullptr ? list_executor : executor),
      owned_metrics_(metrics == nullptr ? std::make_unique<MetricsRegistry>() : nullptr),
      metrics_(metrics != nullptr ? metrics : owned_metrics_.get()),
      ssd_replayed_(metrics_->GetCounter("kvpool_publish_ssd_replayed_total",
                                         "Entries held only on SSD published again to their homes "
                                         "(at start, for moved shards, after re-registration)")),
      tenant_refused_(
          metrics_->GetCounter("kvpool_peer_tenant_refused_total",
                               "Tenant-scoped peer requests refused: a tenant this node "
                               "does not define, or a malformed scope")),
      last_map_(cluster->shard_map()),
      last_incarnation_(cluster->incarnation()) {
  // The directory learns each member's newest incarnation from the views,
  // the first one included.
  for (const Scope& sc : Scopes()) sc.directory->Prune(*cluster_->view());
  HandleScoped(kPeerPublish, "publish", [this](const Scope& sc, Incoming& in, Responder& r) {
    PublishBatch batch;
    KVPOOL_RETURN_IF_ERROR(DecodePublish(in.payload, &batch));
    cluster_->ObservePeer(batch.node_id, batch.incarnation);
    sc.directory->Apply(batch);
    r.Respond(Status::Ok());
    return Status::Ok();
  });
  HandleScoped(kPeerLookup, "lookup", [this](const Scope& sc, Incoming& in, Responder& r) {
    std::vector<KeyId> keys;
    KVPOOL_RETURN_IF_ERROR(DecodeLookup(in.payload, &keys));
    // A tenant's keys are held by their home alone (this node, which the
    // client asked as the keys' home), in the tenant's store.
    if (const ClientTenant* t = sc.tenant ? nullptr : TenantOf(in)) {
      OwnLookup(t->store, &t->keys, std::move(keys), std::move(r));
      return Status::Ok();
    }
    // Who asks picks which of a key's many holders are named (Directory::Lookup).
    auto results = sc.directory->Lookup(keys, Directory::AskerOf(in.peer));
    RespondEncoded(r, [&](std::vector<uint8_t>* body) { EncodeLookupReply(results, body); });
    return Status::Ok();
  });
  // A chain read asks the node holding the chain's first block about the rest.
  HandleScoped(kPeerHolderLookup, "holder_lookup",
               [this](const Scope& sc, Incoming& in, Responder& r) {
                 std::vector<KeyId> keys;
                 KVPOOL_RETURN_IF_ERROR(DecodeLookup(in.payload, &keys));
                 const ClientTenant* t = sc.tenant ? nullptr : TenantOf(in);
                 OwnLookup(t != nullptr ? t->store : sc.store, t != nullptr ? &t->keys : nullptr,
                           std::move(keys), std::move(r));
                 return Status::Ok();
               });
  HandleScoped(kPeerFetch, "fetch", [this](const Scope& sc, Incoming& in, Responder& r) {
    KeyId key;
    uint64_t max_size = 0;
    KVPOOL_RETURN_IF_ERROR(DecodeFetch(in.request, &key, &max_size));
    TieredStore* store = sc.tenant ? sc.store : StoreFor(in, &key);
    // Called from DRAM at once, or (only on SSD) after its promotion.
    auto answer = [r = std::move(r), max_size](Status ps, TieredStore::Pin p) mutable {
      if (!ps.ok() || !p.valid()) return r.Respond(NotFound("not held here"));
      if (p.size() > max_size) return r.Respond(ResourceExhausted("value larger than asked"));
      ReplyWithPin(r, std::move(p));
    };
    store->AcquireOrPromote(key, std::move(answer));
    return Status::Ok();
  });
  HandleScoped(kPeerStore, "store", [this](const Scope& sc, Incoming& in, Responder& r) {
    KeyId key;
    uint64_t size = 0;
    std::optional<KeyId> after;
    uint8_t flags = 0;
    KVPOOL_RETURN_IF_ERROR(DecodeStore(in.request, &key, &size, &after, &flags));
    if (size != in.payload.size()) return InvalidArgument("store: payload size mismatch");
    TieredStore* store = sc.tenant ? sc.store : StoreFor(in, &key);
    // The one copy of a home placement: the request buffer into the slot.
    // The writer drops its copy on this OK: the key must be in this home's
    // directory first, or a read through the writer misses until the next
    // publish tick. A placed commit is published before Put returns
    // (HoldingsAnnouncer). Placement chain: just colder than the block
    // before it in its chain.
    TieredStore::Chain chain = TieredStore::Chain::After(after ? *after : KeyId{});
    Status s = store->Put(
        key, in.payload,
        {WriteOrigin::kPlaced, after ? &chain : nullptr, (flags & kStoreReturning) != 0});
    // Already here: the home holds it, which is all the writer asks.
    if (s.code() == StatusCode::kAlreadyExists) s = Status::Ok();
    r.Respond(std::move(s));
    return Status::Ok();
  });
  // A cache hint another node was given for keys this node holds.
  HandleScoped(kPeerHint, "hint", [this](const Scope& sc, Incoming& in, Responder& r) {
    if (!sc.tenant && !in.principal.empty()) {
      return PermissionDenied("cache hints between nodes are for members only");
    }
    protocol::HintRequest m;
    KVPOOL_RETURN_IF_ERROR(protocol::DecodeHint(in.payload, protocol::kMaxHintKeys, &m));
    const std::optional<HintOp> known = HintOpOf(m.op);
    if (!known || m.priority > 255) {
      return InvalidArgument("hint: unknown operation or priority over 255");
    }
    const HintOp op = *known;
    auto answer = [r = std::move(r)](Result<HintResult> res) mutable {
      if (!res.ok()) return r.Respond(res.status());
      std::vector<uint8_t> header;
      protocol::EncodeHintReply({res->applied, res->unknown, res->clipped, res->moved}, &header);
      transport::ServerReply reply;
      reply.status = Status::Ok();
      reply.header = std::move(header);
      r.Respond(std::move(reply));
    };
    if (op == HintOp::kPrefetch) {
      auto shared = std::make_shared<decltype(answer)>(std::move(answer));
      sc.store->Prefetch(m.keys, [shared](Result<HintResult> res) { (*shared)(std::move(res)); });
    } else {
      const auto ttl =
          std::chrono::milliseconds(std::min<uint64_t>(m.ttl_ms, INT64_MAX / 1'000'000));
      answer(sc.store->Hint(op, m.keys, ttl, static_cast<uint8_t>(m.priority)));
    }
    return Status::Ok();
  });
  // Remote-mode clients learn the membership from any node.
  ServePeer(cluster_, metrics_, {kPeerMembers, "members"}, [this](Incoming&, Responder& r) {
    RespondEncoded(
        r, [&](std::vector<uint8_t>* body) { EncodeMembersReply(*cluster_->view(), body); });
    return Status::Ok();
  });
  // A fenced node missed whatever was published or unpublished meanwhile
  // (its handlers refuse while fenced, and a paused process hears nothing):
  // its entries may list keys their holders dropped. It starts empty; the
  // holders replay to it when it is back under a new incarnation.
  fence_sub_ = cluster_->membership()->SubscribeFence([this](bool fenced) {
    if (!fenced) return;
    for (const Scope& sc : Scopes()) sc.directory->Clear();
  });
  sub_ = cluster_->membership()->SubscribeViews(
      [this](const std::shared_ptr<const MembershipView>& view) {
        auto after = cluster_->shard_map();
        auto before = last_map_;
        last_map_ = after;
        // Re-registered (after a fence) under a new incarnation: every home
        // drops what this node published before, so all of it is replayed.
        uint64_t inc = cluster_->incarnation();
        bool all = inc != last_incarnation_;
        last_incarnation_ = inc;
        executor_->Submit([this, before, after, view, all] { OnView(before, after, view, all); });
      });
  // What the SSD tier recovered (checkpoint or scan) is held from the start
  // but no home has heard of it yet.
  for (const Scope& sc : Scopes()) Relist(sc, std::vector<bool>(kNumShards, true));
}

std::vector<PeerServer::Scope> PeerServer::Scopes() const {
  std::vector<Scope> out = {Scope{store_, directory_, announcer_, false}};
  for (const auto& [name, t] : cluster_tenants_) {
    out.push_back(Scope{t.store, t.directory, t.announcer, true});
  }
  return out;
}

void PeerServer::HandleScoped(transport::MessageType base, std::string_view name,
                              ScopedHandler fn) {
  auto shared = std::make_shared<ScopedHandler>(std::move(fn));
  ServePeer(cluster_, metrics_, {base, name}, [this, shared](Incoming& in, Responder& r) {
    return (*shared)(Scope{store_, directory_, announcer_, false}, in, r);
  });
  const std::string tenant_name = "tenant_" + std::string(name);
  ServePeer(cluster_, metrics_, {ScopedType(base, "tenant"), tenant_name},
            [this, shared](Incoming& in, Responder& r) {
              // A client's tenant is its token's; only members name one.
              if (!in.principal.empty()) {
                tenant_refused_->Inc();
                return PermissionDenied("tenant-scoped requests are for members only");
              }
              std::string tenant;
              std::span<const uint8_t> rest;
              if (Status s = DecodeTenantScope(in.request, &tenant, &rest); !s.ok()) {
                tenant_refused_->Inc();
                return s;
              }
              auto it = cluster_tenants_.find(tenant);
              if (it == cluster_tenants_.end()) {
                tenant_refused_->Inc();
                return FailedPrecondition(fmt::format(
                    "tenant '{}' is not defined on node {} (every node of a tenant needs it in "
                    "its --tenants-file)",
                    tenant, cluster_->node_id()));
              }
              in.request = rest;
              const ClusterTenant& ct = it->second;
              return (*shared)(Scope{ct.store, ct.directory, ct.announcer, true}, in, r);
            });
}

// The membership (and its subscription) is gone by now: see the header.
PeerServer::~PeerServer() { gate_->Close(); }

void PeerServer::RunGated(std::function<void()> fn) {
  // Closed: the server is gone, and `this` in fn with it.
  list_executor_->Submit([gate = gate_, fn = std::move(fn)] { gate->Run(fn); });
}

void PeerServer::Relist(const Scope& sc, std::vector<bool> shards) {
  // On the list executor, where a large inventory may wait for the
  // publisher's queue to drain, never on the peer handlers' threads.
  RunGated([this, sc, shards = std::move(shards)] {
    auto sent = sc.announcer->Republish(shards, [this] { return gate_->closed(); });
    ssd_replayed_->Inc(sent.ssd);
    LogDebug("republished {} DRAM and {} SSD entries", sent.dram, sent.ssd);
  });
}

void PeerServer::OnView(std::shared_ptr<const ShardMap> before,
                        std::shared_ptr<const ShardMap> after,
                        std::shared_ptr<const MembershipView> view, bool replay_all) {
  // Entries of shards this node is no longer the home of: nobody asks here
  // for them, and kept they would be stale when a later view brings the
  // shard back (removes went to the other home meanwhile).
  std::vector<bool> owned(kNumShards, false);
  for (uint32_t s = 0; s < kNumShards; ++s) {
    const Member* h = after->Home(s);
    owned[s] = h != nullptr && h->node_id == cluster_->node_id();
  }
  for (const Scope& sc : Scopes()) {
    sc.directory->Prune(*view);
    sc.directory->RetainShards(owned);
  }
  // Shards whose home changed: their new homes know nothing of what this
  // node holds, so tell them again.
  std::vector<uint32_t> moved = ShardMap::Moved(*before, *after);
  if (moved.empty() && !replay_all) return;
  std::vector<bool> is_moved(kNumShards, replay_all);
  for (uint32_t s : moved) is_moved[s] = true;
  LogDebug("view {}: {} shards moved{}", view->epoch, moved.size(),
           replay_all ? ", every entry republished" : "");
  for (const Scope& sc : Scopes()) Relist(sc, is_moved);
}

}  // namespace kvpool::cluster
