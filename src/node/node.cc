#include "node/node.h"

#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "admin/admin_server.h"
#include "blocks/descriptor_table.h"
#include "cluster/anti_entropy.h"
#include "cluster/cluster.h"
#include "cluster/directory.h"
#include "cluster/holdings_announcer.h"
#include "cluster/peer_server.h"
#include "cluster/remote_reader.h"
#include "common/executor.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/secret_file.h"
#include "events/kv_events.h"
#include "node/local_server.h"
#include "node/prefix_lookup.h"
#include "node/tenants.h"
#include "store/tiered_store.h"

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

class NodeImpl final : public Node {
 public:
  NodeImpl(const NodeOptions& o, std::string config_json,
           std::function<void(const Status&)> on_fatal)
      : opts_(o),
        config_json_(std::move(config_json)),
        on_fatal_(std::move(on_fatal)),
        started_(std::chrono::steady_clock::now()) {
    if (opts_.node_id.empty()) opts_.node_id = HostName();
    instance_id_ = NewInstanceId();
  }
  ~NodeImpl() override { Stop(); }

  // Start-up, in order; Stop undoes it in reverse.
  Status Open() {
    KVPOOL_RETURN_IF_ERROR(LoadClusterKeys());
    KVPOOL_RETURN_IF_ERROR(LoadAdminToken());
    KVPOOL_RETURN_IF_ERROR(LoadTenants());
    OpenPools();
    KVPOOL_RETURN_IF_ERROR(OpenStore());
    KVPOOL_RETURN_IF_ERROR(OpenTenantStores());
    KVPOOL_RETURN_IF_ERROR(OpenEvents());
    KVPOOL_RETURN_IF_ERROR(OpenCluster());
    KVPOOL_RETURN_IF_ERROR(OpenLocal());
    KVPOOL_RETURN_IF_ERROR(OpenAdmin());
    DramStats st = tiered_->GetDramStats();
    LogInfo("node {} serving: socket {} dram {} ({} pages){}", opts_.node_id,
            opts_.local.socket_path, SettingsTable::FormatBytes(st.capacity_bytes),
            st.huge_pages ? "huge" : "4KiB",
            admin_ ? fmt::format(" admin http://{}:{}", opts_.admin.bind_address, admin_->port())
                   : std::string());
    return Status::Ok();
  }

  void Stop() override {
    std::lock_guard lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_.store(true);
    StopAdmin();
    StopLocal();  // no new requests; the server goes after the cluster
    StopCluster();
    DestroyLocal();
    StopEvents();
    CloseStore();
    StopPools();
  }

  int admin_port() const override { return admin_ ? admin_->port() : 0; }

 private:
  // A router's prefix lookup: the cluster's block index, or this node's
  // own descriptors when standalone. Blocks up to the timeout.
  Result<blocks::PrefixAnswer> LookupPrefix(std::span<const uint64_t> hashes,
                                            std::chrono::milliseconds timeout) {
    if (block_index_) return block_index_->Lookup(hashes, timeout);
    return LocalPrefix(hashes);
  }
  // What this node itself holds of the blocks (its descriptors).
  Result<blocks::PrefixAnswer> LocalPrefix(std::span<const uint64_t> hashes) {
    if (hashes.size() > opts_.block_index.max_hashes) {
      return InvalidArgument(fmt::format("a prefix lookup carries at most {} hashes, not {}",
                                         opts_.block_index.max_hashes, hashes.size()));
    }
    std::vector<uint8_t> tiers(hashes.size());
    descriptors_->Tiers(hashes, tiers.data());
    blocks::PrefixHolder self;
    self.node_id = opts_.node_id;
    if (cluster_) self.address = cluster_->address();
    std::vector<std::pair<blocks::PrefixHolder, std::vector<uint8_t>>> nodes;
    nodes.emplace_back(std::move(self), std::move(tiers));
    return blocks::BuildPrefixAnswer(static_cast<uint32_t>(hashes.size()), std::move(nodes));
  }

  void OpenPools() {
    io_pool_ = std::make_unique<ThreadPool>(opts_.io_threads, "kvpool-io");
    // Region flushes get their own threads: a promotion waiting for DRAM
    // room may wait for a demotion, which waits for a flush.
    flush_pool_ = std::make_unique<ThreadPool>(opts_.flush_threads, "kvpool-flush");
  }
  void StopPools() {
    // The io pool stopped in DestroyLocal (its promotions reach the server).
    if (flush_pool_) flush_pool_->Stop();
    io_pool_.reset();
    flush_pool_.reset();
  }

