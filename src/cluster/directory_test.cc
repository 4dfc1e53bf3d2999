// Directory and peer message format: round trips, bounds, pruning.
#include "cluster/directory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "peer/peer_messages_format.h"

namespace kvpool::cluster {
namespace {

KeyId K(uint64_t i) { return KeyId{i * 0x9E3779B97F4A7C15ull, i}; }

TEST(PeerMessagesFormat, PublishAndLookupRoundTrip) {
  PublishBatch b{"node-a", 7, {{K(1), PublishOp::kAdd, 100}, {K(2), PublishOp::kRemove, 0}}};
  std::vector<uint8_t> buf;
  EncodePublish(b, &buf);
  PublishBatch d;
  ASSERT_TRUE(DecodePublish(buf, &d).ok());
  EXPECT_EQ(d.node_id, "node-a");
  EXPECT_EQ(d.incarnation, 7u);
  ASSERT_EQ(d.items.size(), 2u);
  EXPECT_EQ(d.items[1].op, PublishOp::kRemove);
  buf.pop_back();
  EXPECT_FALSE(DecodePublish(buf, &d).ok());

  std::vector<LookupResult> res = {{100, {{"a", 1}, {"b", 2}}}, {}, {5, {{"b", 2}}}};
  buf.clear();
  EncodeLookupReply(res, &buf);
  std::vector<LookupResult> back;
  ASSERT_TRUE(DecodeLookupReply(buf, 3, &back).ok());
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].holders, res[0].holders);
  EXPECT_TRUE(back[1].holders.empty());
  EXPECT_EQ(back[2].size, 5u);
  EXPECT_FALSE(DecodeLookupReply(buf, 2, &back).ok());  // count must match the request
  buf.back() = 9;                                       // a holder index out of the table
  EXPECT_FALSE(DecodeLookupReply(buf, 3, &back).ok());
}

// A store header names the key and size, and optionally the key it follows
// in its chain; any other length is malformed.
TEST(PeerMessagesFormat, StoreWithAndWithoutTheKeyBefore) {
  std::vector<uint8_t> buf;
  KeyId key, after_key = K(9);
  uint64_t size = 0;
  std::optional<KeyId> after;
  uint8_t flags = 9;
  EncodeStore(K(3), 4096, nullptr, 0, &buf);
  EXPECT_EQ(buf.size(), 24u);
  ASSERT_TRUE(DecodeStore(buf, &key, &size, &after, &flags).ok());
  EXPECT_EQ(key, K(3));
  EXPECT_EQ(size, 4096u);
  EXPECT_FALSE(after.has_value());
  EXPECT_EQ(flags, 0);
  buf.clear();
  EncodeStore(K(4), 7, &after_key, 0, &buf);
  EXPECT_EQ(buf.size(), 40u);
  ASSERT_TRUE(DecodeStore(buf, &key, &size, &after, &flags).ok());
  EXPECT_EQ(key, K(4));
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(*after, K(9));
  for (size_t cut : {1, 8, 15, 17}) {  // 16 leaves a valid header without it
    std::vector<uint8_t> bad(buf.begin(), buf.end() - static_cast<std::ptrdiff_t>(cut));
    EXPECT_EQ(DecodeStore(bad, &key, &size, &after, &flags).code(), StatusCode::kInvalidArgument)
        << cut;
  }
  // The flags byte, with and without the key before.
  const KeyId* const afters[] = {nullptr, &after_key};
  for (const KeyId* a : afters) {
    buf.clear();
    EncodeStore(K(5), 8, a, kStoreReturning, &buf);
    EXPECT_EQ(buf.size(), a ? 41u : 25u);
    ASSERT_TRUE(DecodeStore(buf, &key, &size, &after, &flags).ok());
    EXPECT_EQ(flags, kStoreReturning);
    EXPECT_EQ(after.has_value(), a != nullptr);
    buf.back() = 2;  // an unknown flag
    EXPECT_EQ(DecodeStore(buf, &key, &size, &after, &flags).code(), StatusCode::kInvalidArgument);
  }
  buf.push_back(0);
  EXPECT_EQ(DecodeStore(buf, &key, &size, &after, &flags).code(), StatusCode::kInvalidArgument);
}

