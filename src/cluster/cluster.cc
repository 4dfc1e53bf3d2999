#include "cluster/cluster.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "cluster/peer_handler.h"
#include "common/log.h"
#include "membership/etcd_membership.h"
#include "membership/static_membership.h"
#include "peer/peer_messages_format.h"
#include "transport/ucx_transport.h"

namespace kvpool {

Status ClusterOptions::Validate() const {
  if (node_id.empty()) return InvalidArgument("cluster: node id is empty");
  if (!etcd.empty() && !peers.empty()) {
    return InvalidArgument("--etcd and --peers are exclusive: membership comes from one of them");
  }
  if (!etcd_security.empty()) {
    if (etcd.empty()) {
      return InvalidArgument(
          "--etcd-user, --etcd-password-file, --etcd-ca-file, --etcd-cert-file "
          "and --etcd-key-file need --etcd");
    }
    // The password file and the TLS files, at start rather than at the first call.
    KVPOOL_ASSIGN_OR_RETURN(EtcdSecurityOptions security, etcd_security.Load());
    KVPOOL_RETURN_IF_ERROR(
        (EtcdClientOptions{etcd, std::chrono::milliseconds(1000), security}.Validate()));
  }
  if (!peers.empty() && transport.listen_port == 0) {
    return InvalidArgument("--peers needs --peer-port: the static list names fixed ports");
  }
  if (cluster.empty()) return InvalidArgument("--cluster is empty");
  return Status::Ok();
}

namespace {

std::string OrNone(const std::string& s) { return s.empty() ? "(none)" : s; }

// A registration's proof under one key: "KEYID:MAC", both lowercase hex.
std::string ProofOf(const transport::ClusterKey& key, const std::string& record) {
  std::string out = fmt::format("{:016x}:", key.id);
  for (uint8_t b : transport::MemberProofMac(key, record)) out += fmt::format("{:02x}", b);
  return out;
}

std::string HostNameOr(const std::string& fallback) {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return fallback;
  return buf;
}

class ClusterImpl final : public Cluster {
 public:
  explicit ClusterImpl(const ClusterOptions& o) : opts_(o) {}

  void Adopt(std::unique_ptr<transport::Transport> t, std::unique_ptr<Membership> m) {
    transport_ = std::move(t);
    membership_ = std::move(m);
    static_ = dynamic_cast<StaticMembership*>(membership_.get());
    sub_ = membership_->SubscribeViews(
        [this](const std::shared_ptr<const MembershipView>& v) { OnView(*v); });
    OnView(*membership_->view());
  }

  ~ClusterImpl() override {
    if (membership_ != nullptr && sub_ != 0) membership_->Unsubscribe(sub_);
    {
      // A lease status request may still come in until the transport goes.
      std::lock_guard lock(lease_mu_);
      lease_source_ = nullptr;
    }
    // Stopping the transport fails the calls in flight, whose callbacks ask
    // the cluster for its view and fencing: the membership must still be
    // here. Then the membership goes before the transport: nothing calls
    // peers then.
    if (transport_ != nullptr) transport_->Stop();
    membership_.reset();
    transport_.reset();
  }

