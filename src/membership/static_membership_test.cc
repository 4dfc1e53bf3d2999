#include "membership/static_membership.h"

#include <gtest/gtest.h>

namespace kvpool {
namespace {

TEST(StaticMembershipTest, ParsesPeers) {
  auto peers = ParseStaticPeers("a=10.0.0.1:7400,b=host-b:7401*2.5");
  ASSERT_TRUE(peers.ok()) << peers.status().ToString();
  ASSERT_EQ(peers->size(), 2u);
  EXPECT_EQ((*peers)[0].node_id, "a");
  EXPECT_EQ((*peers)[0].address, "10.0.0.1:7400");
  EXPECT_EQ((*peers)[0].weight, 1.0);
  EXPECT_EQ((*peers)[1].address, "host-b:7401");
  EXPECT_EQ((*peers)[1].weight, 2.5);
}

TEST(StaticMembershipTest, RefusesMalformedPeers) {
  for (const char* bad : {"a", "=h:1", "a=h", "a=h:0", "a=h:99999", "a=h:1*x", "a=h:1*-1"}) {
    EXPECT_EQ(ParseStaticPeers(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(StaticMembershipTest, PublishesOneViewWithSelf) {
  MetricsRegistry metrics;
  StaticMembershipOptions o;
  o.node_id = "b";
  o.incarnation = 42;
  o.peers = *ParseStaticPeers("c=h:3,a=h:1,b=h:2");
  auto m = StaticMembership::Open(o, &metrics);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto v = (*m)->view();
  EXPECT_EQ(v->epoch, 1u);
  ASSERT_EQ(v->members.size(), 3u);
  EXPECT_EQ(v->members[0].node_id, "a");  // sorted
  EXPECT_EQ(v->Find("b")->incarnation, 42u);
  EXPECT_EQ(v->Find("a")->incarnation, 0u);
  EXPECT_EQ(v->Find("zz"), nullptr);
  EXPECT_FALSE((*m)->fenced());
  EXPECT_EQ((*m)->incarnation(), 42u);
  EXPECT_EQ(metrics.ValueOf("kvpool_membership_members"), 3);
  EXPECT_EQ(metrics.ValueOf("kvpool_membership_epoch"), 1);
  EXPECT_EQ(metrics.ValueOf("kvpool_membership_fenced"), 0);
}

TEST(StaticMembershipTest, RefusesInvalidOptions) {
  StaticMembershipOptions o;
  o.node_id = "x";
  o.peers = *ParseStaticPeers("a=h:1");
  EXPECT_EQ(StaticMembership::Open(o, nullptr).status().code(), StatusCode::kInvalidArgument);
  o.peers = *ParseStaticPeers("x=h:1,x=h:2");
  EXPECT_EQ(StaticMembership::Open(o, nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpool
