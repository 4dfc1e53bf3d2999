#include "node/node_views.h"

#include <fmt/format.h>
#include <pwd.h>

#include <cmath>
#include <map>

#include "membership/shard_map.h"
#include "peer/peer_messages_format.h"

namespace kvpool {

NodeViews::NodeViews(const NodeOptions* options, uint64_t instance_id,
                     const MetricsRegistry* metrics, const NodeStores* stores,
                     const std::atomic<bool>* stopping)
    : o_(*options),
      instance_id_(instance_id),
      started_(std::chrono::steady_clock::now()),
      metrics_(metrics),
      stores_(stores),
      stopping_(stopping) {}

double NodeViews::UptimeSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

std::string NodeViews::ClusterMissing() const {
  if (!cluster()) return "";
  if (cluster()->joining()) return "joining: " + cluster()->joining_reason();
  if (cluster()->fenced()) return "fenced: its membership lease could not be renewed in time";
  return "";
}

nlohmann::ordered_json NodeViews::ReadinessJson() const {
  const char* state = !cluster()             ? "standalone"
                      : cluster()->joining() ? "joining"
                      : cluster()->fenced()  ? "fenced"
                                             : "ready";
  return {{"local", local() != nullptr && !stopping_->load() ? "ready" : "not ready"},
          {"cluster", state},
          {"detail", ClusterMissing()}};
}

std::string NodeViews::StatusJson() const { return StatusObject().dump(); }

std::string NodeViews::AggregateStatusJson() const {
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
  add(store());
  for (const auto& t : stores_->tenants()) add(t.store.get());
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

namespace {

// What the eviction policy adapts (DramStats::eviction): null for a policy
// that adapts nothing.
nlohmann::ordered_json EvictionJson(const EvictionAdaptation& a) {
  if (!a.adaptive) return nullptr;
  nlohmann::ordered_json shadows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < a.candidate_shares.size(); ++i) {
    shadows.push_back({{"protected_share", a.candidate_shares[i]},
                       {"insert", a.candidate_bimodal[i] ? "bimodal" : "warm"},
                       {"hit_ratio", a.shadow_hit_ratios[i]}});
  }
  return {{"protected_share", a.protected_share},
          {"insert", a.bimodal ? "bimodal" : "warm"},
          {"share_changes", a.share_changes},
          {"sample_rate", a.sample_rate},
          {"shadow_keys", a.shadow_keys},
          {"windows", a.windows},
          {"shadows", shadows}};
}

// A store's cache hints now and since start (docs/hints.md).
nlohmann::ordered_json HintsJson(const DramStats& s) {
  return {{"retained_entries", s.retained_entries},
          {"retained_bytes", s.retained_bytes},
          {"pinned_entries", s.hint_pinned_entries},
          {"pinned_bytes", s.hint_pinned_bytes},
          {"demoted_entries", s.demoted_entries},
          {"leases_expired", s.leases_expired},
          {"retains_clipped", s.retains_clipped},
          {"prefetched_entries", s.prefetched_entries},
          {"prefetch_hits", s.prefetch_hits},
          {"prefetch_unused", s.prefetch_unused},
          {"prefetch_mean_lead_s", s.prefetch_mean_lead_seconds()}};
}

}  // namespace

nlohmann::ordered_json NodeViews::StatusObject() const {
  DramStats st = store()->GetDramStats();
  nlohmann::ordered_json classes = nlohmann::ordered_json::array();
  for (const auto& c : st.classes) {
    if (c.slabs == 0) continue;
    classes.push_back({{"slot_bytes", c.slot_bytes}, {"slabs", c.slabs}, {"entries", c.entries}});
  }
  nlohmann::ordered_json j = {
      {"node_id", o_.node_id},
      {"version", KVPOOL_VERSION},
      {"instance_id", fmt::format("{:016x}", instance_id_)},
      {"uptime_s", UptimeSeconds()},
      {"socket_path", o_.local.socket_path},
      {"local_connections", local() ? local()->connections() : 0},
      {"dram",
       {{"capacity_bytes", st.capacity_bytes},
        {"used_bytes", st.used_bytes},
        {"allocated_bytes", st.allocated_bytes},
        {"entries", st.entries},
        {"pinned", st.pinned},
        {"reserved", st.reserved},
        {"evictions", st.evictions},
        {"lent", st.lent},
        {"slab_moves", st.slab_moves},
        {"index_bytes", st.index_bytes},
        {"index_bytes_per_entry", st.index_bytes_per_entry},
        {"huge_pages", st.huge_pages},
        {"huge_page_bytes", st.huge_page_bytes},
        {"eviction", EvictionJson(st.eviction)},
        {"hints", HintsJson(st)},
        {"classes", classes}}},
      {"ssd", SsdJson()},
      {"tenants", TenantsJson()},
      {"members", MembersJson()["members"]},
      {"membership",
       {{"fenced", cluster() != nullptr && cluster()->fenced()},
        {"joining", cluster() != nullptr && cluster()->joining()},
        {"etcd_outage", cluster() != nullptr && cluster()->etcd_outage()}}},
      {"readiness", ReadinessJson()},
  };
  return j;
}

nlohmann::ordered_json NodeViews::KeyFiguresJson() const {
  // The node's figures: with tenants, summed over every tenant's store.
  DramStats d = store()->GetDramStats();
  for (const auto& t : stores_->tenants()) {
    DramStats td = t.store->GetDramStats();
    d.capacity_bytes += td.capacity_bytes;
    d.used_bytes += td.used_bytes;
    d.entries += td.entries;
    d.evictions += td.evictions;
  }
  auto total = [this](const char* name) {
    const double v = metrics_->SumOf(name);
    return v < 0 ? 0.0 : v;
  };
  const double hit_1m = metrics_->ValueOf("kvpool_hit_ratio_recent", {{"window", "1m"}});
  nlohmann::ordered_json ssd = nullptr;
  if (store()->has_ssd_tier()) {
    SsdStats s = store()->GetSsdStats();
    for (const auto& t : stores_->tenants()) {
      if (!t.store->has_ssd_tier()) continue;
      SsdStats ts = t.store->GetSsdStats();
      s.capacity_bytes += ts.capacity_bytes;
      s.used_bytes += ts.used_bytes;
      s.entries += ts.entries;
    }
    ssd = {
        {"capacity_bytes", s.capacity_bytes}, {"used_bytes", s.used_bytes}, {"entries", s.entries}};
  }
  return {{"node_id", o_.node_id},
          {"version", KVPOOL_VERSION},
          {"uptime_s", UptimeSeconds()},
          {"dram",
           {{"capacity_bytes", d.capacity_bytes},
            {"used_bytes", d.used_bytes},
            {"entries", d.entries},
            {"evictions", d.evictions}}},
          {"ssd", ssd},
          {"local_connections", local() ? local()->connections() : 0},
          {"ops", total("kvpool_ops_total")},
          {"hits", total("kvpool_hits_total")},
          {"misses", total("kvpool_misses_total")},
          {"hit_ratio_1m", std::isfinite(hit_1m) && hit_1m >= 0 ? nlohmann::ordered_json(hit_1m)
                                                                : nlohmann::ordered_json()},
          {"bytes_read", total("kvpool_bytes_read_total")},
          {"bytes_written", total("kvpool_bytes_written_total")},
          {"fenced", cluster() != nullptr && cluster()->fenced()}};
}

nlohmann::ordered_json NodeViews::ClusterJson() const {
  nlohmann::ordered_json members = nlohmann::ordered_json::array();
  if (!cluster()) {
    nlohmann::ordered_json self = KeyFiguresJson();
    self["address"] = o_.local.socket_path;
    self["self"] = true;
    members.push_back(std::move(self));
    return {{"cluster", nullptr}, {"members", members}};
  }
  auto view = cluster()->view();
  std::map<std::string, transport::Reply> replies;
  for (auto& r : cluster()->AskOtherMembers(
           cluster::kPeerStatus, transport::SteadyClock::now() + std::chrono::seconds(1))) {
    replies[r.member.node_id] = std::move(r.reply);
  }
  for (const Member& m : view->members) {
    nlohmann::ordered_json row;
    auto it = replies.find(m.node_id);
    if (m.node_id == o_.node_id) {
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
    row["self"] = m.node_id == o_.node_id;
    members.push_back(std::move(row));
  }
  return {{"cluster", o_.cluster.cluster}, {"members", members}};
}

nlohmann::ordered_json NodeViews::ClientsJson() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  if (!local()) return {{"clients", out}};
  const auto now = std::chrono::system_clock::now();
  for (const auto& r : local()->clients()) {
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
                   {"tenant", t == 0 || static_cast<size_t>(t) > stores_->tenants().size()
                                  ? std::string(kDefaultTenant)
                                  : stores_->tenants()[static_cast<size_t>(t) - 1].spec.name},
                   {"connected_unix_s",
                    std::chrono::duration<double>(r->connected.time_since_epoch()).count()},
                   {"age_s", std::chrono::duration<double>(now - r->connected).count()},
                   {"ops", r->ops.load(std::memory_order_relaxed)},
                   {"bytes_read", r->bytes_read.load(std::memory_order_relaxed)},
                   {"bytes_written", r->bytes_written.load(std::memory_order_relaxed)}});
  }
  return {{"clients", out}};
}

