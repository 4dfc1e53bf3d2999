#include "node/local_ops.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "blocks/descriptor_table.h"
#include "common/log.h"
#include "node/hints_api.h"
#include "protocol/descriptor_format.h"

namespace kvpool {

using protocol::FrameHeader;
using protocol::MessageType;

namespace {
constexpr const char* kOpNames[] = {"",
                                    "hello",
                                    "reserve",
                                    "commit",
                                    "abort",
                                    "acquire",
                                    "release",
                                    "exists",
                                    "put",
                                    "get",
                                    "remove",
                                    "stats",
                                    "flush",
                                    "clear",
                                    "reserve_described",
                                    "put_described",
                                    "lookup_prefix",
                                    "hint"};
}  // namespace

LocalOps::LocalOps(const LocalServerOptions& o, TieredStore* tiered, ClusterFaces cluster,
                   int wake_fd, MetricsRegistry* m, std::function<std::string()> stats_json,
                   const std::vector<LocalTenant>& tenants)
    : opts_(o), metrics_(m), stats_json_(std::move(stats_json)) {
  auto add = [&](const std::string& name, TieredStore* store, ClusterFaces faces) {
    Tenant t;
    t.name = name;
    t.store = store;
    t.remote = faces.reads;
    t.placement = faces.placement;
    t.parked = std::make_unique<ParkedReads>(store, faces.reads, wake_fd, m);
    t.keys = TenantKeys(name);
    Labels l = {{"tenant", name}};
    t.hits =
        m->GetCounter("kvpool_tenant_hits_total", "Acquire and get items that hit, per tenant", l);
    t.misses =
        m->GetCounter("kvpool_tenant_misses_total", "Acquire and get items that missed, per tenant",
                      l);
    t.rejected = m->GetCounter("kvpool_tenant_rejected_total",
                               "Put or reserve items refused (no space, too large), per tenant", l);
    t.bytes_written =
        m->GetCounter("kvpool_tenant_bytes_written_total", "Value bytes committed, per tenant", l);
    t.bytes_read =
        m->GetCounter("kvpool_tenant_bytes_read_total", "Value bytes handed to readers, per tenant",
                      l);
    tenants_.push_back(std::move(t));
  };
  add(kDefaultTenant, tiered, cluster);
  for (const auto& t : tenants) {
    add(t.spec.name, t.store, t.cluster);
    specs_.push_back(t.spec);
    for (const auto& [name, secret] : t.token_secrets) {
      token_tenants_[name] = {secret, static_cast<int>(tenants_.size() - 1)};
    }
  }
  for (int t = 1; t < kNumOps; ++t) {
    ops_[t] =
        m->GetCounter("kvpool_ops_total", "Requests handled, by operation", {{"op", kOpNames[t]}});
    latency_[t] = m->GetHistogram("kvpool_op_latency_seconds",
                                  "Time the node spent handling a request, by operation",
                                  {{"op", kOpNames[t]}});
  }
  items_ = m->GetCounter("kvpool_items_total", "Keys carried by requests (batch items)");
  clears_ = m->GetCounter("kvpool_namespace_clears_total", "Namespace clears served");
  cleared_ = m->GetCounter("kvpool_namespace_cleared_entries_total",
                           "Entries dropped by namespace clears");
  hits_ = m->GetCounter("kvpool_hits_total", "Acquire and get items that found the key");
  misses_ = m->GetCounter("kvpool_misses_total", "Acquire and get items that missed");
  exists_hits_ = m->GetCounter("kvpool_exists_hits_total", "Exists items that found the key");
  exists_misses_ = m->GetCounter("kvpool_exists_misses_total", "Exists items that missed");
  exists_prefix_hits_ =
      m->GetCounter("kvpool_exists_prefix_hits_total",
                    "Exists items in the leading run of hits of their call (the prefix a caller "
                    "can use)");
  for (const RecentWindow& rw : kRecentWindows) {
    Labels w = {{"window", rw.label}};
    m->AddCallbackGauge(
        "kvpool_hit_ratio_recent", "Acquire and get items that hit over all of them, recent window",
        w, [this, s = rw.seconds] { return recent_hits_.Ratio(s); }, this);
    m->AddCallbackGauge("kvpool_exists_prefix_hit_ratio_recent",
                        "Exists items in the leading run of hits of their call over all exists "
                        "items, recent window",
                        w, [this, s = rw.seconds] { return recent_prefix_.Ratio(s); }, this);
  }
  bytes_read_ = m->GetCounter("kvpool_bytes_read_total", "Value bytes handed to readers");
  bytes_written_ = m->GetCounter("kvpool_bytes_written_total", "Value bytes committed");
  copied_off_loop_ = m->GetCounter(
      "kvpool_commit_copy_bytes_total",
      "Committed bytes copied from staging areas into the segment by the copy threads "
      "(--copy-threads); smaller commits are copied by the local loop");
  put_failures_ = m->GetCounter("kvpool_put_failures_total",
                                "Put or reserve items refused (no space, too large)");
  descriptors_invalid_ =
      m->GetCounter("kvpool_descriptors_invalid_total",
                    "Put or reserve items refused for a malformed block descriptor");
}

LocalOps::~LocalOps() { metrics_->RemoveCallbacks(this); }

std::vector<ParkedReads::Request> LocalOps::TakeReady() {
  std::vector<ParkedReads::Request> ready = tenants_[0].parked->TakeReady();
  for (size_t i = 1; i < tenants_.size(); ++i) {
    for (auto& r : tenants_[i].parked->TakeReady()) ready.push_back(std::move(r));
  }
  return ready;
}

int LocalOps::TenantOf(uint32_t uid, const std::vector<uint32_t>& gids) const {
  return TenantOfCredentials(specs_, uid, gids) + 1;
}

void LocalOps::Bind(const LocalSession& c, std::vector<KeyId>* keys) {
  const TenantKeys& k = T(c).keys;
  if (k.identity()) return;
  for (auto& key : *keys) key = k.Bind(key);
}

void LocalOps::Bind(const LocalSession& c, std::vector<protocol::SizedKey>* keys) {
  const TenantKeys& k = T(c).keys;
  if (k.identity()) return;
  for (auto& item : *keys) item.key = k.Bind(item.key);
}

// Answers a parked request whose waits all finished, from the pins they
// took (a failed promotion or fetch is a miss).
void LocalOps::Resume(LocalSession& c, ParkedReads::Request& p) {
  c.pending = false;
  auto start = std::chrono::steady_clock::now();
  const auto type = static_cast<MessageType>(p.header.type);
  if (type == MessageType::kAcquire || type == MessageType::kGet) {
    // What is in DRAM by now of the keys the wait found nowhere (written
    // meanwhile): one more lookup, of those only.
    bool missing = false;
    for (const auto& pin : p.pins) missing |= !pin.valid();
    if (missing) T(c).store->PinHeld(p.keys, p.pins);
  }
  switch (type) {
    case MessageType::kAcquire:
      AnswerAcquire(c, p.header, p.keys, p.pins);
      break;
    case MessageType::kGet:
      AnswerGet(c, p.header, p.sized, p.pins);
      break;
    case MessageType::kCommit:
      FinishCommit(c, p.header, *p.commit);
      break;
    case MessageType::kLookupPrefix:
      if (!p.call_status.ok()) {
        QueueError(c, p.header.request_id, p.call_status);
      } else {
        out_.clear();
        protocol::EncodeString(p.answer, &out_);
        Queue(c, MessageType::kLookupPrefix, p.header.request_id, Status::Ok(), out_);
      }
      break;
    case MessageType::kHint:  // a prefetch: its reply's bytes
      if (!p.call_status.ok()) {
        QueueError(c, p.header.request_id, p.call_status);
      } else {
        out_.assign(p.answer.begin(), p.answer.end());
        Queue(c, MessageType::kHint, p.header.request_id, Status::Ok(), out_);
      }
      break;
    default:
      AnswerExists(c, p.header, p.keys, &p.remote_hits);
      break;
  }
  CountOp(p.header.type, start);
}

void LocalOps::ProtocolError(const char* reason) {
  auto it = protocol_errors_.find(reason);
  Counter* ctr;
  if (it == protocol_errors_.end()) {
    ctr = metrics_->GetCounter("kvpool_protocol_errors_total",
                               "Malformed or refused requests, by reason", {{"reason", reason}});
    protocol_errors_[reason] = ctr;
  } else {
    ctr = it->second;
  }
  ctr->Inc();
}

void LocalOps::Queue(LocalSession& c, MessageType type, uint64_t request_id, Status status,
                     const std::vector<uint8_t>& body) {
  auto frame = protocol::EncodeFrame(type, request_id, static_cast<int32_t>(status.code()), body,
                                     /*reply=*/true);
  c.out_bytes += frame.size();
  c.out.push_back(std::move(frame));
}

void LocalOps::QueueFrame(LocalSession& c, MessageType type, uint64_t request_id, Status status,
                          std::vector<uint8_t> frame) {
  protocol::SealFrame(type, request_id, static_cast<int32_t>(status.code()), /*reply=*/true,
                      &frame);
  c.out_bytes += frame.size();
  c.out.push_back(std::move(frame));
}

void LocalOps::QueueError(LocalSession& c, uint64_t request_id, const Status& s) {
  std::vector<uint8_t> body;
  protocol::EncodeString(s.message(), &body);
  Queue(c, MessageType::kError, request_id, s, body);
}

// A get or acquire is one read of its batch (ParkedReads::Read): what DRAM
// holds is pinned at once; keys only on SSD and, with a remote source, keys
// not held here wait without blocking the loop, the connection's later
// frames behind them. The request is parked with its decoded keys (moved
// out of keys_ / sized_) and its pins: a resumed request neither decodes
// nor looks up again. Returns true when parked; else pins_ holds the
// batch's pins.
bool LocalOps::ReadOrPark(LocalSession& c, const FrameHeader& h) {
  Tenant& t = T(c);
  const bool may_wait = c.handshaked && (t.store->has_ssd_tier() || t.remote != nullptr);
  ParkedReads::Request r = RequestOf(c, h);
  // The scratch vectors move into the request and come back when it is
  // answered now, so a read that does not park allocates nothing here.
  const bool get = static_cast<MessageType>(h.type) == MessageType::kGet;
  if (get) {
    keys_.clear();
    for (const auto& s : sized_) keys_.push_back(s.key);
    r.sized = std::move(sized_);
  }
  r.keys = std::move(keys_);
  r.pins = std::move(pins_);
  const bool parked = t.parked->Read(&r, may_wait);
  c.read_run = r.run;
  if (!parked) {  // not moved from: take the vectors back
    keys_ = std::move(r.keys);
    pins_ = std::move(r.pins);
    if (get) sized_ = std::move(r.sized);
    return false;
  }
  c.pending = true;
  parked_now_ = true;
  return true;
}

// An exists waits, as a read does, for the keys not held here (with a
// remote source).
bool LocalOps::ExistsOrPark(LocalSession& c, const FrameHeader& h) {
  if (!c.handshaked) return false;
  ParkedReads::Request r = RequestOf(c, h);
  r.keys = std::move(keys_);
  if (!T(c).parked->Exists(&r)) {
    keys_ = std::move(r.keys);
    return false;
  }
  c.pending = true;
  parked_now_ = true;
  return true;
}

ParkedReads::Request LocalOps::RequestOf(const LocalSession& c, const FrameHeader& h) {
  ParkedReads::Request r;
  r.fd = c.fd;
  r.conn_id = c.id;
  r.header = h;
  return r;
}

void LocalOps::Wrote(LocalSession& c, Tenant& t, uint64_t bytes) {
  bytes_written_->Inc(bytes);
  t.bytes_written->Inc(bytes);
  if (c.record) c.record->bytes_written.fetch_add(bytes, std::memory_order_relaxed);
}

void LocalOps::Read(LocalSession& c, uint64_t bytes) {
  bytes_read_->Inc(bytes);
  if (c.record) c.record->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
}

void LocalOps::CountOp(uint16_t type, std::chrono::steady_clock::time_point start) {
  ops_[type]->Inc();
  latency_[type]->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void LocalOps::Handle(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  auto start = std::chrono::steady_clock::now();
  auto type = static_cast<MessageType>(h.type);
  if (h.type == 0 || h.type >= kNumOps) {
    ProtocolError("unknown_type");
    QueueError(c, h.request_id, InvalidArgument(fmt::format("unknown message type {}", h.type)));
    return;
  }
  if (!c.handshaked && type != MessageType::kHello) {
    ProtocolError("no_handshake");
    QueueError(c, h.request_id, FailedPrecondition("the first message must be a hello"));
    c.closing = true;
    return;
  }
  if (c.record) c.record->ops.fetch_add(1, std::memory_order_relaxed);
  Status s;
  switch (type) {
    case MessageType::kHello:
      s = OnHello(c, h, body);
      break;
    case MessageType::kReserve:
    case MessageType::kReserveDescribed:
      s = OnReserve(c, h, body);
      break;
    case MessageType::kCommit:
      s = OnCommit(c, h, body);
      break;
    case MessageType::kAbort:
      s = OnAbort(c, body);
      break;
    case MessageType::kAcquire:
      s = OnAcquire(c, h, body);
      break;
    case MessageType::kRelease:
      s = OnRelease(c, body);
      break;
    case MessageType::kExists:
      s = OnExists(c, h, body);
      break;
    case MessageType::kPut:
    case MessageType::kPutDescribed:
      s = OnPut(c, h, body);
      break;
    case MessageType::kGet:
      s = OnGet(c, h, body);
      break;
    case MessageType::kRemove:
      s = OnRemove(c, h, body);
      break;
    case MessageType::kStats:
      s = OnStats(c, h, body);
      break;
    case MessageType::kFlush:
      s = OnFlush(c, h, body);
      break;
    case MessageType::kClear:
      s = OnClear(c, h, body);
      break;
    case MessageType::kLookupPrefix:
      s = OnLookupPrefix(c, h, body);
      break;
    case MessageType::kHint:
      s = OnHint(c, h, body);
      break;
    default:
      ProtocolError("unknown_type");
      QueueError(c, h.request_id, InvalidArgument(fmt::format("unknown message type {}", h.type)));
      return;
  }
  if (!s.ok()) {
    // A refused tenant token was counted under its own reason.
    if (s.code() != StatusCode::kPermissionDenied) {
      ProtocolError(s.code() == StatusCode::kInvalidArgument ? "malformed_body" : "refused");
    }
    QueueError(c, h.request_id, s);
  }
  if (parked_now_) {  // counted when it is answered
    parked_now_ = false;
    return;
  }
  CountOp(h.type, start);
}

Status LocalOps::OnHello(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  if (c.handshaked) return FailedPrecondition("hello sent twice");
  protocol::HelloRequest req;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeHello(body, &req));
  if (req.client_version != protocol::kProtocolVersion) {
    c.closing = true;
    return FailedPrecondition(
        fmt::format("client protocol version {} is not supported (node speaks {})",
                    req.client_version, protocol::kProtocolVersion));
  }
  if (req.has_token) {
    // A tenant token puts the connection in its tenant, whatever its uid.
    auto it = token_tenants_.find(req.token_name);
    if (it == token_tenants_.end() ||
        CRYPTO_memcmp(it->second.secret.data(), req.token.data(), req.token.size()) != 0) {
      c.closing = true;
      ProtocolError("bad_tenant_token");
      return PermissionDenied(fmt::format(
          "tenant token '{}' is not known to this node (tokens= in its tenants file, the secret "
          "in --client-token-file)",
          req.token_name.substr(0, 64)));
    }
    if (it->second.tenant != c.tenant && admit_tenant_) {
      if (Status s = admit_tenant_(it->second.tenant); !s.ok()) {
        c.closing = true;
        return s;
      }
    }
    c.tenant = it->second.tenant;
  }
  if (opts_.client_staging_bytes > 0) {
    auto staging = StagingArea::Create(opts_.client_staging_bytes);
    if (!staging.ok()) {
      c.closing = true;
      return ResourceExhausted("no staging memory for this connection: " +
                               staging.status().ToString());
    }
    c.staging = std::move(staging).value();
  }
  c.handshaked = true;
  if (c.record) {
    c.record->set_name(req.client_name);
    c.record->tenant.store(c.tenant, std::memory_order_relaxed);
  }
  protocol::HelloReply rep;
  rep.instance_id = opts_.instance_id;
  TieredStore* store = T(c).store;
  rep.segment_bytes = store->segment_bytes();
  rep.max_value_bytes = store->max_value_bytes();
  rep.max_batch = opts_.max_batch;
  rep.max_frame_bytes = opts_.max_frame_bytes;
  c.pass_fds[0] = store->segment_fd();
  if (c.staging) {
    rep.staging_bytes = c.staging->size();
    c.pass_fds[1] = c.staging->fd();
  }
  std::vector<uint8_t> out;
  protocol::EncodeHelloReply(rep, &out);
  Queue(c, MessageType::kHello, h.request_id, Status::Ok(), out);
  return Status::Ok();
}

// The sized keys of a reserve or put, and of a described one its
// descriptors: each checked here (descriptor_ok_: false fails that item
// with InvalidArgument, so no value is stored without the description it
// came with), kept in described_ (TakeDescriptor) for the commit.
Status LocalOps::DecodeSized(const FrameHeader& h, std::span<const uint8_t> body,
                             std::vector<protocol::SizedKey>* sized,
                             std::span<const uint8_t>* rest) {
  descriptor_ok_.clear();
  descriptors_.clear();  // views into an earlier request's body
  described_.clear();
  const auto type = static_cast<MessageType>(h.type);
  if (type != MessageType::kReserveDescribed && type != MessageType::kPutDescribed) {
    return protocol::DecodeSizedKeys(body, opts_.max_batch, sized, rest);
  }
  KVPOOL_RETURN_IF_ERROR(
      protocol::DecodeDescribedSizedKeys(body, opts_.max_batch, sized, &descriptors_, rest));
  descriptor_ok_.assign(sized->size(), true);
  described_.resize(sized->size());
  protocol::DescriptorView d;
  for (size_t i = 0; i < descriptors_.size(); ++i) {
    if (descriptors_[i].empty()) continue;
    Status s = protocol::ParseDescriptor(descriptors_[i], &d);
    if (s.ok()) {
      described_[i] = blocks::Descriptor::Make(descriptors_[i], d);
      continue;
    }
    descriptor_ok_[i] = false;
    descriptors_invalid_->Inc();
    if (descriptors_invalid_->Value() <= 10 || descriptors_invalid_->Value() % 1000 == 0) {
      LogWarn("refused a put of key {:016x}{:016x}: {} ({} refused so far)", (*sized)[i].key.hi,
              (*sized)[i].key.lo, s.message(), descriptors_invalid_->Value());
    }
  }
  return Status::Ok();
}

blocks::Descriptor LocalOps::TakeDescriptor(size_t i) {
  return i < described_.size() ? std::move(described_[i]) : blocks::Descriptor();
}

uint64_t LocalOps::Stage(const LocalSession& c, const KeyId& key, blocks::Descriptor descriptor) {
  // Only the default tenant's blocks are told (KV events, the block index).
  if (!descriptor || opts_.descriptors == nullptr || c.tenant != 0) return 0;
  return opts_.descriptors->Stage(key, std::move(descriptor));
}

void LocalOps::Unstage(const KeyId& key, uint64_t token) {
  if (token != 0) opts_.descriptors->Unstage(key, token);
}

// Parked until the cluster answers (LocalServerOptions::lookup_prefix).
Status LocalOps::OnLookupPrefix(LocalSession& c, const FrameHeader& h,
                                std::span<const uint8_t> body) {
  uint32_t timeout_ms = 0;
  std::vector<uint64_t> hashes;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeLookupPrefix(body, opts_.max_batch, &timeout_ms, &hashes));
  if (!opts_.lookup_prefix) return FailedPrecondition("this node answers no prefix lookups");
  if (c.tenant != 0) {
    return FailedPrecondition(
        "prefix lookups cover the default tenant's blocks; a tenant's client may not ask");
  }
  ParkedReads::Request r;
  r.fd = c.fd;
  r.conn_id = c.id;
  r.header = h;
  T(c).parked->ParkCall(&r, [&](ParkedReads::CallDone done) {
    opts_.lookup_prefix(std::move(hashes), timeout_ms, std::move(done));
  });
  c.pending = true;
  parked_now_ = true;
  return Status::Ok();
}