  // --kv-events-topics-file: NAMESPACE=TOPIC lines (the last '=' splits;
  // blank lines and lines starting with # are skipped).
  static Result<std::map<uint32_t, std::string>> ReadNamespaceTopics(const std::string& path) {
    std::ifstream in(path);
    if (!in) return IOError(fmt::format("kv events topics file {}: cannot read it", path));
    std::map<uint32_t, std::string> out;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      const size_t eq = line.rfind('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == line.size()) {
        return InvalidArgument(fmt::format(
            "kv events topics file {} line {}: want NAMESPACE=TOPIC, got '{}'", path, n, line));
      }
      const std::string topic = line.substr(eq + 1);
      if (!events::ValidTopic(topic)) {
        return InvalidArgument(fmt::format(
            "kv events topics file {} line {}: topic '{}': a kv@ topic is kv@<pod>@<model>",
            path, n, topic));
      }
      out[NamespaceTag(line.substr(0, eq))] = topic;
    }
    return out;
  }

  // The block descriptors of the node's own store (not the tenants'), and
  // KV events of what it holds.
  Status OpenEvents() {
    // The table applies its changes as often as the publisher batches:
    // what it applies sooner waits in the publisher's queue anyway, and
    // each round wakes a thread (the block index's updates wait as long).
    descriptors_ = std::make_unique<blocks::DescriptorTable>(
        opts_.descriptor_bytes, &metrics_,
        opts_.kv_events.enabled() ? std::chrono::microseconds(opts_.kv_events.batch_interval)
                                  : blocks::DescriptorTable::kDefaultApplyInterval);
    tiered_->SetHoldingsObserver(descriptors_.get(), HoldingsSlot::kBlocks);
    if (!opts_.kv_events.enabled()) return Status::Ok();
    opts_.kv_events.encoding =
        opts_.kv_events_encoding == "array" ? events::Encoding::kArray : events::Encoding::kMap;
    opts_.kv_events.hash_type = opts_.kv_events_hash == "bytes" ? events::HashType::kBytes
                                : opts_.kv_events_hash == "as-written"
                                    ? events::HashType::kAsWritten
                                    : events::HashType::kInt64;
    if (!opts_.kv_events_topics_file.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(opts_.kv_events.namespace_topics,
                              ReadNamespaceTopics(opts_.kv_events_topics_file));
    }
    opts_.kv_events.replay_framing = opts_.kv_events_replay_frames == "2"
                                         ? events::ReplayFraming::kTwoFrames
                                         : events::ReplayFraming::kThreeFrames;
    KVPOOL_ASSIGN_OR_RETURN(kv_events_, events::KvEventsPublisher::Start(opts_.kv_events,
                                                                         &metrics_));
    descriptors_->SetListeners(kv_events_.get(), nullptr);
    // What the SSD tier recovered is not streamed: listed (ListHeld; DRAM
    // holds nothing yet) before anyone can
    // write (so no drop of an entry is told before its listing). Reads the
    // record headers: a large tier adds seconds to the start.
    if (tiered_->has_ssd_tier()) {
      uint64_t n = tiered_->ListHeld(nullptr, [this](const KeyId& key, uint64_t, HoldingTier) {
        kv_events_->Recovered(key);
        return true;
      });
      LogInfo("kv events: {} entries recovered on SSD announced", n);
    }
    return Status::Ok();
  }
  void StopEvents() {
    if (!descriptors_) return;
    tiered_->SetHoldingsObserver(nullptr, HoldingsSlot::kBlocks);
    descriptors_->SetListeners(nullptr, nullptr);
    kv_events_.reset();
  }

  Status OpenStore() {
    std::optional<SsdOptions> so;
    if (!opts_.ssd_dirs.empty()) so = opts_.SsdWithDirs();
    opts_.dram.seal_client_writes = !opts_.writable_segment;
    KVPOOL_ASSIGN_OR_RETURN(
        tiered_, TieredStore::Open(opts_.DramFor(opts_.dram.capacity_bytes), so ? &*so : nullptr,
                                   io_pool_.get(), flush_pool_.get(), opts_.tiering, &metrics_));
    return Status::Ok();
  }
  void CloseStore() {
    metrics_.RemoveCallbacks(this);
    CloseTiers(tiered_.get(), kDefaultTenant);
    for (auto& t : tenants_) CloseTiers(t.store.get(), t.spec.name);
    tenants_.clear();
    tiered_.reset();
  }
  void CloseTiers(TieredStore* store, const std::string& tenant) {
    if (store == nullptr || !store->has_ssd_tier()) return;
    if (opts_.ssd_persist_on_stop) {
      // A clean stop keeps the whole cache: DRAM goes to SSD first.
      uint64_t n = store->DemoteAll();
      LogInfo("tenant {}: wrote {} DRAM entries to the SSD tier before stopping", tenant, n);
    }
    Status s = store->Close();  // flush and checkpoint: a warm restart
    if (!s.ok()) LogWarn("tenant {}: ssd tier close: {}", tenant, s.ToString());
  }

  // The tenants file, read before anything is allocated.
  Status LoadTenants() {
    if (opts_.tenants_file.empty()) return Status::Ok();
    KVPOOL_ASSIGN_OR_RETURN(auto specs, LoadTenantsFile(opts_.tenants_file));
    for (const auto& t : specs) {
      if (t.ssd_bytes > 0 && opts_.ssd_dirs.empty()) {
        return InvalidArgument(fmt::format(
            "tenants file {}: tenant '{}' has an SSD quota but the node has no SSD tier "
            "(--ssd-dirs)",
            opts_.tenants_file, t.name));
      }
      TenantStore ts{t, nullptr, nullptr, {}, nullptr, nullptr, nullptr};
      for (const auto& token : t.tokens) {
        auto k = std::find_if(client_tokens_.begin(), client_tokens_.end(),
                              [&](const transport::ClusterKey& c) { return c.principal == token; });
        if (k == client_tokens_.end()) {
          LogWarn("tenant {}: token '{}' is not in --client-token-file; no client can use it",
                  t.name, token);
          continue;
        }
        ts.token_secrets[token] = k->bytes;
      }
      tenants_.push_back(std::move(ts));
    }
    return Status::Ok();
  }

  // Each tenant's own store: a segment of its DRAM quota and, with an SSD
  // quota, a directory "tenant-NAME" under each SSD directory. Its figures
  // are kept in its own registry and exported per tenant.
  Status OpenTenantStores() {
    for (auto& t : tenants_) {
      DramOptions d = opts_.DramFor(t.spec.dram_bytes);
      std::optional<SsdOptions> so;
      if (t.spec.ssd_bytes > 0) {
        so = opts_.SsdWithDirs();
        so->capacity_bytes = t.spec.ssd_bytes;
        for (auto& dir : so->dirs) {
          dir += "/tenant-" + t.spec.name;
          if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
            return Internal(fmt::format("tenant {}: mkdir {}: {}", t.spec.name, dir,
                                        std::strerror(errno)));
          }
        }
      }
      t.metrics = std::make_unique<MetricsRegistry>();
      auto store = TieredStore::Open(d, so ? &*so : nullptr, io_pool_.get(), flush_pool_.get(),
                                     opts_.tiering, t.metrics.get());
      if (!store.ok()) {
        return Status(store.status().code(),
                      fmt::format("tenant {}: {}", t.spec.name, store.status().message()));
      }
      t.store = std::move(store).value();
      LogInfo("tenant {}: dram {}{}", t.spec.name, SettingsTable::FormatBytes(t.spec.dram_bytes),
              so ? " ssd " + SettingsTable::FormatBytes(t.spec.ssd_bytes) : std::string());
    }
    AddTenantGauges(kDefaultTenant, tiered_.get());
    for (auto& t : tenants_) AddTenantGauges(t.spec.name, t.store.get());
    return Status::Ok();
  }
  void AddTenantGauges(const std::string& name, TieredStore* store) {
    Labels l = {{"tenant", name}};
    auto dram = [store](uint64_t DramStats::*f) {
      return [store, f] { return static_cast<double>(store->GetDramStats().*f); };
    };
    metrics_.AddCallbackGauge("kvpool_tenant_dram_capacity_bytes",
                              "DRAM quota (segment), per tenant", l,
                              dram(&DramStats::capacity_bytes), this);
    metrics_.AddCallbackGauge("kvpool_tenant_dram_used_bytes", "DRAM bytes of values, per tenant",
                              l, dram(&DramStats::used_bytes), this);
    metrics_.AddCallbackGauge("kvpool_tenant_dram_entries", "DRAM entries, per tenant", l,
                              dram(&DramStats::entries), this);
    metrics_.AddCallbackGauge("kvpool_tenant_dram_evictions",
                              "DRAM entries evicted since start, per tenant", l,
                              dram(&DramStats::evictions), this);
    if (!store->has_ssd_tier()) return;
    auto ssd = [store](uint64_t SsdStats::*f) {
      return [store, f] { return static_cast<double>(store->GetSsdStats().*f); };
    };
    metrics_.AddCallbackGauge("kvpool_tenant_ssd_capacity_bytes", "SSD quota, per tenant", l,
                              ssd(&SsdStats::capacity_bytes), this);
    metrics_.AddCallbackGauge("kvpool_tenant_ssd_used_bytes", "SSD bytes used, per tenant", l,
                              ssd(&SsdStats::used_bytes), this);
    metrics_.AddCallbackGauge("kvpool_tenant_ssd_entries", "SSD entries, per tenant", l,
                              ssd(&SsdStats::entries), this);
  }

  // Membership, the peer transport and the services over them: the
  // directory, the holdings announcer (publishing and placement), the peer
  // server, anti-entropy and remote reads. Nothing when standalone.
  // Reads the cluster key file first, so a missing or loose one stops the
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
              co.peer_encryption ? ", and encrypted" : "");
    }
    if (opts_.cluster_key_file.empty() && opts_.insecure && !IsLoopbackAddress(co.peer_address)) {
      LogWarn("cluster: INSECURE: peer connections on {} are not authenticated (--insecure "
              "without --cluster-key-file): whoever reaches this port can read and write the "
              "cluster's values",
              co.peer_address);
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

  Status OpenCluster() {
    ClusterOptions co = opts_.ClusterWithEndpoints(opts_.node_id);
    if (!co.enabled()) return Status::Ok();
    co.cluster_keys = cluster_keys_;
    co.client_tokens = client_tokens_;
    co.registered_region = tiered_->segment();
    co.on_refused = [this](const Status& s) {
      if (on_fatal_) on_fatal_(s);
    };
    peer_pool_ = std::make_unique<ThreadPool>(2, "kvpool-peer");
    KVPOOL_ASSIGN_OR_RETURN(cluster_, Cluster::Open(co, peer_pool_.get(), &metrics_));
    // The admin cluster view asks every member for its key figures.
    cluster_->transport()->RegisterHandler(
        cluster::kPeerStatus, [this](transport::Incoming, transport::Responder r) {
          const std::string j = KeyFiguresJson().dump();
          r.Respond(Status::Ok(), std::vector<uint8_t>(j.begin(), j.end()));
        });
    cluster_thread_ = std::thread([this] { cluster_->Run(); });
    directory_ = std::make_unique<cluster::Directory>(opts_.directory, &metrics_);
    cluster::HoldingsAnnouncerOptions ao;
    if (opts_.placement == "home" || opts_.placement == "chain") {
      cluster::HomePlacerOptions po;
      po.by_chain = opts_.placement == "chain";
      po.timeout = opts_.remote.fetch_timeout;
      // At most a quarter of DRAM pinned for hand-offs: the rest stays evictable.
      po.max_inflight_bytes = std::min(opts_.placement_max_inflight, opts_.dram.capacity_bytes / 4);
      ao.placement = po;
    }
    announcer_ = std::make_unique<cluster::HoldingsAnnouncer>(
        ao, cluster_.get(), directory_.get(), tiered_.get(), peer_pool_.get(), &metrics_);
    // SSD inventory listings read the device for seconds: their own thread.
    if (tiered_->has_ssd_tier()) list_pool_ = std::make_unique<ThreadPool>(1, "kvpool-list");
    cluster::ClientTenants client_tenants;
    for (auto& t : tenants_) {
      for (const auto& token : t.spec.tokens) {
        client_tenants.emplace(token,
                               cluster::ClientTenant{t.store.get(), TenantKeys(t.spec.name)});
      }
    }
    // Each tenant is one tenant across the cluster (every node that defines
    // it): a directory, an announcer and a reader of its own, over its store,
    // their figures in its registry.
    cluster::ClusterTenants cluster_tenants;
    for (auto& t : tenants_) {
      t.directory = std::make_unique<cluster::Directory>(opts_.directory, t.metrics.get());
      cluster::HoldingsAnnouncerOptions tao = ao;
      tao.publish.tenant = t.spec.name;
      if (tao.placement) tao.placement->tenant = t.spec.name;
      t.announcer = std::make_unique<cluster::HoldingsAnnouncer>(
          tao, cluster_.get(), t.directory.get(), t.store.get(), peer_pool_.get(), t.metrics.get());
      cluster_tenants.emplace(t.spec.name, cluster::ClusterTenant{t.store.get(), t.directory.get(),
                                                                  t.announcer.get()});
    }
    peer_server_ = std::make_unique<cluster::PeerServer>(
        cluster_.get(), directory_.get(), announcer_.get(), tiered_.get(), peer_pool_.get(),
        list_pool_.get(), &metrics_, std::move(client_tenants), std::move(cluster_tenants));
    // Routers' prefix lookups: the engine blocks this node holds, at their
    // index keys' homes.
    block_index_ = std::make_unique<cluster::BlockIndex>(
        opts_.block_index, cluster_.get(), descriptors_.get(), peer_pool_.get(), &metrics_);
    descriptors_->SetListeners(kv_events_.get(), block_index_.get());
    block_index_->Start();
    anti_entropy_ = std::make_unique<cluster::AntiEntropy>(
        opts_.anti_entropy, cluster_.get(), directory_.get(), announcer_.get(), tiered_.get(),
        &metrics_);
    anti_entropy_->Start();
    cluster::RemoteReaderOptions ro = opts_.remote;
    using Replicas = cluster::RemoteReaderOptions::Replicas;
    ro.replicas = opts_.read_replicas == "all"    ? Replicas::kAll
                  : opts_.read_replicas == "none" ? Replicas::kNone
                                                  : Replicas::kRepeat;
    // Placement home: a put's values are findable once their homes store
    // them (a home publishes what is placed on it before it answers); the
    // writer's interim copies are left to the schedule.
    if (opts_.placement != "home") {
      ro.publish_now = [announcer = announcer_.get()] { announcer->FlushNow(); };
    }
    if (opts_.placement == "chain") {
      ro.replicas = Replicas::kNone;
      ro.chain_placer = announcer_->placer();
    }
    reader_ = std::make_unique<cluster::RemoteReader>(ro, cluster_.get(), directory_.get(),
                                                      tiered_.get(), peer_pool_.get(), &metrics_);
    announcer_->Start();
    for (auto& t : tenants_) {
      cluster::RemoteReaderOptions tro = ro;
      tro.tenant = t.spec.name;
      if (opts_.placement != "home") {
        tro.publish_now = [announcer = t.announcer.get()] { announcer->FlushNow(); };
      }
      if (opts_.placement == "chain") tro.chain_placer = t.announcer->placer();
      t.reader = std::make_unique<cluster::RemoteReader>(tro, cluster_.get(), t.directory.get(),
                                                         t.store.get(), peer_pool_.get(),
                                                         t.metrics.get());
      t.announcer->Start();
    }
    return Status::Ok();
  }
  void StopCluster() {
    if (!cluster_) return;
    // Leave the cluster. Destroying it fails the peer calls in flight, whose
    // callbacks may still reach the local server, so that goes later.
    descriptors_->SetListeners(kv_events_.get(), nullptr);
    block_index_->Stop();
    announcer_->Stop();
    reader_->Stop();
    for (auto& t : tenants_) {
      if (t.announcer) t.announcer->Stop();
      if (t.reader) t.reader->Stop();
    }
    anti_entropy_->Stop();
    cluster_->Stop();
    if (cluster_thread_.joinable()) cluster_thread_.join();
    peer_pool_->Stop();
    cluster_.reset();
    anti_entropy_.reset();
    peer_server_.reset();
    block_index_.reset();
    if (list_pool_) list_pool_->Stop();  // queued listings return at once now
    reader_.reset();
    announcer_.reset();  // after the transport: the placer's callbacks use it
    directory_.reset();
    for (auto& t : tenants_) {
      t.reader.reset();
      t.announcer.reset();
      t.directory.reset();
    }
  }

  Status OpenLocal() {
    LocalServerOptions lo = opts_.local;
    lo.instance_id = instance_id_;
    lo.client_staging_bytes = opts_.writable_segment ? 0 : opts_.client_staging_bytes;
    lo.descriptors = descriptors_.get();
    lookup_pool_ = std::make_unique<ThreadPool>(1, "kvpool-lookup");
    lo.lookup_prefix = [this](std::vector<uint64_t> hashes, uint32_t timeout_ms,
                              LocalServerOptions::PrefixDone done) {
      lookup_pool_->Submit([this, hashes = std::move(hashes), timeout_ms, done = std::move(done)] {
        auto timeout = timeout_ms == 0 ? opts_.lookup_timeout
                                       : std::chrono::milliseconds(std::min(timeout_ms, 10000u));
        auto a = LookupPrefix(hashes, timeout);
        if (!a.ok()) return done(a.status(), "");
        done(Status::Ok(), PrefixAnswerJson(*a));
      });
    };
    std::vector<LocalTenant> tenants;
    for (auto& t : tenants_) {
      tenants.push_back({t.spec, t.store.get(), t.token_secrets, t.reader.get()});
    }
    KVPOOL_ASSIGN_OR_RETURN(local_, LocalServer::Open(lo, tiered_.get(), reader_.get(), &metrics_,
                                                      [this] { return StatusJson(); },
                                                      std::move(tenants)));
    opts_.local.socket_path = local_->socket_path();  // the default resolved
    metrics_.AddCallbackGauge("kvpool_uptime_seconds", "Seconds since the node started", {},
                              [this] { return UptimeSeconds(); }, this);
    metrics_.AddCallbackGauge("kvpool_build_info", "Build information (always 1)",
                              {{"version", KVPOOL_VERSION}}, [] { return 1.0; }, this);
    local_thread_ = std::thread([this] { local_->Run(); });
    return Status::Ok();
  }
  // Stops serving clients. The server itself lives until the cluster is
  // gone (peer callbacks in flight reach it): DestroyLocal, after the
  // promotions that call back into it.
  void StopLocal() {
    if (!local_) return;
    local_->Stop();
    if (local_thread_.joinable()) local_thread_.join();
    // Lookups in flight use the cluster's index: done before it goes.
    if (lookup_pool_) lookup_pool_->Stop();
  }
  void DestroyLocal() {
    if (io_pool_) io_pool_->Stop();  // promotions in flight call back into the server
    local_.reset();
  }

  Status OpenAdmin() {
    if (!opts_.admin_enabled) return Status::Ok();
    AdminHooks hooks;
    hooks.status_json = [this] { return StatusJson(); };
    hooks.config_json = [this] { return config_json_; };
    hooks.members_json = [this] { return MembersJson().dump(); };
    hooks.clients_json = [this] { return ClientsJson().dump(); };
    hooks.cluster_json = [this] { return ClusterJson().dump(); };
    lookup_refused_ = metrics_.GetCounter(
        "kvpool_lookup_refused_total",
        "Prefix lookups refused (a malformed body, too many hashes), answered 400");
    hooks.lookup = [this](const std::string& body) -> std::pair<int, std::string> {
      auto req = ParsePrefixRequest(body, opts_.block_index.max_hashes);
      auto error = [](int code, const Status& s) {
        return std::make_pair(code, nlohmann::json{{"error", s.message()}}.dump());
      };
      if (!req.ok()) {
        lookup_refused_->Inc();
        return error(400, req.status());
      }
      auto a = req->local ? LocalPrefix(req->hashes)
                          : LookupPrefix(req->hashes, req->timeout.value_or(opts_.lookup_timeout));
      if (!a.ok()) {
        const bool bad = a.status().code() == StatusCode::kInvalidArgument;
        if (bad) lookup_refused_->Inc();
        return error(bad ? 400 : 503, a.status());
      }
      return {200, PrefixAnswerJson(*a)};
    };
    hooks.ready = [this] { return !stopping_.load(); };
    hooks.cluster_missing = [this] { return ClusterMissing(); };
    if (!tenants_.empty()) {
      // Tenants do not see each other's figures or clients over HTTP either.
      AdminHooks::Untokened u;
      u.status_json = [this] { return AggregateStatusJson(); };
      u.clients_json = [this] {
        return nlohmann::ordered_json{{"clients", nlohmann::ordered_json::array()},
                                      {"count", local_ ? local_->connections() : 0},
                                      {"hidden", kDetailsNeedToken}}
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
  void StopAdmin() {
    if (admin_) admin_->Stop();
    admin_.reset();
  }

 private:
  double UptimeSeconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }

  // What keeps this node from cluster work; empty when nothing does (or
  // standalone).
  std::string ClusterMissing() const {
    if (!cluster_) return "";
    if (cluster_->joining()) return "joining: " + cluster_->joining_reason();
    if (cluster_->fenced()) return "fenced: its membership lease could not be renewed in time";
    return "";
  }

  // Local work is served from the start; cluster work once membership
  // admits this incarnation.
  nlohmann::ordered_json ReadinessJson() const {
    const char* cluster = !cluster_             ? "standalone"
                          : cluster_->joining() ? "joining"
                          : cluster_->fenced()  ? "fenced"
                                                : "ready";
    return {{"local", local_ != nullptr && !stopping_.load() ? "ready" : "not ready"},
            {"cluster", cluster},
            {"detail", ClusterMissing()}};
  }

  std::string StatusJson() const { return StatusObject().dump(); }

  // What a request without the admin token sees on a node with tenants
  // (AdminHooks::untokened): the node's figures summed over every tenant's
  // store, and no tenant's or client's own.
  std::string AggregateStatusJson() const {
    nlohmann::ordered_json j = StatusObject();
    uint64_t cap = 0, used = 0, entries = 0, evictions = 0;
    uint64_t ssd_cap = 0, ssd_used = 0, ssd_entries = 0;
    bool any_ssd = false;
    auto add = [&](const TieredStore* store) {
      DramStats d = store->GetDramStats();
      cap += d.capacity_bytes;
      used += d.used_bytes;
      entries += d.entries;
      evictions += d.evictions;
      if (!store->has_ssd_tier()) return;
      SsdStats st = store->GetSsdStats();
      any_ssd = true;
      ssd_cap += st.capacity_bytes;
      ssd_used += st.used_bytes;
      ssd_entries += st.entries;
    };
    add(tiered_.get());
    for (const auto& t : tenants_) add(t.store.get());
    j["dram"] = {{"capacity_bytes", cap},
                 {"used_bytes", used},
                 {"entries", entries},
                 {"evictions", evictions}};
    j["ssd"] = any_ssd ? nlohmann::ordered_json{{"capacity_bytes", ssd_cap},
                                                {"used_bytes", ssd_used},
                                                {"entries", ssd_entries}}
                       : nlohmann::ordered_json();
    j["tenants"] = nlohmann::ordered_json::array();
    j["tenants_hidden"] = kDetailsNeedToken;
    return j.dump();
  }
  static constexpr const char* kDetailsNeedToken =
      "this node serves tenants: each tenant's figures and the connected clients are shown "
      "only with the admin token (--admin-token-file)";

  nlohmann::ordered_json StatusObject() const {
    DramStats st = tiered_->GetDramStats();
    nlohmann::ordered_json classes = nlohmann::ordered_json::array();
    for (const auto& c : st.classes) {
      if (c.slabs == 0) continue;
      classes.push_back({{"slot_bytes", c.slot_bytes}, {"slabs", c.slabs}, {"entries", c.entries}});
    }
    nlohmann::ordered_json j = {
        {"node_id", opts_.node_id},
        {"version", KVPOOL_VERSION},
        {"instance_id", fmt::format("{:016x}", instance_id_)},
        {"uptime_s", UptimeSeconds()},
        {"socket_path", opts_.local.socket_path},
        {"local_connections", local_ ? local_->connections() : 0},
        {"dram",
         {{"capacity_bytes", st.capacity_bytes},
          {"used_bytes", st.used_bytes},
          {"allocated_bytes", st.allocated_bytes},
          {"entries", st.entries},
          {"pinned", st.pinned},
          {"reserved", st.reserved},
          {"evictions", st.evictions},
          {"slab_moves", st.slab_moves},
          {"index_bytes", st.index_bytes},
          {"index_bytes_per_entry", st.index_bytes_per_entry},
          {"huge_pages", st.huge_pages},
          {"classes", classes}}},
        {"ssd", SsdJson()},
        {"tenants", TenantsJson()},
        {"members", MembersJson()["members"]},
        {"membership",
         {{"fenced", cluster_ != nullptr && cluster_->fenced()},
          {"joining", cluster_ != nullptr && cluster_->joining()},
          {"etcd_outage", cluster_ != nullptr && cluster_->etcd_outage()}}},
        {"readiness", ReadinessJson()},
    };
    return j;
  }

  // This node's key figures, as every member's row of the cluster view
  // shows them (kept under kPeerStatus's size limit).
  nlohmann::ordered_json KeyFiguresJson() const {
    // The node's figures: with tenants, summed over every tenant's store.
    DramStats d = tiered_->GetDramStats();
    for (const auto& t : tenants_) {
      DramStats td = t.store->GetDramStats();
      d.capacity_bytes += td.capacity_bytes;
      d.used_bytes += td.used_bytes;
      d.entries += td.entries;
      d.evictions += td.evictions;
    }
    auto total = [this](const char* name) {
      const double v = metrics_.SumOf(name);
      return v < 0 ? 0.0 : v;
    };
    const double hit_1m = metrics_.ValueOf("kvpool_hit_ratio_recent", {{"window", "1m"}});
    nlohmann::ordered_json ssd = nullptr;
    if (tiered_->has_ssd_tier()) {
      SsdStats s = tiered_->GetSsdStats();
      for (const auto& t : tenants_) {
        if (!t.store->has_ssd_tier()) continue;
        SsdStats ts = t.store->GetSsdStats();
        s.capacity_bytes += ts.capacity_bytes;
        s.used_bytes += ts.used_bytes;
        s.entries += ts.entries;
      }
      ssd = {{"capacity_bytes", s.capacity_bytes},
             {"used_bytes", s.used_bytes},
             {"entries", s.entries}};
    }
    return {{"node_id", opts_.node_id},
            {"version", KVPOOL_VERSION},
            {"uptime_s", UptimeSeconds()},
            {"dram",
             {{"capacity_bytes", d.capacity_bytes},
              {"used_bytes", d.used_bytes},
              {"entries", d.entries},
              {"evictions", d.evictions}}},
            {"ssd", ssd},
            {"local_connections", local_ ? local_->connections() : 0},
            {"ops", total("kvpool_ops_total")},
            {"hits", total("kvpool_hits_total")},
            {"misses", total("kvpool_misses_total")},
            {"hit_ratio_1m", std::isfinite(hit_1m) && hit_1m >= 0 ? nlohmann::ordered_json(hit_1m)
                                                                  : nlohmann::ordered_json()},
            {"bytes_read", total("kvpool_bytes_read_total")},
            {"bytes_written", total("kvpool_bytes_written_total")},
            {"fenced", cluster_ != nullptr && cluster_->fenced()}};
  }

  // Every member's key figures side by side: this node's own, the others'
  // asked for over the peer transport (kPeerStatus, all at once, 1 s at
  // most); a member that does not answer is listed with the error.
  nlohmann::ordered_json ClusterJson() const {
    nlohmann::ordered_json members = nlohmann::ordered_json::array();
    if (!cluster_) {
      nlohmann::ordered_json self = KeyFiguresJson();
      self["address"] = opts_.local.socket_path;
      self["self"] = true;
      members.push_back(std::move(self));
      return {{"cluster", nullptr}, {"members", members}};
    }
    auto view = cluster_->view();
    std::map<std::string, transport::Reply> replies;
    for (auto& r : cluster_->AskOtherMembers(
             cluster::kPeerStatus, transport::SteadyClock::now() + std::chrono::seconds(1))) {
      replies[r.member.node_id] = std::move(r.reply);
    }
    for (const Member& m : view->members) {
      nlohmann::ordered_json row;
      auto it = replies.find(m.node_id);
      if (m.node_id == opts_.node_id) {
        row = KeyFiguresJson();
      } else if (it == replies.end()) {
        row = {{"node_id", m.node_id}, {"error", "joined after the request"}};
      } else if (!it->second.status.ok()) {
        row = {{"node_id", m.node_id}, {"error", it->second.status.ToString()}};
      } else if (it->second.header.size() > cluster::kMaxStatusBytes ||
                 (row = nlohmann::ordered_json::parse(it->second.header.begin(),
                                                      it->second.header.end(), nullptr,
                                                      /*allow_exceptions=*/false))
                     .is_discarded() ||
                 !row.is_object()) {
        row = {{"node_id", m.node_id}, {"error", "malformed status reply"}};
      }
      row["address"] = m.address;
      row["self"] = m.node_id == opts_.node_id;
      members.push_back(std::move(row));
    }
    return {{"cluster", opts_.cluster.cluster}, {"members", members}};
  }

  // The engines connected to the local socket: who (pid, user, the name its
  // hello gave, tenant), since when, and what they moved.
  nlohmann::ordered_json ClientsJson() const {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    if (!local_) return {{"clients", out}};
    const auto now = std::chrono::system_clock::now();
    for (const auto& r : local_->clients()) {
      const int t = r->tenant.load(std::memory_order_relaxed);
      std::string user = std::to_string(r->uid);
      passwd pw{};
      passwd* found = nullptr;
      char buf[1024];
      if (getpwuid_r(r->uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
        user = found->pw_name;
      }
      out.push_back({{"id", r->id},
                     {"pid", r->pid},
                     {"uid", r->uid},
                     {"user", user},
                     {"name", r->name()},
                     {"tenant", t == 0 || static_cast<size_t>(t) > tenants_.size()
                                    ? std::string(kDefaultTenant)
                                    : tenants_[static_cast<size_t>(t) - 1].spec.name},
                     {"connected_unix_s",
                      std::chrono::duration<double>(r->connected.time_since_epoch()).count()},
                     {"age_s", std::chrono::duration<double>(now - r->connected).count()},
                     {"ops", r->ops.load(std::memory_order_relaxed)},
                     {"bytes_read", r->bytes_read.load(std::memory_order_relaxed)},
                     {"bytes_written", r->bytes_written.load(std::memory_order_relaxed)}});
    }
    return {{"clients", out}};
  }

  // The membership view and the shard ownership it implies. Standalone: this
  // node alone, owning every shard.
  nlohmann::ordered_json MembersJson() const {
    nlohmann::ordered_json members = nlohmann::ordered_json::array();
    nlohmann::ordered_json owned = nlohmann::ordered_json::object();
    if (!cluster_) {
      members.push_back({{"node_id", opts_.node_id},
                         {"address", opts_.local.socket_path},
                         {"incarnation", 0},
                         {"state", "alive"},
                         {"self", true}});
      owned[opts_.node_id] = kNumShards;
      return {{"cluster", nullptr}, {"epoch", 0}, {"members", members},
              {"shards", {{"total", kNumShards}, {"owned", owned}}}};
    }
    auto view = cluster_->view();
    auto map = cluster_->shard_map();
    for (const auto& m : view->members) {
      members.push_back({{"node_id", m.node_id},
                         {"address", m.address},
                         {"incarnation", m.incarnation},
                         {"weight", m.weight},
                         {"state", "alive"},
                         {"self", m.node_id == opts_.node_id}});
    }
    for (const auto& [id, n] : map->OwnershipCounts()) owned[id] = n;
    return {{"cluster", opts_.cluster.cluster},
            {"epoch", view->epoch},
            {"fenced", cluster_->fenced()},
            {"etcd_outage", cluster_->etcd_outage()},
            {"members", members},
            {"shards", {{"total", kNumShards}, {"owned", owned}}}};
  }

  // Per tenant, the default one first: quotas, use and traffic.
  nlohmann::ordered_json TenantsJson() const {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    std::vector<int> conns = local_ ? local_->tenant_connections() : std::vector<int>{};
    auto one = [&](const std::string& name, const TieredStore* store, size_t i, uint64_t dram_quota,
                   uint64_t ssd_quota) {
      DramStats d = store->GetDramStats();
      Labels l = {{"tenant", name}};
      auto count = [&](const char* metric) {
        double v = metrics_.ValueOf(metric, l);
        return v < 0 ? 0 : static_cast<uint64_t>(v);
      };
      nlohmann::ordered_json j = {
          {"name", name},
          {"connections", i < conns.size() ? conns[i] : 0},
          {"dram",
           {{"quota_bytes", dram_quota},
            {"capacity_bytes", d.capacity_bytes},
            {"used_bytes", d.used_bytes},
            {"entries", d.entries},
            {"evictions", d.evictions}}},
          {"ssd", nullptr},
          {"hits", count("kvpool_tenant_hits_total")},
          {"misses", count("kvpool_tenant_misses_total")},
          {"rejected", count("kvpool_tenant_rejected_total")},
          {"bytes_written", count("kvpool_tenant_bytes_written_total")},
          {"bytes_read", count("kvpool_tenant_bytes_read_total")}};
      if (store->has_ssd_tier()) {
        SsdStats s = store->GetSsdStats();
        j["ssd"] = {{"quota_bytes", ssd_quota},
                    {"capacity_bytes", s.capacity_bytes},
                    {"used_bytes", s.used_bytes},
                    {"entries", s.entries}};
      }
      out.push_back(std::move(j));
    };
    one(kDefaultTenant, tiered_.get(), 0, opts_.dram.capacity_bytes, opts_.ssd.capacity_bytes);
    for (size_t i = 0; i < tenants_.size(); ++i) {
      const TenantSpec& t = tenants_[i].spec;
      one(t.name, tenants_[i].store.get(), i + 1, t.dram_bytes, t.ssd_bytes);
    }
    return out;
  }

  nlohmann::ordered_json SsdJson() const {
    if (!tiered_->has_ssd_tier()) return nullptr;
    SsdStats st = tiered_->GetSsdStats();
    nlohmann::ordered_json dirs = nlohmann::ordered_json::array();
    for (const auto& d : st.dirs) {
      dirs.push_back({{"dir", d.dir},
                      {"device", d.device_kind},
                      {"capacity_bytes", d.capacity_bytes},
                      {"used_bytes", d.used_bytes},
                      {"reads", d.reads},
                      {"writes", d.writes},
                      {"online", d.online}});
    }
    return {{"capacity_bytes", st.capacity_bytes},
            {"used_bytes", st.used_bytes},
            {"entries", st.entries},
            {"index_bytes", st.index_bytes},
            {"index_bytes_per_entry", st.index_bytes_per_entry},
            {"reads", st.reads},
            {"read_bytes", st.read_bytes},
            {"writes", st.writes},
            {"write_bytes", st.write_bytes},
            {"crc_failures", st.crc_failures},
            {"region_evictions", st.region_evictions},
            {"inserts_dropped", st.inserts_dropped},
            {"online", st.online},
            {"offline_reason", st.offline_reason},
            {"recovery", st.recovery},
            {"dirs", dirs}};
  }

  NodeOptions opts_;
  const std::string config_json_;
  const std::function<void(const Status&)> on_fatal_;
  const std::chrono::steady_clock::time_point started_;
  uint64_t instance_id_ = 0;
  MetricsRegistry metrics_;  // outlives every component below
  std::unique_ptr<ThreadPool> io_pool_;     // promotions (SSD reads into DRAM)
  std::unique_ptr<ThreadPool> flush_pool_;  // SSD region writes
  std::unique_ptr<TieredStore> tiered_;     // DRAM, and SSD with --ssd: the default tenant
  // The other tenants (--tenants-file), each with its own store and the
  // registry of its store's figures.
  struct TenantStore {
    TenantSpec spec;
    std::unique_ptr<MetricsRegistry> metrics;
    std::unique_ptr<TieredStore> store;
    // The secrets of spec.tokens that --client-token-file holds, by name.
    std::map<std::string, std::array<uint8_t, 32>> token_secrets;
    // In a cluster: the tenant's directory (the keys this node is home of),
    // its announcer and its reader. Null when standalone.
    std::unique_ptr<cluster::Directory> directory;
    std::unique_ptr<cluster::HoldingsAnnouncer> announcer;
    std::unique_ptr<cluster::RemoteReader> reader;
  };
  std::vector<TenantStore> tenants_;
  std::unique_ptr<ThreadPool> peer_pool_;  // peer request handlers
  std::unique_ptr<ThreadPool> list_pool_;  // SSD inventory listings (cluster + SSD only)
  std::vector<transport::ClusterKey> cluster_keys_;   // from --cluster-key-file
  std::vector<transport::ClusterKey> client_tokens_;  // from --client-token-file
  std::unique_ptr<Cluster> cluster_;       // null when standalone
  std::unique_ptr<cluster::Directory> directory_;
  std::unique_ptr<cluster::HoldingsAnnouncer> announcer_;
  std::unique_ptr<blocks::DescriptorTable> descriptors_;
  std::unique_ptr<events::KvEventsPublisher> kv_events_;  // null unless configured
  std::unique_ptr<cluster::PeerServer> peer_server_;
  std::unique_ptr<cluster::BlockIndex> block_index_;  // null when standalone
  std::unique_ptr<ThreadPool> lookup_pool_;           // prefix lookups of local clients (they wait)
  Counter* lookup_refused_ = nullptr;
  std::unique_ptr<cluster::AntiEntropy> anti_entropy_;
  std::unique_ptr<cluster::RemoteReader> reader_;
  std::unique_ptr<LocalServer> local_;
  std::unique_ptr<AdminServer> admin_;
  std::thread cluster_thread_;  // the membership loop
  std::thread local_thread_;  // the local socket server's event loop
  std::atomic<bool> stopping_{false};
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
