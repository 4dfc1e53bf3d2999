#include "node/node.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "admin/admin_server.h"
#include "blocks/descriptor_table.h"
#include "cluster/cluster_services.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/secret_file.h"
#include "events/kv_events.h"
#include "node/hints_api.h"
#include "node/local_server.h"
#include "node/node_stores.h"
#include "node/node_views.h"
#include "node/prefix_lookup.h"
#include "transport/ucx_transport.h"

namespace kvpool {
namespace {

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "kvpool-node";
  return buf;
}

uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v == 0 ? 1 : v;
}

NodeOptions Named(NodeOptions o) {
  if (o.node_id.empty()) o.node_id = HostName();
  return o;
}

class NodeImpl final : public Node {
 public:
  NodeImpl(const NodeOptions& o, std::string config_json,
           std::function<void(const Status&)> on_fatal)
      : opts_(Named(o)),
        config_json_(std::move(config_json)),
        on_fatal_(std::move(on_fatal)),
        instance_id_(NewInstanceId()),
        views_(&opts_, instance_id_, &metrics_, &stores_, &stopping_) {}
  ~NodeImpl() override { Stop(); }

  // Start-up, in order; Stop undoes it in reverse.
  Status Open() {
    KVPOOL_RETURN_IF_ERROR(LoadClusterKeys());
    KVPOOL_RETURN_IF_ERROR(LoadAdminToken());
    KVPOOL_RETURN_IF_ERROR(stores_.Load(opts_, client_tokens_));
    KVPOOL_RETURN_IF_ERROR(stores_.Open(opts_, &metrics_));
    KVPOOL_RETURN_IF_ERROR(OpenEvents());
    KVPOOL_RETURN_IF_ERROR(OpenCluster());
    KVPOOL_RETURN_IF_ERROR(OpenLocal());
    KVPOOL_RETURN_IF_ERROR(OpenAdmin());
    DramStats st = stores_.store()->GetDramStats();
    LogInfo("node {} serving: socket {} dram {} ({} pages){}", opts_.node_id,
            opts_.local.socket_path, SettingsTable::FormatBytes(st.capacity_bytes),
            st.huge_pages            ? "hugetlb"
            : st.huge_page_bytes > 0 ? "transparent huge"
                                     : "4KiB",
            admin_ ? fmt::format(" admin http://{}:{}", opts_.admin.bind_address, admin_->port())
                   : std::string());
    return Status::Ok();
  }

  void Stop() override {
    std::lock_guard lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_.store(true);
    if (admin_) admin_->Stop();
    admin_.reset();
    // No new requests; the server lives until the cluster is gone (peer
    // callbacks in flight reach it) and the promotions that call back into
    // it are stopped.
    if (local_) local_->Stop();
    if (local_thread_.joinable()) local_thread_.join();
    if (lookups_) lookups_->Stop();  // lookups in flight use the cluster's index
    if (services_) services_->Stop();
    views_.set_cluster(nullptr);
    stores_.StopPromotions();
    views_.set_local(nullptr);
    local_.reset();
    if (descriptors_) {
      stores_.store()->SetHoldingsObserver(nullptr, HoldingsSlot::kBlocks);
      descriptors_->SetListeners(nullptr, nullptr);
    }
    if (kv_events_) kv_events_->SetBeforeBatch(nullptr);
    kv_events_.reset();
    metrics_.RemoveCallbacks(this);
    stores_.Close(opts_.ssd_persist_on_stop);
  }

  int admin_port() const override { return admin_ ? admin_->port() : 0; }

