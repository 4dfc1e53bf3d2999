// Integration tests of etcd's own access control against a real etcd: user
// auth (right, wrong and no password; a role without the permission; a token
// etcd rejects mid-run) and TLS with client certificates (--client-cert-auth).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "membership/etcd_client.h"
#include "membership/etcd_membership.h"
#include "membership/etcd_test_util.h"

namespace kvpool {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::WaitFor;

constexpr char kAuthenticationsTotal[] = "kvpool_membership_etcd_authentications_total";
constexpr char kErrorsTotal[] = "kvpool_membership_etcd_errors_total";

// Runs a shell command (etcdctl, openssl) quietly; true when it exits 0.
bool Sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Turns etcd's user auth on, as docs/cluster.md has it: root, and a user
// kvpool (password "secret") whose role may read and write /kvpool/ only.
// `etcdctl` is the command with its endpoint and TLS flags.
void EnableUserAuth(const std::string& etcdctl) {
  for (const char* args :
       {"user add root:rootpw", "user grant-role root root", "role add kvpool",
        "role grant-permission kvpool --prefix=true readwrite /kvpool/", "user add kvpool:secret",
        "user grant-role kvpool kvpool", "auth enable"}) {
    ASSERT_TRUE(Sh(etcdctl + " " + args)) << args;
  }
}

EtcdSecurityOptions User(const std::string& password) {
  EtcdSecurityOptions s;
  s.user = "kvpool";
  s.password = password;
  return s;
}

EtcdMembershipOptions MembershipOptions(const std::string& endpoint, const std::string& id,
                                        const EtcdSecurityOptions& security) {
  EtcdMembershipOptions o;
  o.endpoints = {endpoint};
  o.security = security;
  // Each test has a cluster of its own in the suite's etcd.
  o.cluster = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  o.node_id = id;
  o.address = "127.0.0.1:" + std::to_string(7400 + id.back());
  o.lease_ttl = milliseconds(2000);
  o.request_timeout = milliseconds(500);
  o.retry_interval = milliseconds(200);
  o.open_timeout = milliseconds(2000);
  return o;
}

// A membership and the thread running its loop.
struct Node {
  std::unique_ptr<EtcdMembership> m;
  std::thread loop;

  ~Node() {
    if (!loop.joinable()) return;
    m->Stop();
    loop.join();
  }
  bool Sees(const std::string& id) const { return m->view()->Find(id) != nullptr; }
};

std::unique_ptr<Node> StartNode(const EtcdMembershipOptions& o, MetricsRegistry* metrics) {
  auto m = EtcdMembership::Open(o, metrics);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  auto n = std::make_unique<Node>();
  n->m = std::move(m).value();
  n->loop = std::thread([n = n.get()] { n->m->Run(); });
  return n;
}

// etcd with user auth on (EnableUserAuth).
class EtcdUserAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = EtcdTestServer::Start();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    etcd_ = std::move(s).value().release();
    EnableUserAuth("etcdctl --endpoints " + etcd_->endpoint());
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }

  static std::string Etcdctl(const std::string& args) {
    return "etcdctl --endpoints " + etcd_->endpoint() + " " + args;
  }

  // The kvpool user's tokens become invalid: etcd drops a user's tokens
  // when its password is set, here to the same one.
  static void InvalidateTokens() {
    ASSERT_TRUE(Sh("echo secret | " + Etcdctl("--user root:rootpw user passwd kvpool "
                                              "--interactive=false")));
  }

  EtcdMembershipOptions Options(const std::string& id, const EtcdSecurityOptions& security) {
    return MembershipOptions(etcd_->endpoint(), id, security);
  }

  static EtcdTestServer* etcd_;
};

EtcdTestServer* EtcdUserAuthTest::etcd_ = nullptr;

TEST_F(EtcdUserAuthTest, RightPasswordRegistersAndListsMembers) {
  MetricsRegistry metrics_a, metrics_b;
  auto a = StartNode(Options("a", User("secret")), &metrics_a);
  ASSERT_NE(a, nullptr);
  auto b = StartNode(Options("b", User("secret")), &metrics_b);
  ASSERT_NE(b, nullptr);
  // b read both at Open; a learns of b through its watch (which carries the token).
  EXPECT_EQ(b->m->view()->members.size(), 2u);
  EXPECT_TRUE(WaitFor([&] { return a->Sees("b"); }, milliseconds(3000)));
  EXPECT_EQ(a->m->view()->members.size(), 2u);
  EXPECT_FALSE(a->m->fenced());
  EXPECT_EQ(metrics_a.ValueOf(kAuthenticationsTotal), 1);
  EXPECT_EQ(metrics_b.ValueOf(kAuthenticationsTotal), 1);
  EXPECT_EQ(metrics_a.ValueOf(kErrorsTotal, {{"kind", "auth"}}), 0);
}