// Applies to this client's tenant's store (its keys bound to it, as a
// get's are) and, for keys held in neither tier, at their holders in the
// cluster (RunHint); parked until it is done.
Status LocalOps::OnHint(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  protocol::HintRequest m;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeHint(body, protocol::kMaxHintKeys, &m));
  const std::optional<HintOp> known = HintOpOf(m.op);
  if (!known) {
    CountHintRefused(metrics_, "bad_request");
    return InvalidArgument(fmt::format("unknown hint operation {}", m.op));
  }
  const HintOp op = *known;
  if (m.priority > 255) {
    CountHintRefused(metrics_, "bad_request");
    return InvalidArgument("a hint's priority must be in 0..255");
  }
  Bind(c, &m.keys);
  items_->Inc(m.keys.size());
  // Answered once done: at once here, or after promotions and the cluster's
  // holders (keys held elsewhere).
  ParkedReads::Request r;
  r.fd = c.fd;
  r.conn_id = c.id;
  r.header = h;
  T(c).parked->ParkCall(&r, [&](ParkedReads::CallDone done) {
    const auto ttl =
        std::chrono::milliseconds(std::min<uint64_t>(m.ttl_ms, INT64_MAX / 1'000'000'000));
    RunHint(
        T(c).store, T(c).remote, op, std::move(m.keys), ttl, static_cast<uint8_t>(m.priority),
        [op, metrics = metrics_, tenant = T(c).name,
         done = std::move(done)](Result<HintResult> res) {
          CountHint(metrics, tenant, op, res);
          if (!res.ok()) return done(res.status(), std::string());
          std::vector<uint8_t> out;
          protocol::EncodeHintReply({res->applied, res->unknown, res->clipped, res->moved}, &out);
          done(Status::Ok(), std::string(out.begin(), out.end()));
        });
  });
  c.pending = true;
  parked_now_ = true;
  return Status::Ok();
}

Status LocalOps::OnReserve(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(DecodeSized(h, body, &sized_, nullptr));
  Bind(c, &sized_);
  items_->Inc(sized_.size());
  NoteChain(c, sized_);
  regions_.assign(sized_.size(), {});
  Tenant& t = T(c);
  for (size_t i = 0; i < sized_.size(); ++i) {
    if (!descriptor_ok_.empty() && !descriptor_ok_[i]) {
      regions_[i].status = static_cast<int32_t>(StatusCode::kInvalidArgument);
      continue;
    }
    if (c.staging && t.placement != nullptr && t.placement->WouldForward(sized_[i].key) &&
        !t.store->Contains(sized_[i].key)) {
      // Placement chain: staged here, sent to its node at the commit.
      const uint64_t staged = c.staging->Allocate(sized_[i].size);
      if (staged != StagingArea::kNone) {
        uint64_t handle = c.next_handle++;
        regions_[i] = {0, handle, staged, sized_[i].size};
        LocalSession::Reserved fwd{
            {}, staged, h.request_id, sized_[i].key, sized_[i].size, TakeDescriptor(i)};
        c.reservations.emplace(handle, std::move(fwd));
        continue;
      }
    }
    auto r = t.store->Reserve(sized_[i].key, sized_[i].size);
    if (!r.ok()) {
      regions_[i].status = static_cast<int32_t>(r.status().code());
      if (r.status().code() != StatusCode::kAlreadyExists) {
        put_failures_->Inc();
        t.rejected->Inc();
      }
      continue;
    }
    uint64_t staged = StagingArea::kNone;
    if (c.staging) {
      staged = c.staging->Allocate(sized_[i].size);
      if (staged == StagingArea::kNone) {  // the batch outgrew the staging area
        regions_[i].status = static_cast<int32_t>(StatusCode::kResourceExhausted);
        put_failures_->Inc();
        t.rejected->Inc();
        continue;
      }
    }
    uint64_t handle = c.next_handle++;
    regions_[i] = {0, handle, c.staging ? staged : r->offset(), r->size()};
    c.reservations.emplace(
        handle, LocalSession::Reserved{
                    std::move(r).value(), staged, h.request_id, {}, 0, TakeDescriptor(i)});
  }
  out_.clear();
  protocol::EncodeRegionItems(regions_, &out_);
  Queue(c, static_cast<MessageType>(h.type), h.request_id, Status::Ok(), out_);
  return Status::Ok();
}

// A forwarded reservation's commit: sends the staged bytes to their node,
// or stores them here when that cannot be done now.
Status LocalOps::CommitForwarded(LocalSession& c, const LocalSession::Reserved& res) {
  Tenant& t = T(c);
  std::span<const uint8_t> value(c.staging->data(res.staging_offset), res.forward_size);
  Status s = Status::Ok();
  if (!t.placement->Forward(res.forward_key, value)) {
    auto r = t.store->Reserve(res.forward_key, res.forward_size);
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kAlreadyExists) {
        put_failures_->Inc();
        t.rejected->Inc();
      }
      return r.status();
    }
    std::memcpy(r->data(), value.data(), value.size());
    const uint64_t token = Stage(c, res.forward_key, res.descriptor);
    s = t.store->Commit(std::move(r).value(), WriteOrigin::kPut, nullptr,
                        Returning(t, res.forward_key));
    if (!s.ok()) Unstage(res.forward_key, token);
    if (s.ok()) publish_due_ = t.placement;  // stored here after all (PublishStored)
  }
  if (s.ok()) {
    Wrote(c, t, res.forward_size);
  }
  return s;
}