// A tenant's scope is the tenant's name before the unscoped header; the
// default tenant's messages are the unscoped ones, byte for byte.
TEST(PeerMessagesFormat, TenantScopeRoundTripAndRefusesBadInput) {
  EXPECT_EQ(ScopedType(kPeerFetch, ""), kPeerFetch);
  EXPECT_EQ(ScopedType(kPeerPublish, "alpha"), kPeerTenantPublish);
  EXPECT_EQ(ScopedType(kPeerLookup, "alpha"), kPeerTenantLookup);
  EXPECT_EQ(ScopedType(kPeerFetch, "alpha"), kPeerTenantFetch);
  EXPECT_EQ(ScopedType(kPeerStore, "alpha"), kPeerTenantStore);
  std::vector<uint8_t> fetch, scoped, plain;
  EncodeFetch(K(7), 4096, &fetch);
  EncodeTenantScope("", fetch, &plain);
  EXPECT_EQ(plain, fetch);
  EncodeTenantScope("alpha", fetch, &scoped);
  EXPECT_EQ(scoped.size(), 4 + 5 + fetch.size());
  std::string tenant;
  std::span<const uint8_t> rest;
  ASSERT_TRUE(DecodeTenantScope(scoped, &tenant, &rest).ok());
  EXPECT_EQ(tenant, "alpha");
  KeyId key;
  uint64_t max_size = 0;
  ASSERT_TRUE(DecodeFetch(rest, &key, &max_size).ok());
  EXPECT_EQ(key, K(7));
  EXPECT_EQ(max_size, 4096u);
  // An empty scope (publish, lookup) leaves nothing after the name.
  scoped.clear();
  EncodeTenantScope("bee", {}, &scoped);
  ASSERT_TRUE(DecodeTenantScope(scoped, &tenant, &rest).ok());
  EXPECT_EQ(tenant, "bee");
  EXPECT_TRUE(rest.empty());
  // Empty, too long, truncated: refused.
  std::vector<uint8_t> empty_name = {0, 0, 0, 0};
  EXPECT_EQ(DecodeTenantScope(empty_name, &tenant, &rest).code(), StatusCode::kInvalidArgument);
  scoped.clear();
  EncodeTenantScope(std::string(kMaxTenantNameBytes + 1, 'a'), {}, &scoped);
  EXPECT_EQ(DecodeTenantScope(scoped, &tenant, &rest).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> cut = {5, 0, 0, 0, 'a', 'l'};
  EXPECT_EQ(DecodeTenantScope(cut, &tenant, &rest).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeTenantScope({}, &tenant, &rest).code(), StatusCode::kInvalidArgument);
}

// A key whose last holder dropped it is remembered (the ghost) and said so
// in lookups, also through the wire format; one another node still holds,
// or never seen, is not.
TEST(Directory, AKeyItsLastHolderDroppedIsEvictedLately) {
  MetricsRegistry m;
  Directory dir(DirectoryOptions{}, &m);
  dir.Apply({"a", 1, {{K(1), PublishOp::kAdd, 10}, {K(2), PublishOp::kAdd, 20}}});
  dir.Apply({"b", 1, {{K(2), PublishOp::kAdd, 20}}});
  dir.Apply({"a", 1, {{K(1), PublishOp::kRemove, 0}, {K(2), PublishOp::kRemove, 0}}});
  const KeyId keys[] = {K(1), K(2), K(3)};
  auto r = dir.Lookup(keys);
  EXPECT_TRUE(r[0].evicted_lately);
  EXPECT_EQ(r[0].size, 0u);
  EXPECT_TRUE(r[0].holders.empty());
  EXPECT_FALSE(r[1].evicted_lately);  // b holds it
  EXPECT_EQ(r[1].holders.size(), 1u);
  EXPECT_FALSE(r[2].evicted_lately);  // never listed
  std::vector<uint8_t> buf;
  EncodeLookupReply(r, &buf);
  std::vector<LookupResult> back;
  ASSERT_TRUE(DecodeLookupReply(buf, 3, &back).ok());
  EXPECT_TRUE(back[0].evicted_lately);
  EXPECT_EQ(back[0].size, 0u);
  EXPECT_FALSE(back[1].evicted_lately);
  EXPECT_EQ(back[1].size, 20u);
  EXPECT_FALSE(back[2].evicted_lately);
  // Listed again: no longer evicted.
  dir.Apply({"b", 1, {{K(1), PublishOp::kAdd, 10}}});
  EXPECT_FALSE(dir.Lookup(keys)[0].evicted_lately);
  // The ghost's memory, apart from the table's: two generations of its
  // first window (1,024 keys) at 16 bits a key.
  EXPECT_EQ(dir.ghost_bytes(), 2u * 1024 * 16 / 8);
  EXPECT_EQ(m.ValueOf("kvpool_directory_ghost_bytes"), 4096.0);
  // Off: nothing is remembered.
  Directory off(DirectoryOptions{.ghost_ratio = 0}, &m);
  off.Apply({"a", 1, {{K(1), PublishOp::kAdd, 10}}});
  off.Apply({"a", 1, {{K(1), PublishOp::kRemove, 0}}});
  EXPECT_FALSE(off.Lookup(keys)[0].evicted_lately);
  EXPECT_EQ(off.ghost_bytes(), 0u);
}

TEST(Directory, AddRemovePruneAndBound) {
  MetricsRegistry m;
  Directory dir(DirectoryOptions{.max_entries = 2}, &m);
  dir.Apply({"a", 1, {{K(1), PublishOp::kAdd, 10}, {K(2), PublishOp::kAdd, 20}}});
  dir.Apply({"b", 5, {{K(1), PublishOp::kAdd, 10}, {K(3), PublishOp::kAdd, 30}}});
  EXPECT_EQ(dir.entries(), 2u);  // K(3) did not fit
  auto r = dir.Lookup(std::vector<KeyId>{K(1), K(2), K(3)});
  EXPECT_EQ(r[0].holders.size(), 2u);
  EXPECT_EQ(r[1].size, 20u);
  EXPECT_TRUE(r[2].holders.empty());

  // An unpublish of another incarnation does not remove the holder.
  dir.Apply({"a", 2, {{K(2), PublishOp::kRemove, 0}}});
  EXPECT_EQ(dir.Lookup(std::vector<KeyId>{K(2)})[0].holders.size(), 1u);
  dir.Apply({"a", 1, {{K(2), PublishOp::kRemove, 0}}});
  EXPECT_EQ(dir.entries(), 1u);

  // b restarted (incarnation 6) and a left: both of their entries go.
  MembershipView v;
  v.members.push_back({"b", "h:1", 6, 1.0});
  dir.Prune(v);
  EXPECT_EQ(dir.entries(), 0u);
}

// A key held by more nodes than a lookup names (a hot prefix every reader
// kept): asked without an asker, the five listed are named; each asker is
// named five distinct holders of its own window, and over eight askers
// every one of the eight holders is named. A key with five or fewer
// holders is named the same to everyone.
TEST(Directory, AskersOfAKeyHeldByManyAreNamedTheirOwnHolders) {
  MetricsRegistry m;
  Directory dir(DirectoryOptions{}, &m);
  const KeyId hot = K(7), cold = K(8);
  for (int h = 0; h < 8; ++h) {
    dir.Apply({"r" + std::to_string(h), 1, {{hot, PublishOp::kAdd, 64}}});
  }
  dir.Apply({"r0", 1, {{cold, PublishOp::kAdd, 64}}});
  dir.Apply({"r1", 1, {{cold, PublishOp::kAdd, 64}}});
  auto newest = dir.Lookup(std::vector<KeyId>{hot})[0].holders;
  std::set<std::string> listed;
  for (const HolderRef& h : newest) listed.insert(h.node_id);
  EXPECT_EQ(listed.size(), 5u);
  EXPECT_TRUE(listed.count("r7"));  // the last to publish is listed
  std::set<std::string> named;
  for (uint64_t asker = 1; asker <= 8; ++asker) {
    auto r = dir.Lookup(std::vector<KeyId>{hot, cold}, asker);
    std::set<std::string> distinct;
    for (const HolderRef& h : r[0].holders) distinct.insert(h.node_id);
    EXPECT_EQ(r[0].holders.size(), 5u);
    EXPECT_EQ(distinct.size(), 5u);
    named.insert(distinct.begin(), distinct.end());
    ASSERT_EQ(r[1].holders.size(), 2u);
    EXPECT_EQ(r[1].holders[0].node_id, "r0");
  }
  EXPECT_EQ(named.size(), 8u);
}

// A holder re-registers (incarnation 2 -> 5) and its replay reaches the home
// before the views that drop the old life and announce the new one: the new
// entries survive those views; a late batch from the old life is ignored.
TEST(Directory, PublishesOvertakingTheViewSurviveIt) {
  MetricsRegistry m;
  Directory dir(DirectoryOptions{}, &m);
  MembershipView v1;
  v1.members = {{"a", "h:1", 1, 1.0}, {"b", "h:2", 2, 1.0}};
  dir.Prune(v1);
  dir.Apply({"b", 2, {{K(1), PublishOp::kAdd, 10}}});
  dir.Apply({"b", 5, {{K(2), PublishOp::kAdd, 20}}});  // the new life, ahead of the view
  dir.Prune(v1);                                        // b still at 2 here: both kept
  EXPECT_EQ(dir.entries(), 2u);
  MembershipView v2;
  v2.members = {{"a", "h:1", 1, 1.0}};  // b's old lease expired
  dir.Prune(v2);
  auto r = dir.Lookup(std::vector<KeyId>{K(1), K(2)});
  EXPECT_TRUE(r[0].holders.empty());
  ASSERT_EQ(r[1].holders.size(), 1u);
  EXPECT_EQ(r[1].holders[0], (HolderRef{"b", 5}));
  MembershipView v3;
  v3.members = {{"a", "h:1", 1, 1.0}, {"b", "h:2", 5, 1.0}};
  dir.Prune(v3);
  EXPECT_EQ(dir.entries(), 1u);
  dir.Apply({"b", 2, {{K(3), PublishOp::kAdd, 30}}});  // late, from the old life
  EXPECT_TRUE(dir.Lookup(std::vector<KeyId>{K(3)})[0].holders.empty());
  EXPECT_EQ(m.ValueOf("kvpool_directory_stale_publish_total"), 1);
  // A node never seen in any view, absent from it: nothing keeps its entries.
  dir.Apply({"c", 9, {{K(4), PublishOp::kAdd, 40}}});
  dir.Prune(v3);
  EXPECT_TRUE(dir.Lookup(std::vector<KeyId>{K(4)})[0].holders.empty());
}

TEST(PeerMessagesFormat, LeaseStatusRoundTripAndRejects) {
  LeaseStatusReply a{.fenced = false, .has_lease = true, .etcd_outage = true, .since_renewal_ms = 1234};
  std::vector<uint8_t> buf;
  EncodeLeaseStatusReply(a, &buf);
  ASSERT_EQ(buf.size(), 9u);
  LeaseStatusReply b;
  ASSERT_TRUE(DecodeLeaseStatusReply(buf, &b).ok());
  EXPECT_EQ(a, b);
  buf[0] |= 8;  // an unknown flag
  EXPECT_EQ(DecodeLeaseStatusReply(buf, &b).code(), StatusCode::kInvalidArgument);
  buf[0] = 1;
  buf.pop_back();
  EXPECT_FALSE(DecodeLeaseStatusReply(buf, &b).ok());
  buf.push_back(0);
  buf.push_back(0);  // trailing bytes
  EXPECT_FALSE(DecodeLeaseStatusReply(buf, &b).ok());
}

TEST(Directory, ManyKeysAddRemoveAndMemoryPerKey) {
  MetricsRegistry m;
  Directory dir(DirectoryOptions{}, &m);
  const uint64_t kN = 200000;
  PublishBatch add{"a", 1, {}}, remove{"a", 1, {}};
  for (uint64_t i = 0; i < kN; ++i) add.items.push_back({K(i), PublishOp::kAdd, i + 1});
  dir.Apply(add);
  EXPECT_EQ(dir.entries(), kN);
  double per_key = static_cast<double>(dir.bytes()) / static_cast<double>(kN);
  EXPECT_LE(per_key, 82.0);
  // Remove every other key; the rest are still found with their sizes.
  for (uint64_t i = 0; i < kN; i += 2) remove.items.push_back({K(i), PublishOp::kRemove, 0});
  dir.Apply(remove);
  EXPECT_EQ(dir.entries(), kN / 2);
  std::vector<KeyId> keys;
  for (uint64_t i = 0; i < kN; ++i) keys.push_back(K(i));
  auto r = dir.Lookup(keys);
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(r[i].holders.empty(), i % 2 == 0) << i;
    if (i % 2 == 1) {
      ASSERT_EQ(r[i].size, i + 1) << i;
    }
  }
  // Re-adding after removals reuses tombstones without losing keys.
  dir.Apply(add);
  EXPECT_EQ(dir.entries(), kN);
  // Holders per key are bounded; the newest replace the oldest.
  for (int n = 0; n < 8; ++n) {
    dir.Apply({"n" + std::to_string(n), 1, {{K(7), PublishOp::kAdd, 8}}});
  }
  EXPECT_EQ(dir.Lookup(std::vector<KeyId>{K(7)})[0].holders.size(), kDirectoryHoldersPerKey);
}

