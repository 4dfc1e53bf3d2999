#include "membership/etcd_membership.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "membership/etcd_client.h"
#include "membership/lease_times.h"

namespace kvpool {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The longest a watch slice runs before the loop looks at its timers again.
constexpr milliseconds kMaxSlice{1000};
// The longest one ask of the peers may take.
constexpr milliseconds kProbeBudget{500};
// While joining after a restart: how often the old registration is looked at.
constexpr milliseconds kJoinPoll{100};

bool ValidName(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos &&
         std::none_of(s.begin(), s.end(), [](char c) { return c <= ' ' || c == 0x7f; });
}

// Proofs a registration may carry at most, and their length each.
constexpr size_t kMaxProofs = 4;
constexpr size_t kMaxProofChars = 256;

// The member record stored as the value of a member key; "proofs" only when
// the node proves holding the cluster key.
std::string EncodeMember(const Member& m, const std::vector<std::string>& proofs) {
  nlohmann::json j = {{"node_id", m.node_id},
                      {"address", m.address},
                      {"incarnation", m.incarnation},
                      {"weight", m.weight}};
  if (!proofs.empty()) j["proofs"] = proofs;
  return j.dump();
}

// *proofs: the record's proofs (empty when it has none, or they are malformed).
bool DecodeMember(const std::string& value, Member* m, std::vector<std::string>* proofs = nullptr) {
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (proofs != nullptr) {
    proofs->clear();
    auto p = j.find("proofs");
    if (p != j.end() && p->is_array() && p->size() <= kMaxProofs) {
      for (const auto& e : *p) {
        if (!e.is_string() || e.get_ref<const std::string&>().size() > kMaxProofChars) {
          proofs->clear();
          break;
        }
        proofs->push_back(e.get<std::string>());
      }
    }
  }
  auto id = j.find("node_id");
  auto addr = j.find("address");
  auto inc = j.find("incarnation");
  auto w = j.find("weight");
  if (id == j.end() || !id->is_string() || addr == j.end() || !addr->is_string() ||
      inc == j.end() || !inc->is_number_unsigned() || w == j.end() || !w->is_number()) {
    return false;
  }
  m->node_id = id->get<std::string>();
  m->address = addr->get<std::string>();
  m->incarnation = inc->get<uint64_t>();
  m->weight = w->get<double>();
  m->state = MemberState::kAlive;
  return std::isfinite(m->weight);
}

}  // namespace

std::string MemberRecord(const std::string& cluster, const Member& m) {
  return fmt::format("{}\n{}\n{}\n{}\n{}", cluster, m.node_id, m.incarnation, m.address,
                     m.weight);
}

LeaseVerdict JudgeLease(std::span<const PeerLeaseReport> reports,
                        SteadyClock::time_point failing_since, std::string* why) {
  size_t asked = reports.size(), vouching = 0, renewing = 0;
  for (const PeerLeaseReport& r : reports) {
    // A fenced peer, or one without a lease, tells nothing about etcd.
    if (!r.answered || r.fenced || !r.has_lease) continue;
    ++vouching;
    if (r.renewed_at > failing_since) ++renewing;
  }
  if (renewing > 0) {
    *why = fmt::format("lease not renewed in time while {} of {} peers renew theirs", renewing,
                       asked);
    return LeaseVerdict::kFence;
  }
  if (vouching == 0) {
    *why = fmt::format("lease not renewed in time and none of {} peers can vouch for the view",
                       asked);
    return LeaseVerdict::kFence;
  }
  *why = fmt::format("etcd unreachable for {} of {} peers too", vouching, asked);
  return LeaseVerdict::kEtcdOutage;
}

