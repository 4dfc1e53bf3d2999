// Directory and peer message format: round trips, bounds, pruning.
#include "cluster/directory.h"

#include <gtest/gtest.h>

#include "cluster/peer_messages_format.h"

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

}  // namespace
}  // namespace kvpool::cluster