  Status Init(Executor* handler_executor, MetricsRegistry* metrics) {
    EtcdSecurityOptions etcd_security;
    if (!opts_.etcd.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(etcd_security, opts_.etcd_security.Load());
    }
    transport::UcxTransportOptions to = opts_.transport;
    if (to.advertise_host.empty() && (to.listen_host == "0.0.0.0" || to.listen_host == "::")) {
      to.advertise_host = HostNameOr("127.0.0.1");
    }
    to.handler_executor = handler_executor;
    to.metrics = metrics;
    to.client_message_types = {cluster::kPeerLookup, cluster::kPeerFetch, cluster::kPeerStore,
                               cluster::kPeerMembers};
    to.identity = opts_.node_id;
    std::unique_ptr<transport::UcxTransport> ucx;
    KVPOOL_ASSIGN_OR_RETURN(ucx, transport::UcxTransport::Open(to));
    transport::UcxTransport* ucx_transport = ucx.get();
    transport_ = std::move(ucx);
    std::string address = transport_->address();

    if (!opts_.etcd.empty()) {
      EtcdMembershipOptions eo;
      eo.endpoints = opts_.etcd;
      eo.security = std::move(etcd_security);
      if (!eo.security.user.empty() || !eo.security.ca_file.empty() ||
          !eo.security.cert_file.empty()) {
        LogInfo("cluster: etcd as user {} (password from {}), CA {}, client certificate {}",
                OrNone(eo.security.user), OrNone(opts_.etcd_security.password_file),
                OrNone(eo.security.ca_file), OrNone(eo.security.cert_file));
      }
      eo.cluster = opts_.cluster;
      eo.node_id = opts_.node_id;
      eo.address = address;
      eo.weight = opts_.weight;
      eo.lease_ttl = opts_.lease_ttl;
      eo.request_timeout = std::min(std::chrono::milliseconds(1000), opts_.lease_ttl / 4);
      eo.probe_peers = [this](transport::Deadline deadline) { return ProbePeers(deadline); };
      eo.old_lease_wait = EtcdMembershipOptions::OldLeaseWait::kInRun;
      eo.on_refused = opts_.on_refused;
      if (!opts_.transport.cluster_keys.empty()) {
        // Registrations prove holding the cluster key: one proof per key
        // held (both while a new key is rolled out), "KEYID:MAC" in hex;
        // one good proof under any key held here is enough.
        std::vector<transport::ClusterKey> keys;
        for (const auto& k : opts_.transport.cluster_keys) {
          if (k.principal.empty()) keys.push_back(k);
        }
        eo.prove = [keys](const std::string& record) {
          std::vector<std::string> out;
          for (const auto& k : keys) out.push_back(ProofOf(k, record));
          return out;
        };
        eo.verify = [keys, accept_missing = opts_.accept_unproven_members](
                        const std::string& record, const std::vector<std::string>& proofs) {
          if (proofs.empty() && accept_missing) return true;  // a rolling upgrade
          for (const auto& k : keys) {
            const std::string want = ProofOf(k, record);
            for (const auto& p : proofs) {
              if (p.size() == want.size() &&
                  CRYPTO_memcmp(p.data(), want.data(), want.size()) == 0) {
                return true;
              }
            }
          }
          return false;
        };
      }
      std::unique_ptr<EtcdMembership> em;
      KVPOOL_ASSIGN_OR_RETURN(em, EtcdMembership::Open(eo, metrics));
      etcd_ = em.get();
      {
        std::lock_guard lock(lease_mu_);
        lease_source_ = etcd_;
      }
      membership_ = std::move(em);
    } else {
      StaticMembershipOptions so;
      so.node_id = opts_.node_id;
      // Each start is a new instance; later starts get larger numbers (on
      // one host's clock), which is all peers compare.
      so.incarnation = static_cast<uint64_t>(
          std::chrono::system_clock::now().time_since_epoch() / std::chrono::microseconds(1));
      KVPOOL_ASSIGN_OR_RETURN(so.peers, ParseStaticPeers(opts_.peers));
      std::unique_ptr<StaticMembership> sm;
      KVPOOL_ASSIGN_OR_RETURN(sm, StaticMembership::Open(so, metrics));
      static_ = sm.get();
      membership_ = std::move(sm);
    }
    // Handshakes from now on name this node's incarnation too.
    ucx_transport->SetIdentity(fmt::format("{}/{}", opts_.node_id, membership_->incarnation()));
    sub_ = membership_->SubscribeViews(
        [this](const std::shared_ptr<const MembershipView>& v) { OnView(*v); });
    OnView(*membership_->view());
    // Answered while fenced too: "fenced" is what the asker needs to hear.
    cluster::ServePeer(this, metrics,
                       {cluster::kPeerLeaseStatus, "lease_status", cluster::WhenFenced::kServe},
                       [this](transport::Incoming&, transport::Responder& r) {
                         std::vector<uint8_t> header;
                         cluster::EncodeLeaseStatusReply(LeaseStatus(), &header);
                         r.Respond(Status::Ok(), std::move(header));
                         return Status::Ok();
                       });
    metrics->AddCallbackGauge("kvpool_cluster_shards_owned",
                              "Shards whose home is this node in the current shard map", {},
                              [this] { return OwnedShards(); }, this);
    LogInfo("cluster {}: node {} incarnation {} peers at {} ({} members)", opts_.cluster,
            opts_.node_id, membership_->incarnation(), address, view()->members.size());
    metrics_ = metrics;
    return Status::Ok();
  }

  void Run() override {
    if (etcd_ != nullptr) {
      etcd_->Run();
      return;
    }
    std::unique_lock lock(run_mu_);
    run_cv_.wait(lock, [this] { return stopping_; });
  }

  void Stop() override {
    if (metrics_ != nullptr) metrics_->RemoveCallbacks(this);
    if (etcd_ != nullptr) etcd_->Stop(EtcdMembership::LeaveMode::kRevokeLease);
    std::lock_guard lock(run_mu_);
    stopping_ = true;
    run_cv_.notify_all();
  }

  const std::string& node_id() const override { return opts_.node_id; }
  uint64_t incarnation() const override { return membership_->incarnation(); }
  bool fenced() const override { return membership_->fenced(); }
  bool etcd_outage() const override { return etcd_ != nullptr && etcd_->etcd_outage(); }
  bool joining() const override { return etcd_ != nullptr && etcd_->joining(); }
  std::string joining_reason() const override {
    return etcd_ != nullptr ? etcd_->joining_reason() : std::string();
  }
  std::string address() const override { return transport_->address(); }
  transport::Transport* transport() const override { return transport_.get(); }
  Membership* membership() const override { return membership_.get(); }
  void ObservePeer(const std::string& node_id, uint64_t incarnation) override {
    if (static_ != nullptr) static_->ObservePeer(node_id, incarnation);
  }
  std::shared_ptr<const MembershipView> view() const override { return membership_->view(); }
  std::shared_ptr<const ShardMap> shard_map() const override {
    std::lock_guard lock(map_mu_);
    return map_;
  }