TEST_F(EtcdUserAuthTest, WrongPasswordIsPermissionDeniedAndNotRetriedAtOnce) {
  MetricsRegistry metrics;
  auto m = EtcdMembership::Open(Options("a", User("wrong")), &metrics);
  ASSERT_FALSE(m.ok());
  const std::string refusal = "etcd user auth: etcd " + etcd_->endpoint() +
                              " refused user 'kvpool' (wrong user name or password?): "
                              "etcdserver: authentication failed, invalid user ID or password";
  EXPECT_EQ(m.status().code(), StatusCode::kPermissionDenied) << m.status().ToString();
  EXPECT_EQ(m.status().message(), refusal);
  EXPECT_EQ(metrics.ValueOf(kErrorsTotal, {{"kind", "auth"}}), 1);

  // Later calls fail with the same refusal without asking etcd again.
  EtcdClient client(EtcdClientOptions{{etcd_->endpoint()}, milliseconds(500), User("wrong")},
                    &metrics);
  for (int i = 0; i < 3; ++i) {
    Result<EtcdRange> r = client.RangePrefix("/kvpool/");
    EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
    EXPECT_EQ(r.status().message(), refusal);
  }
  EXPECT_EQ(metrics.ValueOf(kErrorsTotal, {{"kind", "auth"}}), 2);
  EXPECT_EQ(metrics.ValueOf(kAuthenticationsTotal), 0);
}

TEST_F(EtcdUserAuthTest, NoUserIsPermissionDeniedNamingEtcdUserAuth) {
  auto m = EtcdMembership::Open(Options("a", EtcdSecurityOptions{}), nullptr);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kPermissionDenied) << m.status().ToString();
  EXPECT_EQ(m.status().message(),
            "etcd /v3/kv/range: etcdserver: user name is empty (etcd requires user auth and no "
            "etcd user is configured)");
}

TEST_F(EtcdUserAuthTest, KeysOutsideTheRoleArePermissionDenied) {
  EtcdClient client(EtcdClientOptions{{etcd_->endpoint()}, milliseconds(500), User("secret")},
                    nullptr);
  EXPECT_TRUE(client.Get("/kvpool/x").ok());
  Result<EtcdRange> r = client.Get("/elsewhere");
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status().message(),
            "etcd /v3/kv/range: etcdserver: permission denied (etcd user auth: the user's role "
            "lacks this permission)");
}

TEST_F(EtcdUserAuthTest, RejectedTokenIsRenewedOnce) {
  MetricsRegistry metrics;
  EtcdClient client(EtcdClientOptions{{etcd_->endpoint()}, milliseconds(500), User("secret")},
                    &metrics);
  ASSERT_TRUE(client.RangePrefix("/kvpool/").ok());
  EXPECT_EQ(metrics.ValueOf(kAuthenticationsTotal), 1);
  InvalidateTokens();
  // Unary calls and a watch each find their token rejected and take a new one.
  Result<EtcdRange> r = client.RangePrefix("/kvpool/");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(metrics.ValueOf(kAuthenticationsTotal), 2);
  InvalidateTokens();
  Status w = client.WatchPrefix("/kvpool/", r->revision + 1, SteadyClock::now() + milliseconds(200),
                                [](const std::vector<EtcdEvent>&) {});
  EXPECT_TRUE(w.ok()) << w.ToString();
  EXPECT_EQ(metrics.ValueOf(kAuthenticationsTotal), 3);
  EXPECT_EQ(metrics.ValueOf(kErrorsTotal, {{"kind", "etcd"}}), 2);
}