// The holder's digest of a shard, as anti_entropy.cc sums it.
ShardDigest DigestOf(uint32_t shard, const std::vector<KeyId>& keys) {
  ShardDigest d{shard, 0, 0};
  for (const KeyId& k : keys) {
    if (ShardOf(k) != shard) continue;
    ++d.keys;
    d.sum += ShardDigestOf(k);
  }
  return d;
}

// A key of shard s (the top 12 bits of the id).
KeyId InShard(uint32_t s, uint64_t i) {
  return KeyId{(uint64_t{s} << 52) | ((i * 0x9E3779B97F4A7C15ull) >> 12), i};
}

// Per (holder, shard) digests follow every change, the spares included, so a
// holder's digest matches exactly when the home lists what it holds; the
// home lists a holder's keys of a shard without scanning the others.
TEST(Directory, DigestsAndShardKeysFollowEveryChange) {
  MetricsRegistry metrics;
  Directory dir({}, &metrics);
  std::vector<bool> owned(kNumShards, true);
  std::vector<KeyId> held;
  // Enough keys to grow the table several times; shards 5 and 6 only.
  for (uint64_t i = 0; i < 5000; ++i) held.push_back(InShard(5 + i % 2, i));
  PublishBatch add{"h", 3, {}};
  for (const KeyId& k : held) add.items.push_back({k, PublishOp::kAdd, 10});
  dir.Apply(add);
  std::vector<ShardDigest> mine = {DigestOf(5, held), DigestOf(6, held)};
  EXPECT_TRUE(dir.MismatchedShards("h", 3, mine, owned).empty());
  // Another incarnation of h has nothing here: both shards differ.
  EXPECT_EQ(dir.MismatchedShards("h", 4, mine, owned), (std::vector<uint32_t>{5, 6}));
  // A shard not owned here is not compared.
  std::vector<bool> only6(kNumShards, false);
  only6[6] = true;
  EXPECT_EQ(dir.MismatchedShards("h", 4, mine, only6), (std::vector<uint32_t>{6}));

  // A lost remove: the home still lists key 0; the holder dropped it.
  std::vector<KeyId> now(held.begin() + 1, held.end());
  std::vector<ShardDigest> after = {DigestOf(5, now), DigestOf(6, now)};
  EXPECT_EQ(dir.MismatchedShards("h", 3, after, owned), (std::vector<uint32_t>{5}));
  uint32_t next = 0;
  std::vector<uint32_t> shard5 = {5};
  auto keys = dir.KeysOf("h", 3, shard5, 0, &next);
  EXPECT_EQ(next, 1u);
  ASSERT_EQ(keys.size(), 2500u);
  std::sort(keys.begin(), keys.end());
  std::vector<KeyId> want;
  for (const KeyId& k : held) {
    if (ShardOf(k) == 5) want.push_back(k);
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(keys, want);

  // More holders than a slot lists: the older become spares, still
  // counted, and a remove of a spare or a listed one keeps digests exact.
  for (int n = 0; n < 8; ++n) {
    dir.Apply({"r" + std::to_string(n), 1, {{held[2], PublishOp::kAdd, 10}}});
  }
  std::vector<ShardDigest> one = {DigestOf(ShardOf(held[2]), {held[2]})};
  for (int n = 0; n < 8; ++n) {
    EXPECT_TRUE(dir.MismatchedShards("r" + std::to_string(n), 1, one, owned).empty()) << n;
  }
  EXPECT_EQ(dir.Lookup(std::vector<KeyId>{held[2]})[0].holders.size(), kDirectoryHoldersPerKey);
  dir.Apply({"r7", 1, {{held[2], PublishOp::kRemove, 0}}});  // listed: a spare takes its place
  dir.Apply({"r0", 1, {{held[2], PublishOp::kRemove, 0}}});  // a spare
  EXPECT_EQ(dir.MismatchedShards("r7", 1, one, owned), (std::vector<uint32_t>{ShardOf(held[2])}));
  EXPECT_TRUE(dir.MismatchedShards("r7", 1, {}, owned).empty());
  EXPECT_TRUE(dir.MismatchedShards("r0", 1, {}, owned).empty());
  EXPECT_TRUE(dir.MismatchedShards("r3", 1, one, owned).empty());
  EXPECT_EQ(dir.Lookup(std::vector<KeyId>{held[2]})[0].holders.size(), kDirectoryHoldersPerKey);
  // A dead incarnation's spares and digests go with Prune.
  MembershipView v{1, {{"h", "x:1", 3}, {"r1", "x:2", 1}}};
  dir.Prune(v);
  EXPECT_TRUE(dir.MismatchedShards("r3", 1, {}, owned).empty());
  auto holders = dir.Lookup(std::vector<KeyId>{held[2]})[0].holders;
  EXPECT_EQ(holders.size(), 2u);  // h and r1

  // Shards no longer owned here are dropped with their digests.
  std::vector<bool> only5(kNumShards, false);
  only5[5] = true;
  dir.RetainShards(only5);
  EXPECT_TRUE(dir.MismatchedShards("h", 3, {}, only6).empty());
  EXPECT_EQ(dir.entries(), 2500u);  // shard 5's keys only
}

// A fenced home drops everything; what it knows of incarnations stays.
TEST(Directory, ClearDropsEntriesButNotTheNewestIncarnations) {
  MetricsRegistry metrics;
  Directory dir({}, &metrics);
  dir.Prune(MembershipView{1, {{"h", "x:1", 5}}});
  dir.Apply({"h", 5, {{K(1), PublishOp::kAdd, 10}}});
  dir.Clear();
  EXPECT_EQ(dir.entries(), 0u);
  EXPECT_TRUE(dir.Lookup(std::vector<KeyId>{K(1)})[0].holders.empty());
  dir.Apply({"h", 4, {{K(2), PublishOp::kAdd, 10}}});  // a late batch of an older life
  EXPECT_TRUE(dir.Lookup(std::vector<KeyId>{K(2)})[0].holders.empty());
  dir.Apply({"h", 5, {{K(2), PublishOp::kAdd, 10}}});
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(PeerMessagesFormat, DigestAndShardKeysRoundTripAndRefuseBadInput) {
  DigestRequest req{"h", 9, 77, {{1, 2, 3}, {4000, 1, 99}}};
  std::vector<uint8_t> buf;
  EncodeDigest(req, &buf);
  DigestRequest back;
  ASSERT_TRUE(DecodeDigest(buf, &back).ok());
  EXPECT_EQ(back.shards, req.shards);
  EXPECT_EQ(back.fingerprint, 77u);
  req.shards = {{5, 1, 1}, {5, 1, 1}};
  buf.clear();
  EncodeDigest(req, &buf);
  EXPECT_EQ(DecodeDigest(buf, &back).code(), StatusCode::kInvalidArgument);  // not ascending
  req.shards = {{4096, 1, 1}};
  buf.clear();
  EncodeDigest(req, &buf);
  EXPECT_EQ(DecodeDigest(buf, &back).code(), StatusCode::kInvalidArgument);  // out of range
  buf.pop_back();
  EXPECT_FALSE(DecodeDigest(buf, &back).ok());

  DigestReply rep{12, false, {3, 8}};
  buf.clear();
  EncodeDigestReply(rep, &buf);
  DigestReply rb;
  ASSERT_TRUE(DecodeDigestReply(buf, &rb).ok());
  EXPECT_EQ(rb.mismatched, rep.mismatched);
  EXPECT_EQ(rb.incarnation, 12u);

  ShardKeysRequest kr{"h", 9, 1, {2, 7}};
  buf.clear();
  EncodeShardKeys(kr, &buf);
  ShardKeysRequest kb;
  ASSERT_TRUE(DecodeShardKeys(buf, &kb).ok());
  EXPECT_EQ(kb.shards, kr.shards);
  EXPECT_EQ(kb.first, 1u);
  kr.first = 3;  // past the list
  buf.clear();
  EncodeShardKeys(kr, &buf);
  EXPECT_EQ(DecodeShardKeys(buf, &kb).code(), StatusCode::kInvalidArgument);

  ShardKeysReply sr{2, {K(1), K(2)}};
  buf.clear();
  EncodeShardKeysReply(sr, &buf);
  ShardKeysReply sb;
  ASSERT_TRUE(DecodeShardKeysReply(buf, &sb).ok());
  EXPECT_EQ(sb.keys, sr.keys);
  // A count larger than the body is refused before allocating.
  buf[4] = 0xff;
  buf[5] = 0xff;
  EXPECT_FALSE(DecodeShardKeysReply(buf, &sb).ok());
}

}  // namespace
}  // namespace kvpool::cluster
