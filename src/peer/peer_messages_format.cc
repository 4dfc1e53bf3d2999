#include "peer/peer_messages_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <map>

#include "common/check.h"
#include "protocol/codec.h"

namespace kvpool::cluster {

using protocol::BodyReader;
using protocol::BodyWriter;

void EncodePublish(const PublishBatch& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.Str(m.node_id);
  w.U64(m.incarnation);
  w.U32(static_cast<uint32_t>(m.items.size()));
  for (const auto& it : m.items) {
    w.Key(it.key);
    w.U8(static_cast<uint8_t>(it.op));
    w.U64(it.size);
  }
}

Status DecodePublish(std::span<const uint8_t> body, PublishBatch* m) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.Str(kMaxNodeIdBytes, &m->node_id) && r.U64(&m->incarnation) &&
      r.Count(kMaxPeerBatch, 25, &n)) {
    m->items.resize(n);
    for (auto& it : m->items) {
      uint8_t op = 0;
      if (!(r.Key(&it.key) && r.U8(&op) && r.U64(&it.size))) break;
      if (op != 1 && op != 2) return InvalidArgument("malformed publish: bad op");
      it.op = static_cast<PublishOp>(op);
    }
  }
  return r.Finish("publish");
}

void EncodeLookup(std::span<const KeyId> keys, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.Key(k);
}

Status DecodeLookup(std::span<const uint8_t> body, std::vector<KeyId>* keys) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.Count(kMaxPeerBatch, 16, &n)) {
    keys->resize(n);
    for (auto& k : *keys) {
      if (!r.Key(&k)) break;
    }
  }
  return r.Finish("lookup");
}

void EncodeLookupReply(std::span<const LookupResult> results, std::vector<uint8_t>* out) {
  // Intern the holders into one table; keys refer to it by index.
  std::map<std::pair<std::string, uint64_t>, uint8_t> index;
  std::vector<const HolderRef*> table;
  for (const auto& r : results) {
    for (const auto& h : r.holders) {
      if (table.size() >= kMaxLookupNodes) break;
      auto [it, fresh] = index.emplace(std::make_pair(h.node_id, h.incarnation),
                                       static_cast<uint8_t>(table.size()));
      if (fresh) table.push_back(&h);
    }
  }
  BodyWriter w(out);
  w.U32(static_cast<uint32_t>(table.size()));
  for (const HolderRef* h : table) {
    w.Str(h->node_id);
    w.U64(h->incarnation);
  }
  w.U32(static_cast<uint32_t>(results.size()));
  for (const auto& r : results) {
    w.U64(r.holders.empty() && r.evicted_lately ? kLookupEvictedLately : r.size);
    std::vector<uint8_t> idx;
    for (const auto& h : r.holders) {
      auto it = index.find({h.node_id, h.incarnation});
      if (it != index.end() && idx.size() < kMaxHoldersPerKey) idx.push_back(it->second);
    }
    w.U8(static_cast<uint8_t>(idx.size()));
    for (uint8_t i : idx) w.U8(i);
  }
}

Status DecodeLookupReply(std::span<const uint8_t> body, size_t expected,
                         std::vector<LookupResult>* results) {
  BodyReader r(body);
  uint32_t nodes = 0;
  std::vector<HolderRef> table;
  if (r.Count(kMaxLookupNodes, 12, &nodes)) {
    table.resize(nodes);
    for (auto& h : table) {
      if (!(r.Str(kMaxNodeIdBytes, &h.node_id) && r.U64(&h.incarnation))) break;
    }
  }
  uint32_t n = 0;
  if (r.ok() && r.Count(kMaxPeerBatch, 9, &n)) {
    if (n != expected) return InvalidArgument("malformed lookup reply: wrong item count");
    results->assign(n, {});
    for (auto& res : *results) {
      uint8_t k = 0;
      if (!(r.U64(&res.size) && r.U8(&k))) break;
      if (k > kMaxHoldersPerKey) return InvalidArgument("malformed lookup reply: too many holders");
      for (uint8_t j = 0; j < k; ++j) {
        uint8_t i = 0;
        if (!r.U8(&i)) break;
        if (i >= table.size()) return InvalidArgument("malformed lookup reply: bad holder index");
        res.holders.push_back(table[i]);
      }
      if (res.size == kLookupEvictedLately && res.holders.empty()) {
        res.size = 0;
        res.evicted_lately = true;
      }
    }
  }
  return r.Finish("lookup reply");
}

void EncodeFetch(const KeyId& key, uint64_t max_size, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.Key(key);
  w.U64(max_size);
}

transport::MessageType ScopedType(transport::MessageType base, const std::string& tenant) {
  if (tenant.empty()) return base;
  switch (base) {
    case kPeerPublish:
      return kPeerTenantPublish;
    case kPeerLookup:
      return kPeerTenantLookup;
    case kPeerFetch:
      return kPeerTenantFetch;
    case kPeerStore:
      return kPeerTenantStore;
    case kPeerHint:
      return kPeerTenantHint;
    case kPeerHolderLookup:
      return kPeerTenantHolderLookup;
    default:
      break;
  }
  KVPOOL_CHECK(false &&
               "only publish, lookup, fetch, store, hint and holder lookup are tenant-scoped");
  return base;
}

void EncodeTenantScope(const std::string& tenant, std::span<const uint8_t> rest,
                       std::vector<uint8_t>* out) {
  if (!tenant.empty()) BodyWriter(out).Str(tenant);
  out->insert(out->end(), rest.begin(), rest.end());
}

Status DecodeTenantScope(std::span<const uint8_t> header, std::string* tenant,
                         std::span<const uint8_t>* rest) {
  BodyReader r(header);
  if (!r.Str(kMaxTenantNameBytes, tenant) || tenant->empty()) {
    return InvalidArgument(
        fmt::format("malformed tenant scope: {}", r.ok() ? "empty tenant name" : r.error()));
  }
  std::span<const uint8_t> left;
  r.Bytes(r.remaining(), &left);
  *rest = left;
  return Status::Ok();
}

Status DecodeFetch(std::span<const uint8_t> body, KeyId* key, uint64_t* max_size) {
  BodyReader r(body);
  r.Key(key) && r.U64(max_size);
  return r.Finish("fetch");
}

void EncodeStore(const KeyId& key, uint64_t size, const KeyId* after, uint8_t flags,
                 std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.Key(key);
  w.U64(size);
  if (after != nullptr) w.Key(*after);
  if (flags != 0) w.U8(flags);
}

Status DecodeStore(std::span<const uint8_t> body, KeyId* key, uint64_t* size,
                   std::optional<KeyId>* after, uint8_t* flags) {
  BodyReader r(body);
  after->reset();
  *flags = 0;
  if (r.Key(key) && r.U64(size)) {
    KeyId a;
    if (r.remaining() >= 16 && r.Key(&a)) *after = a;
    if (r.remaining() == 1 && r.U8(flags) && (*flags & ~kStoreReturning) != 0) {
      return InvalidArgument("malformed store: unknown flags");
    }
  }
  return r.Finish("store");
}

void EncodeFetchReply(uint64_t size, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U64(size);
}

Status DecodeFetchReply(std::span<const uint8_t> body, uint64_t* size) {
  BodyReader r(body);
  r.U64(size);
  return r.Finish("fetch reply");
}

void EncodeMembersReply(const MembershipView& view, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U64(view.epoch);
  w.U32(static_cast<uint32_t>(view.members.size()));
  for (const auto& m : view.members) {
    w.Str(m.node_id);
    w.Str(m.address);
    w.U64(m.incarnation);
    w.U64(std::bit_cast<uint64_t>(m.weight));
  }
}

Status DecodeMembersReply(std::span<const uint8_t> body, MembershipView* view) {
  BodyReader r(body);
  uint32_t n = 0;
  view->members.clear();
  if (r.U64(&view->epoch) && r.Count(kMaxMembers, 24, &n)) {
    view->members.resize(n);
    for (auto& m : view->members) {
      uint64_t weight_bits = 0;
      if (!(r.Str(kMaxNodeIdBytes, &m.node_id) && r.Str(kMaxAddressBytes, &m.address) &&
            r.U64(&m.incarnation) && r.U64(&weight_bits))) {
        break;
      }
      m.weight = std::bit_cast<double>(weight_bits);
      m.state = MemberState::kAlive;
    }
  }
  Status s = r.Finish("members reply");
  if (!s.ok()) return s;
  std::sort(view->members.begin(), view->members.end(),
            [](const Member& a, const Member& b) { return a.node_id < b.node_id; });
  for (size_t i = 1; i < view->members.size(); ++i) {
    if (view->members[i].node_id == view->members[i - 1].node_id) {
      return InvalidArgument("malformed members reply: duplicate node id");
    }
  }
  return Status::Ok();
}

void EncodeLeaseStatusReply(const LeaseStatusReply& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U8(static_cast<uint8_t>((m.fenced ? 1 : 0) | (m.has_lease ? 2 : 0) | (m.etcd_outage ? 4 : 0)));
  w.U64(m.since_renewal_ms);
}