// A commit's copies (staging → slot) run on the copy executor when it has
// one and they are large: the request parks, its connection's later frames
// waiting behind it, and FinishCommit answers it on the loop. Otherwise the
// loop copies and commits at once.
Status LocalOps::OnCommit(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeHandles(body, opts_.max_batch, &handles_));
  items_->Inc(handles_.size());
  CommitCopies& cc = inline_commit_;
  TakeReservations(c, &cc);
  if (copy_ != nullptr && StagedBytes(cc) >= kInlineCopyBytes) {
    auto parked = std::make_shared<CommitCopies>();
    parked->items = std::move(cc.items);
    parked->statuses = std::move(cc.statuses);
    parked->staging = std::move(cc.staging);
    cc.Clear();
    ParkedReads::Request r = RequestOf(c, h);
    r.commit = parked;
    T(c).parked->ParkCall(&r, [this, parked](ParkedReads::CallDone done) {
      StartCopies(parked.get(), std::move(done));
    });
    c.pending = true;
    parked_now_ = true;
    return Status::Ok();
  }
  for (auto& item : cc.items) {
    if (!FromStaging(item)) continue;
    std::memcpy(item->slot.data(), cc.staging->data(item->staging_offset), item->size());
  }
  FinishCommit(c, h, cc);
  cc.Clear();
  return Status::Ok();
}