 private:
  void OnView(const MembershipView& v) {
    auto map = std::make_shared<const ShardMap>(ShardMap::Compute(v));
    std::lock_guard lock(map_mu_);
    map_ = std::move(map);
  }

  cluster::LeaseStatusReply LeaseStatus() const {
    cluster::LeaseStatusReply m;
    std::lock_guard lock(lease_mu_);
    if (lease_source_ == nullptr) return m;  // static membership: no lease
    EtcdMembership::LeaseState st = lease_source_->lease_state();
    m.fenced = st.fenced;
    m.has_lease = true;
    m.etcd_outage = st.etcd_outage;
    m.since_renewal_ms = static_cast<uint64_t>(std::max<int64_t>(0, st.since_renewal.count()));
    return m;
  }

  // Asks every other member how its lease fares (EtcdMembership's fencing
  // rule). Returns by the deadline: the transport finishes every call by it.
  std::vector<PeerLeaseReport> ProbePeers(transport::Deadline deadline) {
    std::vector<PeerLeaseReport> reports;
    for (const MemberReply& r : AskOtherMembers(cluster::kPeerLeaseStatus, deadline)) {
      PeerLeaseReport rep;
      cluster::LeaseStatusReply m;
      if (r.reply.status.ok() && cluster::DecodeLeaseStatusReply(r.reply.header, &m).ok()) {
        // Older than a day reads as a day: no overflow, same verdict.
        uint64_t ms = std::min<uint64_t>(m.since_renewal_ms, 86'400'000);
        rep.answered = true;
        rep.fenced = m.fenced;
        rep.has_lease = m.has_lease;
        rep.renewed_at = r.received - std::chrono::milliseconds(ms);
      }
      reports.push_back(rep);
    }
    return reports;
  }

  std::vector<MemberReply> AskOtherMembers(transport::MessageType type,
                                           transport::Deadline deadline) override {
    struct Pending {
      std::mutex mu;
      std::condition_variable cv;
      size_t left = 0;                  // protected by mu
      std::vector<MemberReply> replies;  // protected by mu
    };
    auto view = membership_->view();
    auto p = std::make_shared<Pending>();
    for (const Member& m : view->members) {
      if (m.node_id != opts_.node_id) p->replies.push_back(MemberReply{m, {}, {}});
    }
    p->left = p->replies.size();
    for (size_t i = 0; i < p->replies.size(); ++i) {
      transport::CallArgs args;
      args.peer = p->replies[i].member.address;
      args.type = type;
      args.deadline = deadline;
      transport_->Call(args, [p, i](transport::Reply r) {
        const auto now = std::chrono::steady_clock::now();
        std::lock_guard lock(p->mu);
        p->replies[i].reply = std::move(r);
        p->replies[i].received = now;
        if (--p->left == 0) p->cv.notify_all();
      });
    }
    std::unique_lock lock(p->mu);
    p->cv.wait(lock, [&] { return p->left == 0; });
    return std::move(p->replies);
  }

  double OwnedShards() const {
    auto counts = shard_map()->OwnershipCounts();
    auto it = counts.find(opts_.node_id);
    return it == counts.end() ? 0.0 : it->second;
  }

  const ClusterOptions opts_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<Membership> membership_;
  EtcdMembership* etcd_ = nullptr;  // membership_ when it is etcd's
  StaticMembership* static_ = nullptr;  // membership_ when it is a static list
  mutable std::mutex lease_mu_;
  EtcdMembership* lease_source_ = nullptr;  // etcd_ until destruction; protected by lease_mu_
  uint64_t sub_ = 0;
  MetricsRegistry* metrics_ = nullptr;
  mutable std::mutex map_mu_;
  std::shared_ptr<const ShardMap> map_ = std::make_shared<const ShardMap>();  // protected by map_mu_
  std::mutex run_mu_;
  std::condition_variable run_cv_;
  bool stopping_ = false;  // protected by run_mu_
};

}  // namespace

std::unique_ptr<Cluster> Cluster::Assemble(std::string node_id,
                                           std::unique_ptr<transport::Transport> transport,
                                           std::unique_ptr<Membership> membership) {
  ClusterOptions o;
  o.node_id = std::move(node_id);
  auto c = std::make_unique<ClusterImpl>(o);
  c->Adopt(std::move(transport), std::move(membership));
  return c;
}

Result<std::unique_ptr<Cluster>> Cluster::Open(const ClusterOptions& options,
                                               Executor* handler_executor,
                                               MetricsRegistry* metrics) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto c = std::make_unique<ClusterImpl>(options);
  KVPOOL_RETURN_IF_ERROR(c->Init(handler_executor, metrics));
  return std::unique_ptr<Cluster>(std::move(c));
}

}  // namespace kvpool