Status EtcdMembershipOptions::Validate() const {
  KVPOOL_RETURN_IF_ERROR((EtcdClientOptions{endpoints, request_timeout, security}.Validate()));
  if (!ValidName(cluster)) return InvalidArgument("etcd membership: bad cluster name");
  if (!ValidName(node_id)) return InvalidArgument("etcd membership: bad node id '" + node_id + "'");
  if (address.find(':') == std::string::npos) {
    return InvalidArgument("etcd membership: address must be host:port");
  }
  if (!std::isfinite(weight) || weight < 0) return InvalidArgument("etcd membership: bad weight");
  if (lease_ttl < milliseconds(2000)) return InvalidArgument("etcd membership: lease_ttl < 2 s");
  if (request_timeout * 4 > lease_ttl) {
    return InvalidArgument("etcd membership: request_timeout must be <= lease_ttl / 4");
  }
  if (retry_interval.count() <= 0) return InvalidArgument("etcd membership: retry_interval <= 0");
  if (open_timeout.count() < 0) return InvalidArgument("etcd membership: open_timeout < 0");
  if (live_id_margin.count() < 0) return InvalidArgument("etcd membership: live_id_margin < 0");
  return Status::Ok();
}

struct EtcdMembership::Impl {
  EtcdMembership* self;
  EtcdMembershipOptions options;
  EtcdClient client;
  std::string prefix;           // .../members/
  std::string member_key;       // .../members/<node-id>
  std::string incarnation_key;  // .../incarnation
  Counter* renewals;
  Counter* registrations;
  Counter* join_attempts;
  Counter dummy_renewals;
  Counter dummy_registrations;
  Gauge* outage_gauge = nullptr;
  Gauge* unproven_gauge = nullptr;
  Counter* unproven_seen = nullptr;
  // Registrations left out for want of a valid proof: id -> incarnation.
  std::map<std::string, uint64_t> unproven;

  // Joining (OldLeaseWait::kInRun): the previous registration's lease, and
  // how long it is waited for.
  std::atomic<bool> joining{false};
  bool refused = false;
  int64_t join_holder = 0;
  SteadyClock::time_point join_deadline;
  mutable std::mutex reason_mu;
  std::string join_reason;  // protected by reason_mu

  // Owned by the loop (and by Open before it).
  EtcdLease lease;                // id 0: none held
  int64_t registered_revision = 0;  // revision of our current member key
  LeaseTimes lease_times;           // when to renew, and when to judge (lease_times.h)
  SteadyClock::time_point next_register;
  std::map<std::string, Member> members;  // as of watch_revision - 1
  std::vector<int64_t> abandoned_leases;  // granted by failed registrations (the last 16)
  int64_t watch_revision = 0;
  bool need_resync = true;

  // Read by lease_state() from any thread.
  std::atomic<int64_t> last_renewal_ns{0};  // last_renewal, steady clock
  std::atomic<bool> outage{false};

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;  // protected by mu
  LeaveMode leave_mode = LeaveMode::kRevokeLease;  // protected by mu

  Impl(EtcdMembership* s, const EtcdMembershipOptions& o, MetricsRegistry* metrics)
      : self(s),
        options(o),
        client(EtcdClientOptions{o.endpoints, o.request_timeout, o.security}, metrics),
        prefix("/kvpool/v1/" + o.cluster + "/members/"),
        member_key(prefix + o.node_id),
        incarnation_key("/kvpool/v1/" + o.cluster + "/incarnation"),
        renewals(metrics ? metrics->GetCounter("kvpool_membership_lease_renewals_total",
                                               "Successful lease renewals.")
                         : &dummy_renewals),
        registrations(metrics ? metrics->GetCounter("kvpool_membership_registrations_total",
                                                    "Registrations (start and after a fence).")
                              : &dummy_registrations),
        join_attempts(metrics ? metrics->GetCounter(
                                    "kvpool_membership_join_attempts_total",
                                    "Looks at this node id's registration while joining, waiting "
                                    "for an earlier one to expire")
                              : &dummy_registrations),
        outage_gauge(metrics ? metrics->GetGauge(
                                   "kvpool_membership_etcd_outage",
                                   "1 while etcd is unreachable for this node and its peers alike "
                                   "and the node serves with its last view.")
                             : nullptr),
        unproven_gauge(
            metrics ? metrics->GetGauge("kvpool_membership_unproven_members",
                                        "Registrations in etcd left out of the view: they carry no "
                                        "valid proof of holding the cluster key.")
                    : nullptr),
        unproven_seen(
            metrics ? metrics->GetCounter("kvpool_membership_unproven_registrations_total",
                                          "Registrations (node id and incarnation) seen without a "
                                          "valid proof of holding the cluster key.")
                    : &dummy_registrations) {}