void LocalOps::TakeReservations(LocalSession& c, CommitCopies* cc) {
  cc->items.resize(handles_.size());
  cc->statuses.assign(handles_.size(), 0);
  cc->staging = c.staging;
  for (size_t i = 0; i < handles_.size(); ++i) {
    auto it = c.reservations.find(handles_[i]);
    if (it == c.reservations.end()) {
      cc->statuses[i] = static_cast<int32_t>(StatusCode::kInvalidArgument);
      continue;
    }
    cc->items[i].emplace(std::move(it->second));
    c.reservations.erase(it);
  }
}

uint64_t LocalOps::StagedBytes(const CommitCopies& cc) {
  uint64_t bytes = 0;
  for (const auto& item : cc.items) {
    if (FromStaging(item)) bytes += item->size();
  }
  return bytes;
}

void LocalOps::StartCopies(CommitCopies* cc, std::function<void(Status, std::string)> done) {
  struct Range {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t len;
  };
  const uint64_t total = StagedBytes(*cc);
  copied_off_loop_->Inc(total);
  const uint64_t jobs_wanted =
      std::max<uint64_t>(1, std::min<uint64_t>(copy_threads_, total / kMinCopyJobBytes));
  const uint64_t share = (total + jobs_wanted - 1) / jobs_wanted;
  // Cut the items' bytes into jobs of `share` bytes each, in order; a value
  // larger than what is left of a job's share continues in the next job.
  std::vector<std::vector<Range>> jobs(1);
  uint64_t in_job = 0;
  for (auto& item : cc->items) {
    if (!FromStaging(item)) continue;
    uint8_t* dst = item->slot.data();
    const uint8_t* src = cc->staging->data(item->staging_offset);
    uint64_t left = item->size();
    while (left > 0) {
      if (in_job == share) {
        jobs.emplace_back();
        in_job = 0;
      }
      const uint64_t n = std::min(left, share - in_job);
      jobs.back().push_back({dst, src, n});
      dst += n;
      src += n;
      left -= n;
      in_job += n;
    }
  }
  cc->jobs_left.store(jobs.size(), std::memory_order_relaxed);
  auto shared_done = std::make_shared<std::function<void(Status, std::string)>>(std::move(done));
  for (auto& ranges : jobs) {
    // The last job to finish answers; none touches cc after its decrement.
    copy_->Submit([cc, ranges = std::move(ranges), shared_done] {
      for (const Range& r : ranges) std::memcpy(r.dst, r.src, r.len);
      if (cc->jobs_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        (*shared_done)(Status::Ok(), std::string());
      }
    });
  }
}