TEST_F(EtcdUserAuthTest, MembershipRidesThroughARejectedToken) {
  MetricsRegistry metrics_a;
  auto a = StartNode(Options("a", User("secret")), &metrics_a);
  ASSERT_NE(a, nullptr);
  InvalidateTokens();
  // a's next watch (within a slice, 1 s) finds its token rejected and takes
  // a new one; the watch under it then shows b.
  EXPECT_TRUE(
      WaitFor([&] { return metrics_a.ValueOf(kAuthenticationsTotal) == 2; }, milliseconds(3000)));
  auto b = StartNode(Options("b", User("secret")), nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(WaitFor([&] { return a->Sees("b"); }, milliseconds(3000)));
  EXPECT_EQ(metrics_a.ValueOf(kAuthenticationsTotal), 2);
  EXPECT_FALSE(a->m->fenced());
  EXPECT_EQ(a->m->incarnation(), 1u);
}

// etcd serving TLS only and requiring a client certificate signed by its CA
// (--client-cert-auth), twice: etcd_ without user auth, etcd_auth_ with it.
// Certificates from the openssl CLI, in a temporary directory.
class EtcdTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // As kvpool-node does: OpenSSL writes to sockets without MSG_NOSIGNAL.
    signal(SIGPIPE, SIG_IGN);
    char tmpl[] = "/tmp/kvpool-etcd-tls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    const std::string d = *dir_ + "/";
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1";
    auto cert = [&](const std::string& name, const std::string& subject, const std::string& ext) {
      std::ofstream(d + name + ".ext") << ext << "\n";
      return Sh("openssl req " + key + " -keyout " + d + name + ".key -out " + d + name +
                ".csr -subj " + subject) &&
             Sh("openssl x509 -req -in " + d + name + ".csr -CA " + d + "ca.pem -CAkey " + d +
                "ca.key -CAcreateserial -days 1 -out " + d + name + ".pem -extfile " + d + name +
                ".ext");
    };
    ASSERT_TRUE(Sh("openssl req -x509 " + key + " -keyout " + d + "ca.key -out " + d +
                   "ca.pem -subj /CN=kvpool-test-ca"));
    ASSERT_TRUE(cert("server", "/CN=etcd", "subjectAltName=IP:127.0.0.1"));
    ASSERT_TRUE(cert("client", "/CN=kvpool", "extendedKeyUsage=clientAuth"));
    // With user auth on, etcd's gateway refuses certificates with a CommonName.
    ASSERT_TRUE(cert("client-no-cn", "/O=kvpool", "extendedKeyUsage=clientAuth"));
    // Another CA, which signed nothing etcd has.
    ASSERT_TRUE(Sh("openssl req -x509 " + key + " -keyout " + d + "other-ca.key -out " + d +
                   "other-ca.pem -subj /CN=other-ca"));
    EtcdTestServerOptions o;
    o.extra_flags = {"--cert-file",        d + "server.pem",    "--key-file", d + "server.key",
                     "--client-cert-auth", "--trusted-ca-file", d + "ca.pem"};
    o.https = true;
    o.ca_file = d + "ca.pem";
    o.client_cert_file = d + "client.pem";
    o.client_key_file = d + "client.key";
    auto s = EtcdTestServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    etcd_ = std::move(s).value().release();
    s = EtcdTestServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    etcd_auth_ = std::move(s).value().release();
    EnableUserAuth("etcdctl --endpoints " + etcd_auth_->endpoint() + " --cacert " + d +
                   "ca.pem --cert " + d + "client.pem --key " + d + "client.key");
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
    delete etcd_auth_;
    etcd_auth_ = nullptr;
    std::error_code ec;
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }

  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  static EtcdSecurityOptions Tls(const std::string& ca, bool client_cert) {
    EtcdSecurityOptions s;
    s.ca_file = File(ca);
    if (client_cert) {
      s.cert_file = File("client.pem");
      s.key_file = File("client.key");
    }
    return s;
  }

  EtcdMembershipOptions Options(const std::string& id, const EtcdSecurityOptions& security) {
    return MembershipOptions(etcd_->endpoint(), id, security);
  }

  static std::string* dir_;
  static EtcdTestServer* etcd_;
  static EtcdTestServer* etcd_auth_;
};

std::string* EtcdTlsTest::dir_ = nullptr;
EtcdTestServer* EtcdTlsTest::etcd_ = nullptr;
EtcdTestServer* EtcdTlsTest::etcd_auth_ = nullptr;

TEST_F(EtcdTlsTest, CaAndClientCertificateWork) {
  MetricsRegistry metrics;
  auto a = StartNode(Options("a", Tls("ca.pem", true)), &metrics);
  ASSERT_NE(a, nullptr);
  auto b = StartNode(Options("b", Tls("ca.pem", true)), nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->m->view()->members.size(), 2u);
  EXPECT_TRUE(WaitFor([&] { return a->Sees("b"); }, milliseconds(3000)));
  EXPECT_EQ(metrics.ValueOf(kErrorsTotal, {{"kind", "tls"}}), 0);
}

TEST_F(EtcdTlsTest, UserWhereEtcdAuthIsOffRunsWithoutAToken) {
  MetricsRegistry metrics;
  EtcdSecurityOptions s = Tls("ca.pem", true);
  s.user = "kvpool";
  s.password = "secret";
  auto a = StartNode(Options("a", s), &metrics);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->m->view()->members.size(), 1u);
  EXPECT_EQ(metrics.ValueOf(kAuthenticationsTotal), 0);
}