  void SetJoinReason(std::string why) {
    std::lock_guard<std::mutex> l(reason_mu);
    join_reason = std::move(why);
  }

  // For lease_state(): the last successful renewal's sending.
  void PublishRenewal() {
    last_renewal_ns.store(lease_times.last_renewal().time_since_epoch().count(),
                          std::memory_order_release);
  }

  void SetOutage(bool on) {
    if (outage.exchange(on) == on) return;
    if (outage_gauge != nullptr) outage_gauge->Set(on ? 1 : 0);
  }

  bool Stopping() {
    std::lock_guard<std::mutex> l(mu);
    return stop;
  }

  // Sleeps until t or Stop(), whichever is first.
  void WaitUntil(SteadyClock::time_point t) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait_until(l, t, [&] { return stop; });
  }

  // Grants a lease and, in one txn, creates the member key and bumps the
  // incarnation counter. On success the lease and incarnation are ours.
  Status Register() {
    const int64_t ttl_s = (options.lease_ttl.count() + 999) / 1000;
    SteadyClock::time_point granted_at = SteadyClock::now();
    KVPOOL_ASSIGN_OR_RETURN(EtcdLease granted, client.LeaseGrant(ttl_s));
    Status st = RegisterWithLease(granted);
    if (!st.ok()) {
      // Or it expires by itself; a timed-out txn may have put our member key
      // under it, which the next attempt recognises and clears.
      client.LeaseRevoke(granted.id).IgnoreError();
      abandoned_leases.push_back(granted.id);
      // Bounded: an abandoned lease expires within its TTL anyway.
      if (abandoned_leases.size() > 16) abandoned_leases.erase(abandoned_leases.begin());
      return st;
    }
    lease = granted;
    lease_times.Granted(granted_at, milliseconds(granted.ttl_s * 1000));
    PublishRenewal();
    registrations->Inc();
    return Status::Ok();
  }

  // Register(), but while the node id is held by another lease that may
  // still expire by itself (this node's previous life, killed inside its
  // TTL), wait for it: at most its remaining TTL, as first seen, plus
  // live_id_margin. Logged once. A lease renewed past that is a live
  // process: FailedPrecondition.
  Status RegisterWhenFree() {
    SteadyClock::time_point wait_until{};
    for (;;) {
      KVPOOL_ASSIGN_OR_RETURN(EtcdRange existing, client.Get(member_key));
      int64_t holder = existing.kvs.empty() ? 0 : existing.kvs[0].lease;
      if (holder != 0 && std::find(abandoned_leases.begin(), abandoned_leases.end(), holder) ==
                             abandoned_leases.end()) {
        Result<int64_t> left = client.LeaseTimeToLive(holder);
        if (!left.ok() && left.status().code() != StatusCode::kNotFound) return left.status();
        if (left.ok()) {
          SteadyClock::time_point now = SteadyClock::now();
          if (wait_until == SteadyClock::time_point{}) {
            wait_until = now + std::chrono::seconds(*left) + options.live_id_margin;
            LogWarn("membership: node id {} is still registered (lease {:x}, {} s left); "
                    "waiting up to {} ms for it to expire",
                    options.node_id, holder, *left,
                    std::chrono::duration_cast<milliseconds>(wait_until - now).count());
          }
          if (now >= wait_until) {
            return FailedPrecondition(fmt::format(
                "node id already live: {} (its lease {:x} is still renewed after waiting for it "
                "to expire)", options.node_id, holder));
          }
          WaitUntil(std::min(wait_until, now + options.retry_interval));
          if (Stopping()) return Aborted("membership: stopped while waiting for the node id");
          continue;
        }
      }
      Status st = Register();
      // Taken again between our look and our txn: look again (bounded by
      // the same wait).
      if (st.code() != StatusCode::kFailedPrecondition) return st;
      if (wait_until != SteadyClock::time_point{} && SteadyClock::now() >= wait_until) return st;
      WaitUntil(SteadyClock::now() + options.retry_interval);
    }
  }

  // OldLeaseWait::kInRun's Open: registers now when the id is free, else
  // leaves the node joining (fenced: no remote work) for the loop.
  Status RegisterOrJoinLater() {
    KVPOOL_ASSIGN_OR_RETURN(EtcdRange existing, client.Get(member_key));
    int64_t holder = existing.kvs.empty() ? 0 : existing.kvs[0].lease;
    if (holder != 0) {
      Result<int64_t> left = client.LeaseTimeToLive(holder);
      if (!left.ok() && left.status().code() != StatusCode::kNotFound) return left.status();
      if (left.ok()) {
        StartJoining(holder, std::chrono::seconds(*left));
        return Status::Ok();
      }
    }
    Status st = Register();
    if (st.code() != StatusCode::kFailedPrecondition) return st;
    // Taken between the look and the txn: wait for it in the loop.
    StartJoining(holder, options.lease_ttl);
    return Status::Ok();
  }

  void StartJoining(int64_t holder, milliseconds left) {
    join_holder = holder;
    join_deadline = SteadyClock::now() + left + options.live_id_margin;
    next_register = SteadyClock::now() + std::min(options.retry_interval, kJoinPoll);
    joining.store(true);
    self->SetFenced(true);
    std::string why = fmt::format(
        "node id {} is still registered (lease {:x}, {} ms left): local clients are served; "
        "the cluster is joined once it expires",
        options.node_id, holder, left.count());
    LogWarn("membership: {}", why);
    SetJoinReason(std::move(why));
  }

  // While joining: register once the previous registration is gone; refuse
  // (once) when it is still renewed past the bound.
  void TryJoin() {
    join_attempts->Inc();
    Result<EtcdRange> existing = client.Get(member_key);
    if (!existing.ok()) return;  // etcd away: later
    int64_t holder = existing->kvs.empty() ? 0 : existing->kvs[0].lease;
    // A registration of ours whose answer timed out (its lease abandoned)
    // is not a live process: RegisterWithLease clears it.
    const bool ours = std::find(abandoned_leases.begin(), abandoned_leases.end(), holder) !=
                      abandoned_leases.end();
    if (holder != join_holder && holder != 0 && !ours) {
      // Another registration took the id meanwhile: wait for it as long.
      join_holder = holder;
      join_deadline = SteadyClock::now() + options.lease_ttl + options.live_id_margin;
    }
    if (holder == 0 || ours) {
      Status st = Register();
      if (st.ok()) {
        // Unfenced first: a peer whose view shows the new registration
        // already is served, never told "fenced" (which it would avoid).
        self->SetFenced(false);
        joining.store(false);
        SetJoinReason("");
        need_resync = true;
        LogInfo("membership: {} joined the cluster (its previous registration expired)",
                options.node_id);
      }
      return;
    }
    if (SteadyClock::now() < join_deadline || refused) return;
    refused = true;
    Status st = FailedPrecondition(fmt::format(
        "node id already live: {} (its lease {:x} is still renewed after waiting for it to "
        "expire)",
        options.node_id, holder));
    SetJoinReason(std::string(st.message()));
    LogError("membership: {}", st.ToString());
    if (options.on_refused) options.on_refused(st);
  }

  Status RegisterWithLease(const EtcdLease& granted) {
    // A few tries: another node may bump the counter between our read and
    // our txn (the compare on mod_revision makes that a retry, not a dup).
    for (int attempt = 0; attempt < 8; ++attempt) {
      KVPOOL_ASSIGN_OR_RETURN(EtcdRange counter, client.Get(incarnation_key));
      uint64_t current = 0;
      int64_t counter_mod = 0;
      if (!counter.kvs.empty()) {
        counter_mod = counter.kvs[0].mod_revision;
        char* end = nullptr;
        current = std::strtoull(counter.kvs[0].value.c_str(), &end, 10);
        if (*end != '\0') return Internal("etcd membership: incarnation counter is not a number");
      }
      Member me{options.node_id, options.address, current + 1, options.weight,
                MemberState::kAlive};
      std::vector<std::string> proofs;
      if (options.prove) proofs = options.prove(MemberRecord(options.cluster, me));
      Result<EtcdTxnResult> txn = client.Txn(
          {{member_key, EtcdCompare::Target::kCreateRevision, 0},
           {incarnation_key, EtcdCompare::Target::kModRevision, counter_mod}},
          {{incarnation_key, std::to_string(current + 1), 0},
           {member_key, EncodeMember(me, proofs), granted.id}});
      if (txn.ok() && txn->succeeded) {
        self->SetIncarnation(me.incarnation);
        registered_revision = txn->revision;
        LogInfo("membership: {} registered as incarnation {} (lease {:x}, ttl {} s)",
                options.node_id, me.incarnation, granted.id, granted.ttl_s);
        return Status::Ok();
      }
      // A failed or timed-out txn may still have been applied: the key then
      // carries our lease.
      KVPOOL_ASSIGN_OR_RETURN(EtcdRange existing, client.Get(member_key));
      if (!existing.kvs.empty()) {
        const EtcdKv& kv = existing.kvs[0];
        Member found;
        if (kv.lease == granted.id && DecodeMember(kv.value, &found)) {
          self->SetIncarnation(found.incarnation);
          registered_revision = kv.create_revision;
          return Status::Ok();
        }
        if (std::find(abandoned_leases.begin(), abandoned_leases.end(), kv.lease) !=
            abandoned_leases.end()) {
          // Our own earlier attempt, whose answer timed out: clear it.
          KVPOOL_RETURN_IF_ERROR(client.LeaseRevoke(kv.lease));
          continue;
        }
        return FailedPrecondition("node id already live: " + options.node_id);
      }
      if (!txn.ok()) return txn.status();
    }
    return Aborted("etcd membership: incarnation counter too contended");
  }

  // Reads every member and publishes them; the watch goes on from there.
  Status Resync() {
    KVPOOL_ASSIGN_OR_RETURN(EtcdRange range, client.RangePrefix(prefix));
    members.clear();
    unproven.clear();
    for (const EtcdKv& kv : range.kvs) ApplyPut(kv);
    SetUnprovenGauge();
    watch_revision = range.revision + 1;
    need_resync = false;
    PublishMembers(range.revision);
    return Status::Ok();
  }

  void ApplyPut(const EtcdKv& kv) {
    Member m;
    std::vector<std::string> proofs;
    std::string id = kv.key.substr(prefix.size());
    if (!DecodeMember(kv.value, &m, &proofs) || m.node_id != id) {
      LogWarn("membership: ignoring malformed member record under {}", kv.key);
      return;
    }
    if (options.verify && !options.verify(MemberRecord(options.cluster, m), proofs)) {
      // Not a key holder (or not this cluster's key): it takes no shard home.
      auto [it, added] = unproven.try_emplace(id, m.incarnation);
      if (added || it->second != m.incarnation) {
        it->second = m.incarnation;
        unproven_seen->Inc();
        LogWarn("membership: ignoring {} (incarnation {}, {}): its registration carries no valid "
                "proof of holding the cluster key",
                id, m.incarnation, m.address);
      }
      members.erase(id);
      SetUnprovenGauge();
      return;
    }
    if (unproven.erase(id) > 0) SetUnprovenGauge();
    members[id] = std::move(m);
  }

  void SetUnprovenGauge() {
    if (unproven_gauge != nullptr) unproven_gauge->Set(static_cast<double>(unproven.size()));
  }

  void ApplyEvents(const std::vector<EtcdEvent>& events) {
    int64_t revision = 0;
    for (const EtcdEvent& e : events) {
      revision = std::max(revision, e.kv.mod_revision);
      if (e.kv.key.compare(0, prefix.size(), prefix) != 0) continue;
      if (e.type == EtcdEvent::Type::kPut) {
        ApplyPut(e.kv);
        continue;
      }
      members.erase(e.kv.key.substr(prefix.size()));
      if (unproven.erase(e.kv.key.substr(prefix.size())) > 0) SetUnprovenGauge();
      // Our current registration is gone (expired early, or deleted by
      // hand): we hold no membership any more. Deletes of an older
      // registration of ours (revoked when coming back) do not count.
      if (e.kv.key == member_key && e.kv.mod_revision > registered_revision && lease.id != 0) {
        Fence("member key deleted");
      }
    }
    if (revision >= watch_revision) watch_revision = revision + 1;
    if (revision > 0) PublishMembers(revision);
  }

  void PublishMembers(int64_t revision) {
    std::vector<Member> list;
    list.reserve(members.size());
    for (const auto& [id, m] : members) list.push_back(m);
    self->Publish(std::move(list), static_cast<uint64_t>(revision));
  }

  void Fence(const std::string& why) {
    if (self->fenced()) return;
    SetOutage(false);
    LogWarn("membership: {} fenced: {}", options.node_id, why);
    self->SetFenced(true);
    next_register = SteadyClock::now();
  }

  // While fenced: drop the old lease, then register with a new incarnation.
  void TryRecover() {
    if (lease.id != 0) {
      Status st = client.LeaseRevoke(lease.id);
      if (!st.ok() && st.code() != StatusCode::kNotFound) {  // etcd still away
        LogDebug("membership: {} cannot drop its old lease yet: {}", options.node_id,
                 st.ToString());
        return;
      }
      lease.id = 0;
    }
    Status st = Register();
    if (!st.ok()) {
      LogWarn("membership: {} cannot register again: {}", options.node_id, st.ToString());
      return;
    }
    need_resync = true;
    self->SetFenced(false);
  }

  // One renewal; true when it went through.
  bool KeepAlive() {
    SteadyClock::time_point sent = SteadyClock::now();
    Result<int64_t> ttl = client.LeaseKeepAlive(lease.id);
    if (ttl.ok()) {
      if (outage.load()) LogInfo("membership: {} reaches etcd again", options.node_id);
      SetOutage(false);
      lease_times.Renewed(sent);
      PublishRenewal();
      renewals->Inc();
      return true;
    }
    if (ttl.status().code() == StatusCode::kNotFound) {
      Fence("lease expired");
    } else {
      lease_times.RenewFailed(sent, SteadyClock::now());
    }
    return false;
  }

  // The lease went TTL/2 without a renewal: fence, unless the peers say
  // etcd is down for them too (see the header).
  void FenceOrRideOut() {
    if (!options.probe_peers) {
      Fence("lease not renewed in time");
      return;
    }
    SteadyClock::time_point failing_since = lease_times.FailingSince();
    std::vector<PeerLeaseReport> reports = options.probe_peers(
        SteadyClock::now() + std::min<milliseconds>(kProbeBudget, options.request_timeout));
    std::string why;
    if (JudgeLease(reports, failing_since, &why) == LeaseVerdict::kFence) {
      // Riding out an outage, peers that renew again may only mean etcd
      // came back and answered them first (this node's next renewal not
      // yet due): one renewal of its own before it fences.
      if (outage.load() && (KeepAlive() || self->fenced())) return;
      Fence(why);
      return;
    }
    if (!outage.load()) {
      LogWarn("membership: {} keeps its last view: {}", options.node_id, why);
    }
    SetOutage(true);
    lease_times.RodeOut(SteadyClock::now());
  }

  void Loop() {
    while (!Stopping()) {
      SteadyClock::time_point now = SteadyClock::now();
      SteadyClock::time_point slice_end = now + kMaxSlice;
      if (joining.load()) {
        if (now >= next_register) {
          TryJoin();
          // A quick look (one read) while the old registration is about to
          // go: joining sooner is local service turning into cluster service.
          next_register = SteadyClock::now() + std::min(options.retry_interval, kJoinPoll);
        }
        if (joining.load()) slice_end = std::min(slice_end, next_register);
      } else if (!self->fenced()) {
        if (lease_times.KeepAliveDue(now)) KeepAlive();
        if (!self->fenced() && lease_times.JudgeDue(SteadyClock::now())) FenceOrRideOut();
      }
      if (self->fenced() && !joining.load()) {
        if (SteadyClock::now() >= next_register) {
          TryRecover();
          next_register = SteadyClock::now() + options.retry_interval;
        }
        if (self->fenced()) slice_end = std::min(slice_end, next_register);
      }
      if (!self->fenced() && !joining.load()) {
        slice_end = std::min({slice_end, lease_times.next_keepalive(), lease_times.JudgeAt()});
      }
      if (Stopping()) break;
      Status st = need_resync
                      ? Resync()
                      : client.WatchPrefix(prefix, watch_revision, slice_end,
                                           [this](const std::vector<EtcdEvent>& ev) {
                                             ApplyEvents(ev);
                                           });
      if (st.code() == StatusCode::kAborted) {
        need_resync = true;
      } else if (!st.ok()) {
        WaitUntil(slice_end);
      }
    }
    LeaveMode mode;
    {
      std::lock_guard<std::mutex> l(mu);
      mode = leave_mode;
    }
    if (mode == LeaveMode::kRevokeLease) Leave();
    lease.id = 0;  // abandoned: it expires in etcd by itself
  }

  void Leave() {
    if (lease.id == 0) return;
    Status st = client.LeaseRevoke(lease.id);
    if (!st.ok() && st.code() != StatusCode::kNotFound) {
      LogWarn("membership: {} could not revoke its lease ({}); it expires in {} s",
              options.node_id, st.ToString(), lease.ttl_s);
    }
    lease.id = 0;
  }
};

