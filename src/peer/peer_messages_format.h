// Peer messages of the cluster directory and remote reads, carried by the
// transport (transport.h) as typed request/reply calls. Batches travel in
// the call's payload (not the small AM header, whose size UCX may limit);
// integers little-endian, via protocol/codec.h's BodyReader/BodyWriter, and
// every count is checked against its limit before anything is allocated.
//
// kPeerPublish (request payload; reply: status only)
// | field        | type        | meaning                                          |
// |--------------|-------------|--------------------------------------------------|
// | node_id      | str (<=128) | the holder                                        |
// | incarnation  | u64         | the holder's incarnation                          |
// | count        | u32 (<=4096)| items that follow                                 |
// | key          | 16 bytes    | key id (hi, lo)                                   |
// | op           | u8          | 1 = holds it now, 2 = dropped it                  |
// | size         | u64         | value bytes (op 1; 0 for op 2)                    |
//
// kPeerLookup (request payload: u32 count (<=4096), count key ids)
// Reply payload:
// | field        | type        | meaning                                          |
// |--------------|-------------|--------------------------------------------------|
// | nodes        | u32 (<=256) | holder table entries                              |
// |  node_id     | str (<=128) |                                                   |
// |  incarnation | u64         |                                                   |
// | count        | u32         | == the request's count, in request order          |
// |  size        | u64         | value bytes (0: no holder known)                  |
// |  holders     | u8 (<=8)    | then that many u8 indexes into the node table     |
// Lookup also answers exists: a key with a live holder exists.
//
// kPeerFetch (request header: key 16 bytes, u64 max_size). Reply: OK with
// header u64 size and the value as payload (landing in the caller's sink);
// NotFound when the node does not hold it (or holds it only on SSD and the
// promotion failed); ResourceExhausted when size > max_size.
//
// kPeerStore (placement home: a writer hands a value to the key's home).
// Request header: key 16 bytes, u64 size; payload: the value (size bytes).
// Reply: OK when the home holds the key now (stored, or already there);
// ResourceExhausted when it has no room; InvalidArgument on a size mismatch.
//
// kPeerMembers (remote-mode clients learn the cluster). Request: empty.
// Reply payload, the answering node's current membership view:
// | field        | type         | meaning                                         |
// |--------------|--------------|-------------------------------------------------|
// | epoch        | u64          | the view's epoch (etcd revision; static: fixed) |
// | count        | u32 (<=4096) | members that follow, sorted by node_id          |
// |  node_id     | str (<=128)  |                                                 |
// |  address     | str (<=256)  | peer address "host:port"                        |
// |  incarnation | u64          | 0 = unknown (static membership)                 |
// |  weight      | u64          | the member's weight, IEEE-754 double bits       |
// Clients compute the ShardMap from it exactly as nodes do.
//
// kPeerLeaseStatus (a node whose lease renewals fail asks its peers how
// theirs fare before it fences; membership/etcd_membership.h). Request: empty.
// Reply header:
// | field            | type | meaning                                            |
// |------------------|------|----------------------------------------------------|
// | flags            | u8   | bit 0 fenced, bit 1 holds an etcd lease, bit 2     |
// |                  |      | etcd outage (serving with its last view); others 0 |
// | since_renewal_ms | u64  | since its last successful renewal was sent         |
//
// kPeerDigest (anti-entropy, holder -> home; anti_entropy.h). Request payload:
// | field        | type         | meaning                                         |
// |--------------|--------------|-------------------------------------------------|
// | node_id      | str (<=128)  | the holder                                      |
// | incarnation  | u64          | the holder's incarnation                        |
// | fingerprint  | u64          | the holder's ShardMap::fingerprint()            |
// | count        | u32 (<=4096) | shards that follow, ascending; every shard the  |
// |              |              | holder maps to this home and holds keys of      |
// |  shard       | u32 (<4096)  |                                                 |
// |  keys        | u32          | keys the holder holds in the shard              |
// |  sum         | u64          | sum (mod 2^64) of ShardDigestOf(key) over them  |
// Shards of this home missing from the list hold no key of the holder.
// Reply payload:
// | field        | type         | meaning                                         |
// |--------------|--------------|-------------------------------------------------|
// | incarnation  | u64          | the home's own incarnation (static membership   |
// |              |              | learns restarted peers from it)                 |
// | flags        | u8           | bit 0: maps differ, nothing compared; others 0  |
// | count        | u32 (<=4096) | shards whose entries of this holder differ      |
// |  shard       | u32 (<4096)  | ascending                                       |
// A home that does not know the type (an older node) answers an error; the
// holder counts it and relies on replays for that home.
//
// kPeerShardKeys (anti-entropy: the home's entries of one holder in some
// shards). Request payload: str node_id (<=128), u64 incarnation, u32 first
// (index into the list to start at), u32 count (<=4096), count × u32 shard.
// Reply payload: u32 next (index to ask from next; == count when done),
// u32 keys (<= kMaxShardKeys), keys × key id. Whole shards per reply.
//
// kPeerHint (a cache hint, docs/hints.md, sent to the node holding the
// keys by the node it was given to). Request header: empty (the tenant
// scope only, for kPeerTenantHint). Payload: the local protocol's Hint
// body (protocol/codec.h EncodeHint: u32 op, u32 priority, u64 ttl_ms, u32
// count (<= 8192), count key ids). Reply: OK with header u64 applied, u64
// unknown, u64 clipped, u64 moved (EncodeHintReply), or the hint's error
// (InvalidArgument, ResourceExhausted past the holder's pin budget).
// Members only: a client token's connection is refused.
//
// kPeerHolderLookup (a chain read asks the node holding a chain's first
// block which of the chain's other blocks it holds; remote_reader.h).
// Request and reply are kPeerLookup's; the answer comes from the asked
// node's own tiers, not its directory: each key it holds lists it alone
// as holder (its node id and incarnation), every other key has size 0.
//
// Tenant-scoped messages (a tenant defined on every node is one tenant
// across the cluster; node/tenants.h). kPeerTenantPublish, ...Lookup,
// ...Fetch, ...Store, ...Hint and ...HolderLookup are kPeerPublish,
// ...Lookup, ...Fetch, ...Store, kPeerHint and kPeerHolderLookup about one
// tenant's keys: the request header is
// | field        | type        | meaning                                          |
// |--------------|-------------|--------------------------------------------------|
// | tenant       | str (<=32)  | the tenant's name, as in the tenants file         |
// | rest         | bytes       | the unscoped message's request header             |
// and the payload and the reply are the unscoped message's. Key ids are
// the tenant's bound ids (node/tenants.h), so one tenant's entries never
// meet another's. Only members send them (a client token's connection may
// not: its tenant comes from its token); a node without that tenant answers
// FailedPrecondition.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/key_id.h"
#include "common/status.h"
#include "membership/membership.h"
#include "transport/transport.h"