nlohmann::ordered_json NodeViews::MembersJson() const {
  nlohmann::ordered_json members = nlohmann::ordered_json::array();
  nlohmann::ordered_json owned = nlohmann::ordered_json::object();
  if (!cluster()) {
    members.push_back({{"node_id", o_.node_id},
                       {"address", o_.local.socket_path},
                       {"incarnation", 0},
                       {"state", "alive"},
                       {"self", true}});
    owned[o_.node_id] = kNumShards;
    return {{"cluster", nullptr},
            {"epoch", 0},
            {"members", members},
            {"shards", {{"total", kNumShards}, {"owned", owned}}}};
  }
  auto view = cluster()->view();
  auto map = cluster()->shard_map();
  for (const auto& m : view->members) {
    members.push_back({{"node_id", m.node_id},
                       {"address", m.address},
                       {"incarnation", m.incarnation},
                       {"weight", m.weight},
                       {"state", "alive"},
                       {"self", m.node_id == o_.node_id}});
  }
  for (const auto& [id, n] : map->OwnershipCounts()) owned[id] = n;
  return {{"cluster", o_.cluster.cluster},
          {"epoch", view->epoch},
          {"fenced", cluster()->fenced()},
          {"etcd_outage", cluster()->etcd_outage()},
          {"members", members},
          {"shards", {{"total", kNumShards}, {"owned", owned}}}};
}