void LocalOps::FinishCommit(LocalSession& c, const FrameHeader& h, CommitCopies& cc) {
  statuses_ = cc.statuses;
  Tenant& t = T(c);
  bool stored = false;  // here: published before the answer (PublishStored)
  for (size_t i = 0; i < cc.items.size(); ++i) {
    if (!cc.items[i]) continue;
    LocalSession::Reserved& res = *cc.items[i];
    const uint64_t size = res.size();
    if (!res.slot.valid()) {
      statuses_[i] = static_cast<int32_t>(CommitForwarded(c, res).code());
      cc.staging->Free(res.staging_offset, size);
      continue;
    }
    if (res.staging_offset != StagingArea::kNone) cc.staging->Free(res.staging_offset, size);
    if (res.batch != c.chain_batch) {
      c.chain_batch = res.batch;
      c.chain = TieredStore::Chain{};
      c.chain.run = std::exchange(c.read_run, UINT8_MAX);
    }
    const KeyId key = res.slot.key();
    const uint64_t token = Stage(c, key, std::move(res.descriptor));
    Status s = t.store->Commit(std::move(res.slot), WriteOrigin::kPut, &c.chain, Returning(t, key));
    if (!s.ok()) Unstage(key, token);
    statuses_[i] = static_cast<int32_t>(s.code());
    if (s.ok()) {
      Wrote(c, t, size);
      stored = true;
    }
  }
  if (stored && t.placement != nullptr) publish_due_ = t.placement;  // PublishStored
  out_.clear();
  protocol::EncodeStatuses(statuses_, &out_);
  Queue(c, MessageType::kCommit, h.request_id, Status::Ok(), out_);
}