 private:
  // The cluster key file, read first, so a missing or loose one stops the
  // start before anything is allocated.
  Status LoadClusterKeys() {
    ClusterOptions co = opts_.ClusterWithEndpoints(opts_.node_id);
    // Client tokens serve remote-mode clients and, with tenants, local
    // clients' tenant tokens: read even when standalone.
    if (!opts_.client_token_file.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(client_tokens_,
                              transport::LoadClientTokenFile(opts_.client_token_file));
      LogInfo("{} client token{} from {}", client_tokens_.size(),
              client_tokens_.size() == 1 ? "" : "s", opts_.client_token_file);
    }
    if (!co.enabled()) return Status::Ok();
    if (!opts_.cluster_key_file.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(cluster_keys_, transport::LoadClusterKeyFile(opts_.cluster_key_file));
      LogInfo("cluster: peer connections authenticated with {} key{} from {}{}",
              cluster_keys_.size(), cluster_keys_.size() == 1 ? "" : "s", opts_.cluster_key_file,
              co.transport.peer_encryption ? ", and encrypted" : "");
    }
    if (transport::UcxTcpPortUnpinned(getenv("UCX_TLS"), getenv("UCX_TCP_PORT_RANGE"))) {
      LogWarn(
          "cluster: UCX's own data port, beside the peer port, is not covered by the cluster "
          "key: over UCX's TCP transport whoever reaches it can write into this process. Pin it "
          "(UCX_TCP_PORT_RANGE) and let only the members reach it (docs/cluster.md, \"UCX's own "
          "port\")");
    }
    if (opts_.cluster_key_file.empty() && opts_.insecure &&
        !IsLoopbackAddress(co.transport.listen_host)) {
      LogWarn(
          "cluster: INSECURE: peer connections on {} are not authenticated (--insecure "
          "without --cluster-key-file): whoever reaches this port can read and write the "
          "cluster's values",
          co.transport.listen_host);
    }
    return Status::Ok();
  }