nlohmann::ordered_json NodeViews::TenantsJson() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  std::vector<int> conns = local() ? local()->tenant_connections() : std::vector<int>{};
  auto one = [&](const std::string& name, const TieredStore* store, size_t i, uint64_t dram_quota,
                 uint64_t ssd_quota) {
    DramStats d = store->GetDramStats();
    Labels l = {{"tenant", name}};
    auto count = [&](const char* metric) {
      double v = metrics_->ValueOf(metric, l);
      return v < 0 ? 0 : static_cast<uint64_t>(v);
    };
    nlohmann::ordered_json j = {{"name", name},
                                {"connections", i < conns.size() ? conns[i] : 0},
                                {"dram",
                                 {{"quota_bytes", dram_quota},
                                  {"capacity_bytes", d.capacity_bytes},
                                  {"used_bytes", d.used_bytes},
                                  {"entries", d.entries},
                                  {"evictions", d.evictions},
                                  {"eviction", EvictionJson(d.eviction)},
                                  {"hints", HintsJson(d)}}},
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
  one(kDefaultTenant, store(), 0, o_.dram.capacity_bytes, o_.ssd.capacity_bytes);
  for (size_t i = 0; i < stores_->tenants().size(); ++i) {
    const TenantSpec& t = stores_->tenants()[i].spec;
    one(t.name, stores_->tenants()[i].store.get(), i + 1, t.dram_bytes, t.ssd_bytes);
  }
  return out;
}

nlohmann::ordered_json NodeViews::SsdJson() const {
  if (!store()->has_ssd_tier()) return nullptr;
  SsdStats st = store()->GetSsdStats();
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
          {"lent_bytes", st.lent_bytes},
          {"online", st.online},
          {"offline_reason", st.offline_reason},
          {"recovery", st.recovery},
          {"dirs", dirs}};
}

}  // namespace kvpool