Status LocalOps::OnAbort(LocalSession& c, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeHandles(body, opts_.max_batch, &handles_));
  for (uint64_t hd : handles_) {
    auto it = c.reservations.find(hd);
    if (it == c.reservations.end()) continue;
    if (it->second.staging_offset != StagingArea::kNone) {
      c.staging->Free(it->second.staging_offset, it->second.size());
    }
    c.reservations.erase(it);
  }
  return Status::Ok();
}

Status LocalOps::OnAcquire(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeKeys(body, opts_.max_batch, &keys_));
  Bind(c, &keys_);
  items_->Inc(keys_.size());
  if (ReadOrPark(c, h)) return Status::Ok();
  AnswerAcquire(c, h, keys_, pins_);
  return Status::Ok();
}

// pins: the batch's, per key (empty: a miss); handed to the session.
void LocalOps::AnswerAcquire(LocalSession& c, const FrameHeader& h, const std::vector<KeyId>& keys,
                             std::vector<TieredStore::Pin>& pins) {
  regions_.assign(keys.size(), {});
  uint64_t hits = 0, bytes = 0;
  Tenant& t = T(c);
  for (size_t i = 0; i < keys.size(); ++i) {
    TieredStore::Pin& p = pins[i];
    if (!p.valid()) {
      regions_[i].status = static_cast<int32_t>(StatusCode::kNotFound);
      continue;
    }
    uint64_t handle = c.next_handle++;
    regions_[i] = {0, handle, p.offset(), p.size()};
    ++hits;
    bytes += p.size();
    c.pins.emplace(handle, std::move(p));
  }
  hits_->Inc(hits);
  misses_->Inc(keys.size() - hits);
  recent_hits_.Add(hits, keys.size());
  Read(c, bytes);
  t.hits->Inc(hits);
  t.misses->Inc(keys.size() - hits);
  t.bytes_read->Inc(bytes);
  out_.clear();
  protocol::EncodeRegionItems(regions_, &out_);
  Queue(c, MessageType::kAcquire, h.request_id, Status::Ok(), out_);
}