EtcdMembership::EtcdMembership(const EtcdMembershipOptions& options, MetricsRegistry* metrics)
    : Membership(options.node_id, metrics),
      impl_(std::make_unique<Impl>(this, options, metrics)) {}

EtcdMembership::~EtcdMembership() {
  // Run() was never called (or did not get to leave).
  impl_->Leave();
}

Result<std::unique_ptr<EtcdMembership>> EtcdMembership::Open(const EtcdMembershipOptions& options,
                                                             MetricsRegistry* metrics) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<EtcdMembership> m(new EtcdMembership(options, metrics));
  // etcd that answers too slowly (busy, fsyncing) is waited for, up to
  // open_timeout; one that refuses, or says no, is an error at once.
  SteadyClock::time_point deadline = SteadyClock::now() + options.open_timeout;
  auto patiently = [&](const char* what, auto&& step) -> Status {
    for (;;) {
      Status st = step();
      if (st.code() != StatusCode::kDeadlineExceeded ||
          SteadyClock::now() + options.retry_interval >= deadline) {
        return st;
      }
      LogWarn("membership: {}: {} timed out ({}); trying again", options.node_id, what,
              st.ToString());
      m->impl_->WaitUntil(SteadyClock::now() + options.retry_interval);
    }
  };
  KVPOOL_RETURN_IF_ERROR(patiently("registering", [&] {
    return options.old_lease_wait == EtcdMembershipOptions::OldLeaseWait::kInRun
               ? m->impl_->RegisterOrJoinLater()
               : m->impl_->RegisterWhenFree();
  }));
  // The destructor revokes the lease if this fails.
  KVPOOL_RETURN_IF_ERROR(patiently("reading the members", [&] { return m->impl_->Resync(); }));
  return m;
}

void EtcdMembership::Run() { impl_->Loop(); }

EtcdMembership::LeaseState EtcdMembership::lease_state() const {
  LeaseState st;
  st.fenced = fenced();
  st.etcd_outage = impl_->outage.load();
  SteadyClock::time_point renewed{
      SteadyClock::duration(impl_->last_renewal_ns.load(std::memory_order_acquire))};
  st.since_renewal = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - renewed);
  return st;
}

bool EtcdMembership::etcd_outage() const { return impl_->outage.load(); }

bool EtcdMembership::joining() const { return impl_->joining.load(); }

std::string EtcdMembership::joining_reason() const {
  std::lock_guard<std::mutex> l(impl_->reason_mu);
  return impl_->join_reason;
}

void EtcdMembership::Stop(LeaveMode mode) {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop = true;
    impl_->leave_mode = mode;
  }
  impl_->cv.notify_all();
  impl_->client.Interrupt();
}

}  // namespace kvpool