  Status LoadAdminToken() {
    if (!opts_.admin_enabled || opts_.admin_token_file.empty()) return Status::Ok();
    KVPOOL_ASSIGN_OR_RETURN(std::string text,
                            ReadSecretFile(opts_.admin_token_file, "admin token file"));
    std::vector<std::string> lines = SecretLines(text);
    std::string token = lines.empty() ? "" : lines.front();
    bool visible = std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c < 127; });
    if (token.size() < 16 || !visible) {
      return InvalidArgument(fmt::format(
          "admin token file {}: the token (its first line) must be at least 16 visible "
          "characters without spaces, e.g. openssl rand -hex 32",
          opts_.admin_token_file));
    }
    opts_.admin.bearer_token = token;
    return Status::Ok();
  }

  // The block descriptors of the node's own store (not the tenants'), and
  // KV events of what it holds.
  Status OpenEvents() {
    TieredStore* store = stores_.store();
    // With KV events on, the publisher's thread applies the table's changes
    // before each batch (SetBeforeBatch), so the table has no thread of its
    // own: what it applied sooner would wait in the publisher's queue
    // anyway, and on a small host every thread woken each round costs the
    // put path more than its CPU time (the block index's updates wait as
    // long).
    descriptors_ = std::make_unique<blocks::DescriptorTable>(
        opts_.descriptor_bytes, &metrics_,
        opts_.kv_events.enabled() ? std::chrono::microseconds(0)
                                  : blocks::DescriptorTable::kDefaultApplyInterval);
    store->SetHoldingsObserver(descriptors_.get(), HoldingsSlot::kBlocks);
    lookups_ = std::make_unique<PrefixLookups>(opts_.node_id, opts_.block_index,
                                               opts_.lookup_timeout, descriptors_.get(), &metrics_);
    if (!opts_.kv_events.enabled()) return Status::Ok();
    if (!opts_.kv_events_topics_file.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(opts_.kv_events.namespace_topics,
                              events::ReadNamespaceTopics(opts_.kv_events_topics_file));
    }
    KVPOOL_ASSIGN_OR_RETURN(kv_events_,
                            events::KvEventsPublisher::Start(opts_.kv_events, &metrics_));
    descriptors_->SetListeners(kv_events_.get(), nullptr);
    kv_events_->SetBeforeBatch([t = descriptors_.get()] { t->Sync(); });
    // What the SSD tier recovered is not streamed: listed (ListHeld; DRAM
    // holds nothing yet) before anyone can write (so no drop of an entry is
    // told before its listing). Reads the record headers: a large tier adds
    // seconds to the start.
    if (store->has_ssd_tier()) {
      uint64_t n = store->ListHeld(nullptr, [this](const KeyId& key, uint64_t, HoldingTier) {
        kv_events_->Recovered(key);
        return true;
      });
      LogInfo("kv events: {} entries recovered on SSD announced", n);
    }
    return Status::Ok();
  }

  // The cluster's services (cluster/cluster_services.h); none standalone.
  Status OpenCluster() {
    cluster::ClusterServicesOptions so;
    so.cluster = opts_.ClusterWithEndpoints(opts_.node_id);
    if (!so.cluster.enabled()) return Status::Ok();
    so.cluster.transport.cluster_keys = cluster_keys_;
    so.cluster.transport.client_tokens = client_tokens_;
    so.cluster.transport.registered_region = stores_.store()->segment();
    so.cluster.on_refused = [this](const Status& s) {
      if (on_fatal_) on_fatal_(s);
    };
    so.placement = opts_.placement;
    so.placement_max_inflight = opts_.placement_max_inflight;
    so.dram_capacity_bytes = opts_.dram.capacity_bytes;
    so.directory = opts_.directory;
    so.remote = opts_.remote;
    so.anti_entropy = opts_.anti_entropy;
    so.block_index = opts_.block_index;
    std::vector<cluster::ServicesTenant> tenants;
    for (const auto& t : stores_.tenants()) {
      tenants.push_back({t.spec.name, t.spec.tokens, t.store.get(), t.metrics.get()});
    }
    KVPOOL_ASSIGN_OR_RETURN(services_, cluster::ClusterServices::Open(
                                           so, stores_.store(), descriptors_.get(),
                                           kv_events_.get(), std::move(tenants), &metrics_,
                                           [this] { return views_.KeyFiguresJson().dump(); }));
    views_.set_cluster(services_->cluster());
    lookups_->set_index(services_->block_index(), services_->cluster()->address());
    return Status::Ok();
  }

  Status OpenLocal() {
    LocalServerOptions lo = opts_.local;
    lo.instance_id = instance_id_;
    lo.client_staging_bytes = opts_.writable_segment ? 0 : opts_.client_staging_bytes;
    lo.descriptors = descriptors_.get();
    lo.lookup_prefix = [this](std::vector<uint64_t> hashes, uint32_t timeout_ms,
                              LocalServerOptions::PrefixDone done) {
      lookups_->Start(std::move(hashes), timeout_ms, std::move(done));
    };
    std::vector<LocalTenant> tenants;
    for (size_t i = 0; i < stores_.tenants().size(); ++i) {
      const TenantStore& t = stores_.tenants()[i];
      ClusterFaces faces;
      if (services_) faces = {services_->tenant_reader(i), services_->tenant_placement(i)};
      tenants.push_back({t.spec, t.store.get(), t.token_secrets, faces});
    }
    KVPOOL_ASSIGN_OR_RETURN(
        local_,
        LocalServer::Open(
            lo, stores_.store(),
            services_ ? ClusterFaces{services_->reader(), services_->placement()} : ClusterFaces{},
            &metrics_, [this] { return views_.StatusJson(); }, std::move(tenants)));
    opts_.local.socket_path = local_->socket_path();  // the default resolved
    views_.set_local(local_.get());
    metrics_.AddCallbackGauge(
        "kvpool_uptime_seconds", "Seconds since the node started", {},
        [this] { return views_.UptimeSeconds(); }, this);
    metrics_.AddCallbackGauge("kvpool_build_info", "Build information (always 1)",
                              {{"version", KVPOOL_VERSION}}, [] { return 1.0; }, this);
    local_thread_ = std::thread([this] { local_->Run(); });
    return Status::Ok();
  }

  Status OpenAdmin() {
    if (!opts_.admin_enabled) return Status::Ok();
    AdminHooks hooks;
    hooks.status_json = [this] { return views_.StatusJson(); };
    hooks.config_json = [this] { return config_json_; };
    hooks.members_json = [this] { return views_.MembersJson().dump(); };
    hooks.clients_json = [this] { return views_.ClientsJson().dump(); };
    hooks.cluster_json = [this] { return views_.ClusterJson().dump(); };
    hooks.lookup = [this](const std::string& body) { return lookups_->Http(body); };
    hints_ = std::make_unique<HintsApi>(
        &stores_,
        [this](int tenant) -> RemoteReads* {
          if (!services_) return nullptr;
          return tenant < 0 ? services_->reader()
                            : services_->tenant_reader(static_cast<size_t>(tenant));
        },
        &metrics_);
    hooks.hints = [this](const std::string& body) { return hints_->Http(body); };
    hooks.ready = [this] { return !stopping_.load(); };
    hooks.cluster_missing = [this] { return views_.ClusterMissing(); };
    if (!stores_.tenants().empty()) {
      // Tenants do not see each other's figures or clients over HTTP either.
      AdminHooks::Untokened u;
      u.status_json = [this] { return views_.AggregateStatusJson(); };
      u.clients_json = [this] {
        return nlohmann::ordered_json{{"clients", nlohmann::ordered_json::array()},
                                      {"count", local_ ? local_->connections() : 0},
                                      {"hidden", NodeViews::kDetailsNeedToken}}
            .dump();
      };
      // Each tenant's series, and the default tenant's store figures (the
      // node's sum minus them would be the other tenants').
      u.metric_line_visible = [](std::string_view line) {
        for (std::string_view hidden : {"kvpool_tenant_", "tenant=\"", "kvpool_dram_",
                                        "kvpool_ssd_", "kvpool_tier_"}) {
          if (line.find(hidden) != std::string_view::npos) return false;
        }
        return true;
      };
      u.history_hidden = {"dram_used_bytes", "ssd_used_bytes", "evictions_per_s"};
      hooks.untokened = std::move(u);
      if (opts_.admin_token_file.empty()) {
        LogWarn("admin: tenants without --admin-token-file: the admin endpoint shows aggregate "
                "figures only (give it a token to see each tenant's and the clients)");
      }
    }
    KVPOOL_ASSIGN_OR_RETURN(admin_, AdminServer::Start(opts_.admin, &metrics_, std::move(hooks)));
    return Status::Ok();
  }
  NodeOptions opts_;
  const std::string config_json_;
  const std::function<void(const Status&)> on_fatal_;
  const uint64_t instance_id_;
  MetricsRegistry metrics_;  // outlives every component below
  std::atomic<bool> stopping_{false};
  NodeStores stores_;  // the default tenant's store and the tenants'
  NodeViews views_;
  std::vector<transport::ClusterKey> cluster_keys_;   // from --cluster-key-file
  std::vector<transport::ClusterKey> client_tokens_;  // from --client-token-file
  std::unique_ptr<blocks::DescriptorTable> descriptors_;
  std::unique_ptr<events::KvEventsPublisher> kv_events_;  // null unless configured
  std::unique_ptr<PrefixLookups> lookups_;
  std::unique_ptr<HintsApi> hints_;                     // POST /api/v1/hints
  std::unique_ptr<cluster::ClusterServices> services_;  // null when standalone
  std::unique_ptr<LocalServer> local_;
  std::unique_ptr<AdminServer> admin_;
  std::thread local_thread_;  // the local socket server's event loop
  std::mutex stop_mu_;
  bool stopped_ = false;  // protected by stop_mu_
};

}  // namespace

Result<std::unique_ptr<Node>> Node::Start(const NodeOptions& options, std::string config_json,
                                          std::function<void(const Status&)> on_fatal) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto node = std::make_unique<NodeImpl>(options, std::move(config_json), std::move(on_fatal));
  KVPOOL_RETURN_IF_ERROR(node->Open());
  return std::unique_ptr<Node>(std::move(node));
}

}  // namespace kvpool
