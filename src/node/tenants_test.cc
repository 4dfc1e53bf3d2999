#include "node/tenants.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace kvpool {
namespace {

TEST(TenantsTest, ParsesTenantsWithQuotasUidsAndGroups) {
  auto t = ParseTenants(
      "# comment\n"
      "tenant alpha dram=8GiB ssd=100GiB uids=1001,root  # trailing comment\n"
      "\n"
      "tenant b-2 dram=64MiB pins=1MiB gids=2000 tokens=remote-a,remote-b\n",
      "f");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].name, "alpha");
  EXPECT_EQ((*t)[0].dram_bytes, 8ull << 30);
  EXPECT_EQ((*t)[0].ssd_bytes, 100ull << 30);
  EXPECT_EQ((*t)[0].uids, (std::vector<uint32_t>{1001, 0}));
  EXPECT_EQ((*t)[1].name, "b-2");
  EXPECT_EQ((*t)[1].ssd_bytes, 0u);
  EXPECT_FALSE((*t)[0].pin_bytes.has_value());  // --pin-max-bytes
  EXPECT_EQ((*t)[1].pin_bytes, std::optional<uint64_t>(1 << 20));
  EXPECT_EQ((*t)[1].gids, (std::vector<uint32_t>{2000}));
  EXPECT_EQ((*t)[1].tokens, (std::vector<std::string>{"remote-a", "remote-b"}));

  EXPECT_EQ(TenantOfCredentials(*t, 1001, {5}), 0);
  EXPECT_EQ(TenantOfCredentials(*t, 1002, {7, 2000}), 1);  // a supplementary group
  EXPECT_EQ(TenantOfCredentials(*t, 1001, {2000}), 0);     // the uid comes first
  EXPECT_EQ(TenantOfCredentials(*t, 1003, {7}), -1);       // the default tenant
}

TEST(TenantsTest, RefusesBadLinesWithTheLineAndTheReason) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {
           Case{"tenant default dram=1GiB uids=1", "line 1: tenant name 'default'"},
           Case{"tenant Big dram=1GiB uids=1", "tenant name 'Big'"},
           Case{"tenant a uids=1", "needs a DRAM quota"},
           Case{"tenant a dram=1GiB", "lists no uids, gids or tokens"},
           Case{"tenant a dram=1GiB tokens=x\ntenant b dram=1GiB tokens=y,x",
                "line 2: token 'x' already belongs to tenant 'a'"},
           Case{"tenant a dram=lots uids=1", "bad size 'lots'"},
           Case{"tenant a dram=1GiB pins=some uids=1", "bad size 'some'"},
           Case{"tenant a dram=1GiB uids=no-such-user-here", "unknown user 'no-such-user-here'"},
           Case{"tenant a dram=1GiB uids=1\ntenant b dram=1GiB uids=1",
                "line 2: uid 1 already belongs to tenant 'a'"},
           Case{"tenant a dram=1GiB uids=1\ntenant a dram=1GiB uids=2", "defined twice"},
           Case{"tenant a dram=1GiB uids=1 color=red", "unknown setting 'color'"},
           Case{"namespace a", "expected 'tenant NAME"},
       }) {
    auto t = ParseTenants(c.text, "tenants file x");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.says), std::string::npos) << t.status().ToString();
  }
}

TEST(TenantsTest, TenantsFileWritableByOthersIsRefused) {
  char tmpl[] = "/tmp/kvpool-tenants-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string path = dir + "/tenants";
  std::ofstream(path) << "tenant a dram=1GiB uids=1\n";
  chmod(path.c_str(), 0664);
  auto t = LoadTenantsFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("chmod go-w"), std::string::npos) << t.status().ToString();
  chmod(path.c_str(), 0644);
  t = LoadTenantsFile(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->size(), 1u);
  auto missing = LoadTenantsFile(dir + "/none");
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  unlink(path.c_str());
  rmdir(dir.c_str());
}

TEST(TenantsTest, KeyIdsAreBoundToTheirTenant) {
  KeyId id = MakeKeyId("ns", "key");
  TenantKeys def(kDefaultTenant), a("alpha"), b("bee");
  EXPECT_TRUE(def.identity());
  EXPECT_EQ(def.Bind(id), id);
  EXPECT_FALSE(a.identity());
  EXPECT_NE(a.Bind(id), id);
  EXPECT_NE(a.Bind(id), b.Bind(id));
  EXPECT_EQ(a.Bind(id), TenantKeys("alpha").Bind(id));  // stable across restarts
  // Binding again does not land on the bound id.
  EXPECT_NE(b.Bind(a.Bind(id)), a.Bind(id));
  EXPECT_NE(a.Bind(a.Bind(id)), a.Bind(id));
  // The namespace tag stays, so a clear finds the keys in a tenant's store;
  // the 96 bits above it change.
  EXPECT_EQ(NamespaceTagOf(a.Bind(id)), NamespaceTag("ns"));
  EXPECT_NE(a.Bind(id).hi, id.hi);
}

}  // namespace
}  // namespace kvpool