Status LocalOps::OnRelease(LocalSession& c, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeHandles(body, opts_.max_batch, &handles_));
  for (uint64_t hd : handles_) c.pins.erase(hd);
  return Status::Ok();
}

Status LocalOps::OnExists(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeKeys(body, opts_.max_batch, &keys_));
  Bind(c, &keys_);
  items_->Inc(keys_.size());
  c.read_run = UINT8_MAX;  // a request's lookup: no read of its chain yet
  if (ExistsOrPark(c, h)) return Status::Ok();
  AnswerExists(c, h, keys_, nullptr);
  return Status::Ok();
}

// remote_hits: what the cluster holds, for a resumed request.
void LocalOps::AnswerExists(LocalSession& c, const FrameHeader& h, const std::vector<KeyId>& keys,
                            const std::set<KeyId>* remote_hits) {
  protocol::ExistsReply rep;
  rep.hits.resize(keys.size());
  bool prefix = true;
  uint64_t hits = 0;
  TieredStore* store = T(c).store;
  for (size_t i = 0; i < keys.size(); ++i) {
    bool hit =
        store->Contains(keys[i]) || (remote_hits != nullptr && remote_hits->count(keys[i]) > 0);
    rep.hits[i] = hit ? 1 : 0;
    hits += hit;
    if (!hit) prefix = false;
    if (prefix) ++rep.prefix_len;
  }
  exists_hits_->Inc(hits);
  exists_misses_->Inc(keys.size() - hits);
  // The chain only a cluster's placement uses (NoteChain).
  c.chain_open = T(c).placement != nullptr && rep.prefix_len < keys.size();
  if (c.chain_open) {
    c.chain_next = keys[rep.prefix_len];
    c.chain_hits.assign(keys.begin(), keys.begin() + rep.prefix_len);
  }
  exists_prefix_hits_->Inc(rep.prefix_len);
  recent_prefix_.Add(rep.prefix_len, keys.size());
  out_.clear();
  protocol::EncodeExistsReply(rep, &out_);
  Queue(c, MessageType::kExists, h.request_id, Status::Ok(), out_);
}

void LocalOps::PublishStored() {
  if (publish_due_ == nullptr) return;
  publish_due_->PublishNow();
  publish_due_ = nullptr;
}

void LocalOps::NoteChain(LocalSession& c, const std::vector<protocol::SizedKey>& keys) {
  if (!c.chain_open || keys.empty()) return;
  RemotePlacement* placement = T(c).placement;
  if (placement == nullptr) return;
  // Where the batch starts: the key the call stopped at, or a hit of it
  // that was gone by the read (the rest is written from that hit).
  auto at = c.chain_hits.end();
  if (keys[0].key != c.chain_next) {
    at = std::find(c.chain_hits.begin(), c.chain_hits.end(), keys[0].key);
    if (at == c.chain_hits.end()) return;
  }
  c.chain_open = false;
  chain_keys_.clear();
  for (const auto& k : keys) chain_keys_.push_back(k.key);
  placement->NoteChain(at == c.chain_hits.begin() ? nullptr : &*(at - 1), chain_keys_);
}

Status LocalOps::OnPut(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  std::span<const uint8_t> data;
  KVPOOL_RETURN_IF_ERROR(DecodeSized(h, body, &sized_, &data));
  Bind(c, &sized_);
  uint64_t total = 0;
  for (const auto& it : sized_) {
    if (it.size > data.size()) return InvalidArgument("malformed put: value sizes exceed the body");
    total += it.size;
  }
  if (total != data.size())
    return InvalidArgument("malformed put: value sizes do not add up to the body");
  items_->Inc(sized_.size());
  NoteChain(c, sized_);
  statuses_.assign(sized_.size(), 0);
  uint64_t off = 0;
  Tenant& t = T(c);
  bool stored = false;          // here: published before the answer (PublishStored)
  TieredStore::Chain chain;     // the batch is a chain (TieredStore::Commit)
  for (size_t i = 0; i < sized_.size(); ++i) {
    const uint8_t* src = data.data() + off;
    off += sized_[i].size;
    if (!descriptor_ok_.empty() && !descriptor_ok_[i]) {
      statuses_[i] = static_cast<int32_t>(StatusCode::kInvalidArgument);
      continue;
    }
    // Placement chain: a value that lives on another node goes there at once.
    if (t.placement != nullptr && t.placement->WouldForward(sized_[i].key) &&
        !t.store->Contains(sized_[i].key) &&
        t.placement->Forward(sized_[i].key, {src, sized_[i].size})) {
      Wrote(c, t, sized_[i].size);
      continue;
    }
    const KeyId& key = sized_[i].key;
    uint64_t token = 0;  // the descriptor, staged for the commit
    Status s =
        t.store->Put(key, {src, sized_[i].size}, {WriteOrigin::kPut, &chain, Returning(t, key)},
                     [&] { token = Stage(c, key, TakeDescriptor(i)); });
    statuses_[i] = static_cast<int32_t>(s.code());
    if (s.ok()) {
      Wrote(c, t, sized_[i].size);
      stored = true;
      continue;
    }
    Unstage(key, token);
    if (s.code() != StatusCode::kAlreadyExists) {
      put_failures_->Inc();
      t.rejected->Inc();
    }
  }
  if (stored && t.placement != nullptr) publish_due_ = t.placement;  // PublishStored
  out_.clear();
  protocol::EncodeStatuses(statuses_, &out_);
  Queue(c, static_cast<MessageType>(h.type), h.request_id, Status::Ok(), out_);
  return Status::Ok();
}