TEST_F(EtcdTlsTest, UserAuthOverTlsWithACertificateWithoutCommonName) {
  MetricsRegistry metrics;
  EtcdSecurityOptions s = User("secret");
  s.ca_file = File("ca.pem");
  s.cert_file = File("client-no-cn.pem");
  s.key_file = File("client-no-cn.key");
  EtcdMembershipOptions o = MembershipOptions(etcd_auth_->endpoint(), "a", s);
  auto a = StartNode(o, &metrics);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->m->view()->members.size(), 1u);
  EXPECT_EQ(metrics.ValueOf(kAuthenticationsTotal), 1);

  // etcd's gateway (3.4) turns away a certificate with a CommonName once
  // user auth is on, in plain text.
  s.cert_file = File("client.pem");
  s.key_file = File("client.key");
  o.node_id = "b";
  o.security = s;
  auto b = EtcdMembership::Open(o, nullptr);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInternal) << b.status().ToString();
  EXPECT_EQ(b.status().message(),
            "etcd /v3/auth/authenticate: reply is not JSON (HTTP 400: CommonName of client sending "
            "a request against gateway will be ignored and not used as expected)");
}

TEST_F(EtcdTlsTest, WithoutTheClientCertificateFailsAtOnce) {
  MetricsRegistry metrics;
  SteadyClock::time_point start = SteadyClock::now();
  auto m = EtcdMembership::Open(Options("a", Tls("ca.pem", false)), &metrics);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status().ToString();
  // etcd (TLS 1.3) closes the connection after the handshake: the client's
  // request or its reply fails, whichever meets the close.
  auto refused = [&](const char* step) {
    return "etcd " + etcd_->endpoint() + "/v3/kv/range: " + step +
           " (TLS with etcd failed: etcd closed the connection, as it does when it refuses the "
           "client certificate; check the client certificate and key)";
  };
  std::string message(m.status().message());
  EXPECT_TRUE(message == refused("Write") || message == refused("Read")) << message;
  EXPECT_EQ(metrics.ValueOf(kErrorsTotal, {{"kind", "tls"}}), 1);
  EXPECT_LT(SteadyClock::now() - start, milliseconds(1000));
}

TEST_F(EtcdTlsTest, ServerCertificateFromAnotherCaIsRefused) {
  MetricsRegistry metrics;
  auto m = EtcdMembership::Open(Options("a", Tls("other-ca.pem", true)), &metrics);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status().ToString();
  EXPECT_EQ(m.status().message(),
            "etcd " + etcd_->endpoint() +
                "/v3/kv/range: SSLServerVerification (TLS with etcd failed: check the CA "
                "file, etcd's certificate and the client certificate)");
  EXPECT_EQ(metrics.ValueOf(kErrorsTotal, {{"kind", "tls"}}), 1);
}

TEST_F(EtcdTlsTest, BadFilesAreInvalidArgumentsNamingTheFile) {
  auto validate = [&](const EtcdSecurityOptions& s, std::vector<std::string> endpoints = {}) {
    if (endpoints.empty()) endpoints = {etcd_->endpoint()};
    return EtcdClientOptions{endpoints, milliseconds(500), s}.Validate();
  };
  EXPECT_TRUE(validate(Tls("ca.pem", true)).ok());
  Status st = validate(Tls("missing.pem", true));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "etcd: CA file " + File("missing.pem") + ": No such file or directory");
  EtcdSecurityOptions s = Tls("ca.pem", true);
  s.key_file = File("missing.key");
  EXPECT_EQ(validate(s).message(),
            "etcd: client key file " + File("missing.key") + ": No such file or directory");
  s.key_file = File("server.key");
  EXPECT_EQ(validate(s).message(), "etcd: client key file " + File("server.key") +
                                       " does not match the certificate " + File("client.pem"));
  s = Tls("client.key", false);
  EXPECT_EQ(validate(s).message(),
            "etcd: CA file " + File("client.key") + " holds no PEM certificate");
  s = Tls("ca.pem", true);
  s.cert_file = File("client.key");
  EXPECT_EQ(validate(s).message(),
            "etcd: client certificate file " + File("client.key") + " is not a PEM certificate");
  s = Tls("ca.pem", true);
  s.key_file.clear();
  EXPECT_EQ(validate(s).message(),
            "etcd: a client certificate and its key go together (cert_file, key_file)");
  EXPECT_EQ(validate(Tls("ca.pem", false), {"http://127.0.0.1:2379"}).message(),
            "etcd: endpoint 'http://127.0.0.1:2379' is plain http, but TLS files are given: use "
            "https://");
  EtcdSecurityOptions user;
  user.user = "kvpool";
  EXPECT_EQ(validate(user).message(), "etcd: user 'kvpool' has no password");
  // The client refuses to be built with them: EtcdMembership::Open validates.
  auto m = EtcdMembership::Open(Options("a", Tls("missing.pem", false)), nullptr);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpool
