#include "common/key_id.h"

#include <gtest/gtest.h>

#include <set>

namespace kvpool {
namespace {

TEST(KeyIdTest, KnownVector) {
  // SHA-256(le64(2) "ns" le64(3) "key"), first 12 bytes, then the first 4
  // of SHA-256("kvpool-namespace\0ns"); computed independently with Python's
  // hashlib.
  KeyId id = MakeKeyId("ns", "key");
  EXPECT_EQ(id.ToHex(), "e17ecb88f0dc89e303cae07c5e953bb2");
  EXPECT_EQ(NamespaceTag("ns"), 0x5e953bb2u);
  EXPECT_EQ(NamespaceTagOf(id), 0x5e953bb2u);
}

TEST(KeyIdTest, EveryKeyOfANamespaceCarriesItsTag) {
  const uint32_t a = NamespaceTag("engine-a"), b = NamespaceTag("engine-b");
  EXPECT_NE(a, b);
  EXPECT_EQ(NamespaceTag("engine-a"), a);  // the cached tag is the same
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(NamespaceTagOf(MakeKeyId("engine-a", "k" + std::to_string(i))), a);
    EXPECT_EQ(NamespaceTagOf(MakeKeyId("engine-b", "k" + std::to_string(i))), b);
  }
  // The empty namespace has a tag of its own.
  EXPECT_EQ(NamespaceTagOf(MakeKeyId("", "k")), NamespaceTag(""));
}

TEST(KeyIdTest, LengthFramingSeparatesNamespaceFromKey) {
  EXPECT_NE(MakeKeyId("ab", "c"), MakeKeyId("a", "bc"));
  EXPECT_NE(MakeKeyId("", "abc"), MakeKeyId("abc", ""));
  EXPECT_EQ(MakeKeyId("m", std::string("k\0x", 3)), MakeKeyId("m", std::string("k\0x", 3)));
  EXPECT_NE(MakeKeyId("m", std::string("k\0x", 3)), MakeKeyId("m", "k"));
}

TEST(KeyIdTest, HexRoundTrip) {
  KeyId id = MakeKeyId("model-a", "page-17");
  KeyId back;
  ASSERT_TRUE(KeyId::FromHex(id.ToHex(), &back));
  EXPECT_EQ(back, id);
  EXPECT_FALSE(KeyId::FromHex("xyz", &back));
  EXPECT_FALSE(KeyId::FromHex(std::string(32, 'g'), &back));
}

TEST(KeyIdTest, ManyKeysDistinct) {
  std::set<KeyId> seen;
  for (int i = 0; i < 100000; ++i) seen.insert(MakeKeyId("ns", std::to_string(i)));
  EXPECT_EQ(seen.size(), 100000u);
}

}  // namespace
}  // namespace kvpool