Status DecodeLeaseStatusReply(std::span<const uint8_t> body, LeaseStatusReply* m) {
  BodyReader r(body);
  uint8_t flags = 0;
  if (r.U8(&flags) && r.U64(&m->since_renewal_ms)) {
    if ((flags & ~7u) != 0) return InvalidArgument("malformed lease status reply: unknown flags");
    m->fenced = (flags & 1) != 0;
    m->has_lease = (flags & 2) != 0;
    m->etcd_outage = (flags & 4) != 0;
  }
  return r.Finish("lease status reply");
}

namespace {

// Shards in a message: below kDigestShards and strictly ascending (so a
// list holds each at most once).
bool ReadShards(BodyReader& r, uint32_t n, std::vector<uint32_t>* shards, const char** bad) {
  shards->resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!r.U32(&(*shards)[i])) return false;
    if ((*shards)[i] >= kDigestShards || (i > 0 && (*shards)[i] <= (*shards)[i - 1])) {
      *bad = "shards out of range or not ascending";
      return false;
    }
  }
  return true;
}

}  // namespace

void EncodeDigest(const DigestRequest& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.Str(m.node_id);
  w.U64(m.incarnation);
  w.U64(m.fingerprint);
  w.U32(static_cast<uint32_t>(m.shards.size()));
  for (const ShardDigest& d : m.shards) {
    w.U32(d.shard);
    w.U32(d.keys);
    w.U64(d.sum);
  }
}

Status DecodeDigest(std::span<const uint8_t> body, DigestRequest* m) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.Str(kMaxNodeIdBytes, &m->node_id) && r.U64(&m->incarnation) && r.U64(&m->fingerprint) &&
      r.Count(kDigestShards, 16, &n)) {
    m->shards.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      ShardDigest& d = m->shards[i];
      if (!(r.U32(&d.shard) && r.U32(&d.keys) && r.U64(&d.sum))) break;
      if (d.shard >= kDigestShards || (i > 0 && d.shard <= m->shards[i - 1].shard)) {
        return InvalidArgument("malformed digest: shards out of range or not ascending");
      }
    }
  }
  return r.Finish("digest");
}

void EncodeDigestReply(const DigestReply& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U64(m.incarnation);
  w.U8(m.maps_differ ? 1 : 0);
  w.U32(static_cast<uint32_t>(m.mismatched.size()));
  for (uint32_t s : m.mismatched) w.U32(s);
}

Status DecodeDigestReply(std::span<const uint8_t> body, DigestReply* m) {
  BodyReader r(body);
  uint8_t flags = 0;
  uint32_t n = 0;
  const char* bad = nullptr;
  if (r.U64(&m->incarnation) && r.U8(&flags) && r.Count(kDigestShards, 4, &n)) {
    if (flags > 1) return InvalidArgument("malformed digest reply: unknown flags");
    m->maps_differ = flags == 1;
    if (!ReadShards(r, n, &m->mismatched, &bad) && bad != nullptr) {
      return InvalidArgument(std::string("malformed digest reply: ") + bad);
    }
  }
  return r.Finish("digest reply");
}

void EncodeShardKeys(const ShardKeysRequest& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.Str(m.node_id);
  w.U64(m.incarnation);
  w.U32(m.first);
  w.U32(static_cast<uint32_t>(m.shards.size()));
  for (uint32_t s : m.shards) w.U32(s);
}

Status DecodeShardKeys(std::span<const uint8_t> body, ShardKeysRequest* m) {
  BodyReader r(body);
  uint32_t n = 0;
  const char* bad = nullptr;
  if (r.Str(kMaxNodeIdBytes, &m->node_id) && r.U64(&m->incarnation) && r.U32(&m->first) &&
      r.Count(kDigestShards, 4, &n)) {
    if (!ReadShards(r, n, &m->shards, &bad) && bad != nullptr) {
      return InvalidArgument(std::string("malformed shard keys: ") + bad);
    }
    if (r.ok() && m->first > n) return InvalidArgument("malformed shard keys: first > count");
  }
  return r.Finish("shard keys");
}

void EncodeShardKeysReply(const ShardKeysReply& m, std::vector<uint8_t>* out) {
  BodyWriter w(out);
  w.U32(m.next);
  w.U32(static_cast<uint32_t>(m.keys.size()));
  for (const KeyId& k : m.keys) w.Key(k);
}

Status DecodeShardKeysReply(std::span<const uint8_t> body, ShardKeysReply* m) {
  BodyReader r(body);
  uint32_t n = 0;
  if (r.U32(&m->next) && r.Count(kMaxShardKeys, 16, &n)) {
    m->keys.resize(n);
    for (KeyId& k : m->keys) {
      if (!r.Key(&k)) break;
    }
  }
  return r.Finish("shard keys reply");
}

}  // namespace kvpool::cluster
