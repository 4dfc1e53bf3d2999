#include "cluster/cluster_services.h"

#include <algorithm>
#include <utility>

#include "cluster/peer_handler.h"
#include "peer/peer_messages_format.h"

namespace kvpool::cluster {

Result<std::unique_ptr<ClusterServices>> ClusterServices::Open(
    const ClusterServicesOptions& options, TieredStore* store, blocks::DescriptorTable* descriptors,
    blocks::BlockEventListener* events, std::vector<ServicesTenant> tenants,
    MetricsRegistry* metrics, std::function<std::string()> key_figures) {
  std::unique_ptr<ClusterServices> s(new ClusterServices());
  s->descriptors_ = descriptors;
  s->events_ = events;
  for (auto& t : tenants)
    s->tenants_.push_back(Tenant{std::move(t), nullptr, nullptr, nullptr, nullptr});
  Status st = s->OpenAll(options, store, metrics, std::move(key_figures));
  if (!st.ok()) return st;  // the destructor stops what opened
  return s;
}

Status ClusterServices::OpenAll(const ClusterServicesOptions& options, TieredStore* store,
                                MetricsRegistry* metrics,
                                std::function<std::string()> key_figures) {
  peer_pool_ = std::make_unique<ThreadPool>(2, "kvpool-peer");
  KVPOOL_ASSIGN_OR_RETURN(cluster_, Cluster::Open(options.cluster, peer_pool_.get(), metrics));
  // The admin cluster view asks every member for its key figures.
  ServePeer(cluster_.get(), metrics, {kPeerStatus, "status", WhenFenced::kServe},
            [key_figures = std::move(key_figures)](transport::Incoming&, transport::Responder& r) {
              const std::string j = key_figures();
              r.Respond(Status::Ok(), std::vector<uint8_t>(j.begin(), j.end()));
              return Status::Ok();
            });
  cluster_thread_ = std::thread([c = cluster_.get()] { c->Run(); });
  directory_ = std::make_unique<Directory>(options.directory, metrics);
  HoldingsAnnouncerOptions ao;
  if (options.placement != Placement::kLocal) {
    HomePlacerOptions po;
    po.by_chain = options.placement == Placement::kChain;
    po.timeout = options.remote.fetch_timeout;
    po.max_inflight_bytes =
        std::min(options.placement_max_inflight, options.dram_capacity_bytes / 4);
    ao.placement = po;
  }
  announcer_ = std::make_unique<HoldingsAnnouncer>(ao, cluster_.get(), directory_.get(), store,
                                                   peer_pool_.get(), metrics);
  // SSD inventory listings read the device for seconds: their own thread.
  if (store->has_ssd_tier()) list_pool_ = std::make_unique<ThreadPool>(1, "kvpool-list");
  ClientTenants client_tenants;
  ClusterTenants cluster_tenants;
  for (auto& t : tenants_) {
    for (const auto& token : t.spec.tokens) {
      client_tenants.emplace(token, ClientTenant{t.spec.store, TenantKeys(t.spec.name)});
    }
    t.directory = std::make_unique<Directory>(options.directory, t.spec.metrics);
    HoldingsAnnouncerOptions tao = ao;
    tao.publish.tenant = t.spec.name;
    if (tao.placement) tao.placement->tenant = t.spec.name;
    t.announcer = std::make_unique<HoldingsAnnouncer>(
        tao, cluster_.get(), t.directory.get(), t.spec.store, peer_pool_.get(), t.spec.metrics);
    cluster_tenants.emplace(t.spec.name,
                            ClusterTenant{t.spec.store, t.directory.get(), t.announcer.get()});
  }
  peer_server_ = std::make_unique<PeerServer>(
      cluster_.get(), directory_.get(), announcer_.get(), store, peer_pool_.get(), list_pool_.get(),
      metrics, std::move(client_tenants), std::move(cluster_tenants));
  // Routers' prefix lookups: the engine blocks this node holds, at their
  // index keys' homes.
  block_index_ = std::make_unique<BlockIndex>(options.block_index, cluster_.get(), descriptors_,
                                              peer_pool_.get(), metrics);
  descriptors_->SetListeners(events_, block_index_.get());
  block_index_->Start();
  anti_entropy_ = std::make_unique<AntiEntropy>(options.anti_entropy, cluster_.get(),
                                                directory_.get(), announcer_.get(), store, metrics);
  anti_entropy_->Start();
  reader_ = std::make_unique<RemoteReader>(ReaderOptions(options), cluster_.get(), directory_.get(),
                                           store, peer_pool_.get(), metrics);
  placement_ =
      std::make_unique<ClusterPlacement>(options.placement, announcer_.get(), reader_.get());
  announcer_->Start();
  for (auto& t : tenants_) {
    RemoteReaderOptions tro = ReaderOptions(options);
    tro.tenant = t.spec.name;
    t.reader = std::make_unique<RemoteReader>(tro, cluster_.get(), t.directory.get(), t.spec.store,
                                              peer_pool_.get(), t.spec.metrics);
    t.placement =
        std::make_unique<ClusterPlacement>(options.placement, t.announcer.get(), t.reader.get());
    t.announcer->Start();
  }
  return Status::Ok();
}

RemoteReaderOptions ClusterServices::ReaderOptions(const ClusterServicesOptions& options) {
  RemoteReaderOptions ro = options.remote;
  // Placement chain keeps a chain on one node: reads keep no replicas.
  if (options.placement == Placement::kChain) ro.replicas = RemoteReaderOptions::Replicas::kNone;
  // A chain lives on one node under placements chain and local (its
  // writer's); under home its blocks are spread over their homes.
  ro.chain_reads = options.placement != Placement::kHome;
  return ro;
}

ClusterServices::~ClusterServices() { Stop(); }

void ClusterServices::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // Leave the cluster. Destroying it fails the peer calls in flight.
  if (block_index_) {
    descriptors_->SetListeners(events_, nullptr);
    block_index_->Stop();
  }
  if (announcer_) announcer_->Stop();
  if (reader_) reader_->Stop();
  for (auto& t : tenants_) {
    if (t.announcer) t.announcer->Stop();
    if (t.reader) t.reader->Stop();
  }
  if (anti_entropy_) anti_entropy_->Stop();
  if (cluster_) cluster_->Stop();
  if (cluster_thread_.joinable()) cluster_thread_.join();
  if (peer_pool_) peer_pool_->Stop();
  cluster_.reset();
  anti_entropy_.reset();
  peer_server_.reset();
  block_index_.reset();
  if (list_pool_) list_pool_->Stop();  // queued listings return at once now
  placement_.reset();
  reader_.reset();
  announcer_.reset();  // after the transport: the placer's callbacks use it
  directory_.reset();
  for (auto& t : tenants_) {
    t.placement.reset();
    t.reader.reset();
    t.announcer.reset();
    t.directory.reset();
  }
}

}  // namespace kvpool::cluster