namespace kvpool::cluster {

inline constexpr transport::MessageType kPeerPublish = 0x0101;
inline constexpr transport::MessageType kPeerLookup = 0x0102;
inline constexpr transport::MessageType kPeerFetch = 0x0103;
inline constexpr transport::MessageType kPeerStore = 0x0104;
inline constexpr transport::MessageType kPeerMembers = 0x0105;
inline constexpr transport::MessageType kPeerLeaseStatus = 0x0106;
inline constexpr transport::MessageType kPeerDigest = 0x0107;
inline constexpr transport::MessageType kPeerShardKeys = 0x0108;
// A node's key figures for the admin cluster view: an empty request; the
// reply's header is a JSON object of at most kMaxStatusBytes.
inline constexpr transport::MessageType kPeerStatus = 0x0109;
inline constexpr uint32_t kMaxStatusBytes = 16384;
// The block index (block_index.h): kPeerPublish's and kPeerLookup's
// payloads and replies, about index keys (BlockIndexKey), at the index's
// homes.
inline constexpr transport::MessageType kPeerBlockPublish = 0x010A;
inline constexpr transport::MessageType kPeerBlockLookup = 0x010B;
inline constexpr transport::MessageType kPeerTenantPublish = 0x0111;
inline constexpr transport::MessageType kPeerTenantLookup = 0x0112;
inline constexpr transport::MessageType kPeerTenantFetch = 0x0113;
inline constexpr transport::MessageType kPeerTenantStore = 0x0114;
inline constexpr transport::MessageType kPeerHint = 0x010C;
inline constexpr transport::MessageType kPeerTenantHint = 0x011C;
inline constexpr transport::MessageType kPeerHolderLookup = 0x010D;
inline constexpr transport::MessageType kPeerTenantHolderLookup = 0x011D;
inline constexpr uint32_t kMaxTenantNameBytes = 32;

// The type that carries `base` (kPeerPublish, kPeerLookup, kPeerFetch,
// kPeerStore, kPeerHint or kPeerHolderLookup) for `tenant`: base itself for the default tenant
// (empty).
transport::MessageType ScopedType(transport::MessageType base, const std::string& tenant);
// The request header of a tenant-scoped message: `tenant`, then `rest`.
// An empty tenant writes `rest` alone (the unscoped message).
void EncodeTenantScope(const std::string& tenant, std::span<const uint8_t> rest,
                       std::vector<uint8_t>* out);
// Splits a tenant-scoped request header into the tenant and the rest (a
// view into `header`).
Status DecodeTenantScope(std::span<const uint8_t> header, std::string* tenant,
                         std::span<const uint8_t>* rest);

inline constexpr uint32_t kMaxPeerBatch = 4096;
inline constexpr uint32_t kMaxNodeIdBytes = 128;
inline constexpr uint32_t kMaxLookupNodes = 256;
inline constexpr uint32_t kMaxHoldersPerKey = 8;
inline constexpr uint32_t kMaxMembers = 4096;
inline constexpr uint32_t kMaxAddressBytes = 256;
// Keys in one kPeerShardKeys reply at most (4 MiB); a reply stops after the
// shard that reaches it.
inline constexpr uint32_t kMaxShardKeys = 1u << 18;
inline constexpr uint32_t kDigestShards = 4096;  // == kNumShards

enum class PublishOp : uint8_t { kAdd = 1, kRemove = 2 };

struct PublishItem {
  KeyId key;
  PublishOp op = PublishOp::kAdd;
  uint64_t size = 0;
};

struct PublishBatch {
  std::string node_id;
  uint64_t incarnation = 0;
  std::vector<PublishItem> items;
};

struct HolderRef {
  std::string node_id;
  uint64_t incarnation = 0;
  friend bool operator==(const HolderRef&, const HolderRef&) = default;
};

struct LookupResult {
  uint64_t size = 0;  // 0: no holder known
  std::vector<HolderRef> holders;
  // No holder, but the key left the cache lately (the home's ghost): a
  // write of it is a block coming back, worth keeping longer.
  bool evicted_lately = false;
};
// On the wire an evicted_lately result is a result with this size and no
// holders (a node that predates it reads a miss).
inline constexpr uint64_t kLookupEvictedLately = UINT64_MAX;

void EncodePublish(const PublishBatch& m, std::vector<uint8_t>* out);
Status DecodePublish(std::span<const uint8_t> body, PublishBatch* m);

void EncodeLookup(std::span<const KeyId> keys, std::vector<uint8_t>* out);
Status DecodeLookup(std::span<const uint8_t> body, std::vector<KeyId>* keys);

void EncodeLookupReply(std::span<const LookupResult> results, std::vector<uint8_t>* out);
Status DecodeLookupReply(std::span<const uint8_t> body, size_t expected,
                         std::vector<LookupResult>* results);

void EncodeFetch(const KeyId& key, uint64_t max_size, std::vector<uint8_t>* out);
Status DecodeFetch(std::span<const uint8_t> body, KeyId* key, uint64_t* max_size);
void EncodeFetchReply(uint64_t size, std::vector<uint8_t>* out);
Status DecodeFetchReply(std::span<const uint8_t> body, uint64_t* size);
// kPeerStore's header: Fetch's layout (key, size), then optionally the key
// the value follows in its prefix chain (placement chain: the home stores
// it just colder than that key, DramStore::Commit's chain), then optionally
// a flags byte (kStoreReturning: the key left the cache lately).
inline constexpr uint8_t kStoreReturning = 1;
void EncodeStore(const KeyId& key, uint64_t size, const KeyId* after, uint8_t flags,
                 std::vector<uint8_t>* out);
Status DecodeStore(std::span<const uint8_t> body, KeyId* key, uint64_t* size,
                   std::optional<KeyId>* after, uint8_t* flags);

// kPeerMembers reply (MembershipView from membership/membership.h).
void EncodeMembersReply(const MembershipView& view, std::vector<uint8_t>* out);
Status DecodeMembersReply(std::span<const uint8_t> body, MembershipView* view);

// Anti-entropy digests. A key's digest term: a 64-bit mix of its id, summed
// per (holder, shard) by holder and home alike.
inline uint64_t ShardDigestOf(const KeyId& k) {
  uint64_t x = k.hi ^ (k.lo * 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct ShardDigest {
  uint32_t shard = 0;
  uint32_t keys = 0;
  uint64_t sum = 0;
  friend bool operator==(const ShardDigest&, const ShardDigest&) = default;
};

struct DigestRequest {
  std::string node_id;
  uint64_t incarnation = 0;
  uint64_t fingerprint = 0;
  std::vector<ShardDigest> shards;  // ascending shard
};
struct DigestReply {
  uint64_t incarnation = 0;
  bool maps_differ = false;
  std::vector<uint32_t> mismatched;  // ascending
};
void EncodeDigest(const DigestRequest& m, std::vector<uint8_t>* out);
Status DecodeDigest(std::span<const uint8_t> body, DigestRequest* m);
void EncodeDigestReply(const DigestReply& m, std::vector<uint8_t>* out);
Status DecodeDigestReply(std::span<const uint8_t> body, DigestReply* m);

struct ShardKeysRequest {
  std::string node_id;
  uint64_t incarnation = 0;
  uint32_t first = 0;
  std::vector<uint32_t> shards;
};
struct ShardKeysReply {
  uint32_t next = 0;
  std::vector<KeyId> keys;
};
void EncodeShardKeys(const ShardKeysRequest& m, std::vector<uint8_t>* out);
Status DecodeShardKeys(std::span<const uint8_t> body, ShardKeysRequest* m);
void EncodeShardKeysReply(const ShardKeysReply& m, std::vector<uint8_t>* out);
Status DecodeShardKeysReply(std::span<const uint8_t> body, ShardKeysReply* m);

// kPeerLeaseStatus reply.
struct LeaseStatusReply {
  bool fenced = false;
  bool has_lease = false;
  bool etcd_outage = false;
  uint64_t since_renewal_ms = 0;
  friend bool operator==(const LeaseStatusReply&, const LeaseStatusReply&) = default;
};
void EncodeLeaseStatusReply(const LeaseStatusReply& m, std::vector<uint8_t>* out);
Status DecodeLeaseStatusReply(std::span<const uint8_t> body, LeaseStatusReply* m);

}  // namespace kvpool::cluster