Status LocalOps::OnGet(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeSizedKeys(body, opts_.max_batch, &sized_, nullptr));
  Bind(c, &sized_);
  items_->Inc(sized_.size());
  if (ReadOrPark(c, h)) return Status::Ok();
  AnswerGet(c, h, sized_, pins_);
  return Status::Ok();
}

// pins: the batch's, per key (empty: a miss); released once copied.
void LocalOps::AnswerGet(LocalSession& c, const FrameHeader& h,
                         const std::vector<protocol::SizedKey>& sized,
                         std::vector<TieredStore::Pin>& pins) {
  const size_t n = sized.size();
  std::vector<protocol::GetItem> items(n);
  uint64_t total = 0, hits = 0;
  Tenant& t = T(c);
  for (size_t i = 0; i < n; ++i) {
    const TieredStore::Pin& p = pins[i];
    if (!p.valid()) {
      items[i].status = static_cast<int32_t>(StatusCode::kNotFound);
      continue;
    }
    ++hits;
    items[i].size = p.size();
    if (p.size() > sized[i].size || total + p.size() > opts_.max_frame_bytes) {
      items[i].status = static_cast<int32_t>(StatusCode::kResourceExhausted);
      pins[i].Reset();
      continue;
    }
    total += p.size();
  }
  hits_->Inc(hits);
  misses_->Inc(n - hits);
  recent_hits_.Add(hits, n);
  t.hits->Inc(hits);
  t.misses->Inc(n - hits);
  t.bytes_read->Inc(total);
  // The reply frame is built in place: each value is copied once, from its
  // slot into the frame.
  std::vector<uint8_t> frame;
  frame.reserve(protocol::kHeaderBytes + 4 + 12 * n + total);
  frame.resize(protocol::kHeaderBytes);
  protocol::EncodeGetItems(items, &frame);
  for (auto& p : pins) {
    if (!p.valid()) continue;
    frame.insert(frame.end(), p.data(), p.data() + p.size());
    p.Reset();
  }
  Read(c, total);
  QueueFrame(c, MessageType::kGet, h.request_id, Status::Ok(), std::move(frame));
}

Status LocalOps::OnRemove(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeKeys(body, opts_.max_batch, &keys_));
  Bind(c, &keys_);
  items_->Inc(keys_.size());
  statuses_.assign(keys_.size(), 0);
  TieredStore* store = T(c).store;
  for (size_t i = 0; i < keys_.size(); ++i) {
    statuses_[i] = static_cast<int32_t>(store->Remove(keys_[i]).code());
  }
  out_.clear();
  protocol::EncodeStatuses(statuses_, &out_);
  Queue(c, MessageType::kRemove, h.request_id, Status::Ok(), out_);
  return Status::Ok();
}

Status LocalOps::OnStats(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  if (!body.empty()) return InvalidArgument("malformed stats request: body must be empty");
  std::string json = stats_json_ ? stats_json_() : "{}";
  if (has_tenants()) {
    // A client sees its own tenant's figures, not the others': its row,
    // and its store's DRAM, SSD and connections in place of the node's.
    auto j = nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.contains("tenants") && j["tenants"].is_array()) {
      nlohmann::ordered_json own = nlohmann::ordered_json::array();
      for (const auto& t : j["tenants"]) {
        if (t.value("name", "") != T(c).name) continue;
        j["dram"] = t["dram"];
        j["ssd"] = t["ssd"];
        j["local_connections"] = t["connections"];
        own.push_back(t);
      }
      j["tenants"] = std::move(own);
      json = j.dump();
    }
  }
  out_.clear();
  protocol::EncodeString(json, &out_);
  Queue(c, MessageType::kStats, h.request_id, Status::Ok(), out_);
  return Status::Ok();
}

// A durability barrier: the SSD tier writes its partly filled regions.
// Blocks the loop for the flush (an operator action, not a data path).
Status LocalOps::OnFlush(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  if (!body.empty()) return InvalidArgument("malformed flush request: body must be empty");
  Status s = T(c).store->Flush();
  Queue(c, MessageType::kFlush, h.request_id, s, {});
  return Status::Ok();
}

// Drops one namespace of the client's tenant. Blocks the loop while DRAM's
// index is walked and, with an SSD tier, its records listed (an operator or
// engine reset action, not a data path).
Status LocalOps::OnClear(LocalSession& c, const FrameHeader& h, std::span<const uint8_t> body) {
  uint32_t tag = 0;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeU32Body(body, &tag));
  if (T(c).remote != nullptr) {
    // The pooled store: the namespace's keys live on other nodes too, and a
    // miss here reads them from there.
    return FailedPrecondition(
        "clear: this node's store is pooled with a cluster, where a clear of one node would "
        "leave the namespace served by the others; use a new namespace instead");
  }
  const uint64_t dropped = T(c).store->ClearNamespace(tag);
  clears_->Inc();
  cleared_->Inc(dropped);
  LogInfo("namespace {:08x} of tenant {} cleared: {} entries dropped", tag, T(c).name, dropped);
  out_.clear();
  protocol::EncodeU64Body(dropped, &out_);
  Queue(c, MessageType::kClear, h.request_id, Status::Ok(), out_);
  return Status::Ok();
}

}  // namespace kvpool
