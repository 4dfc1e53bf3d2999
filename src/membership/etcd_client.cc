#include "membership/etcd_client.h"

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "common/log.h"
#include "common/secret_file.h"

namespace kvpool {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
// After etcd refused the user's password: how long calls fail with that
// refusal before the client asks again (each ask costs etcd a bcrypt).
constexpr std::chrono::seconds kAuthRetry{5};

// The gateway writes int64 as strings ("12"), may write small ones as
// numbers, and omits zero values.
int64_t I64(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') throw std::invalid_argument(std::string("bad int64 ") + field);
    return v;
  }
  throw std::invalid_argument(std::string("bad int64 ") + field);
}

std::string Str(const json& j, const char* field) {
  auto it = j.find(field);
  return (it == j.end() || !it->is_string()) ? std::string() : it->get<std::string>();
}

// A base64 field; throws (caught at the boundary) when it is not base64.
std::string B64Field(const json& j, const char* field) {
  std::string out;
  if (!EtcdClient::Base64Decode(Str(j, field), &out)) {
    throw std::invalid_argument(std::string("bad base64 in ") + field);
  }
  return out;
}

EtcdKv ParseKv(const json& j) {
  EtcdKv kv;
  kv.key = B64Field(j, "key");
  kv.value = B64Field(j, "value");
  kv.create_revision = I64(j, "create_revision");
  kv.mod_revision = I64(j, "mod_revision");
  kv.lease = I64(j, "lease");
  return kv;
}

bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// etcd's error (a gRPC code and etcd's message) to Status.
Status EtcdError(int64_t code, const std::string& message, const std::string& what) {
  std::string msg = what + ": " + message;
  if (Contains(message, "user name is empty")) {
    return PermissionDenied(msg + " (etcd requires user auth and no etcd user is configured)");
  }
  switch (code) {
    case 5:  // NOT_FOUND
      return NotFound(msg);
    case 3:  // INVALID_ARGUMENT
      return InvalidArgument(msg);
    case 7:  // PERMISSION_DENIED
      return PermissionDenied(msg + " (etcd user auth: the user's role lacks this permission)");
    default:  // leader changes, timeouts, overload: try again
      return Unavailable(msg);
  }
}

int64_t Code(const json& j) {
  try {
    return I64(j, "code");
  } catch (const std::exception&) {
    return 0;
  }
}

// A gateway error body {"error", "message", "code"} (gRPC codes) to Status.
Status GatewayError(const json& j, const std::string& what) {
  return EtcdError(Code(j), Str(j, "message"), what);
}

// Whether etcd turned down the token this client sent (expired, dropped
// with a password change, outdated by a change to the user) or asks for one
// it did not ask for before (auth was turned on): authenticating again helps.
bool TokenRejected(int64_t code, std::string_view message) {
  return code == 16 /* UNAUTHENTICATED */ || Contains(message, "invalid auth token") ||
         Contains(message, "revision of auth store is old") ||
         Contains(message, "user name is empty");
}

// Loads the TLS files as the connections will, so a bad one is named at
// start rather than found as a failed handshake.
Status CheckTlsFiles(const EtcdSecurityOptions& s) {
  auto readable = [](const std::string& path, const char* what) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) {
      return InvalidArgument(fmt::format("etcd: {} {}: {}", what, path, std::strerror(errno)));
    }
    std::fclose(f);
    return Status::Ok();
  };
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                        SSL_CTX_free);
  if (ctx == nullptr) return Internal("etcd: cannot create a TLS context");
  // An encrypted key fails here instead of asking for a pass phrase on the tty.
  SSL_CTX_set_default_passwd_cb(ctx.get(), [](char*, int, int, void*) { return 0; });
  Status st = Status::Ok();
  if (!s.ca_file.empty()) {
    st = readable(s.ca_file, "CA file");
    if (st.ok() && SSL_CTX_load_verify_locations(ctx.get(), s.ca_file.c_str(), nullptr) != 1) {
      st = InvalidArgument(fmt::format("etcd: CA file {} holds no PEM certificate", s.ca_file));
    }
  }
  if (st.ok() && !s.cert_file.empty()) {
    st = readable(s.cert_file, "client certificate file");
    if (st.ok()) st = readable(s.key_file, "client key file");
    // The key first: a certificate that does not match it then drops it,
    // and the check below names the mismatch.
    if (st.ok() &&
        SSL_CTX_use_PrivateKey_file(ctx.get(), s.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      st = InvalidArgument(fmt::format(
          "etcd: client key file {} is not an unencrypted PEM private key", s.key_file));
    }
    if (st.ok() && SSL_CTX_use_certificate_chain_file(ctx.get(), s.cert_file.c_str()) != 1) {
      st = InvalidArgument(
          fmt::format("etcd: client certificate file {} is not a PEM certificate", s.cert_file));
    }
    if (st.ok() && SSL_CTX_check_private_key(ctx.get()) != 1) {
      st = InvalidArgument(fmt::format("etcd: client key file {} does not match the certificate {}",
                                       s.key_file, s.cert_file));
    }
  }
  ERR_clear_error();
  return st;
}

}  // namespace

Result<EtcdSecurityOptions> EtcdSecurityFiles::Load() const {
  if (user.empty() != password_file.empty()) {
    return InvalidArgument("--etcd-user and --etcd-password-file go together");
  }
  if (cert_file.empty() != key_file.empty()) {
    return InvalidArgument("--etcd-cert-file and --etcd-key-file go together");
  }
  EtcdSecurityOptions s{user, "", ca_file, cert_file, key_file};
  if (password_file.empty()) return s;
  KVPOOL_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(password_file, "etcd password file"));
  s.password = text.substr(0, text.find('\n'));
  if (!s.password.empty() && s.password.back() == '\r') s.password.pop_back();
  if (s.password.empty()) {
    return InvalidArgument(fmt::format(
        "etcd password file {}: the first line (the password) is empty", password_file));
  }
  return s;
}

Status EtcdClientOptions::Validate() const {
  if (endpoints.empty()) return InvalidArgument("etcd: no endpoints");
  const EtcdSecurityOptions& s = security;
  bool tls_files = !s.ca_file.empty() || !s.cert_file.empty() || !s.key_file.empty();
  for (const std::string& e : endpoints) {
    bool https = e.starts_with("https://");
    if (!https && !e.starts_with("http://")) {
      return InvalidArgument("etcd: endpoint '" + e +
                             "' must be http://host:port or https://host:port");
    }
    if (tls_files && !https) {
      return InvalidArgument("etcd: endpoint '" + e +
                             "' is plain http, but TLS files are given: use https://");
    }
  }
  if (request_timeout.count() <= 0) return InvalidArgument("etcd: request_timeout must be > 0");
  if (s.user.empty() && !s.password.empty()) {
    return InvalidArgument("etcd: a password without a user");
  }
  if (!s.user.empty() && s.password.empty()) {
    return InvalidArgument("etcd: user '" + s.user + "' has no password");
  }
  if (s.cert_file.empty() != s.key_file.empty()) {
    return InvalidArgument(
        "etcd: a client certificate and its key go together (cert_file, key_file)");
  }
  return CheckTlsFiles(s);
}

struct EtcdClient::Impl {
  EtcdClientOptions options;
  size_t endpoint = 0;
  std::unique_ptr<httplib::Client> unary;
  Counter* err_connect = nullptr;
  Counter* err_timeout = nullptr;
  Counter* err_etcd = nullptr;
  Counter* err_parse = nullptr;
  Counter* err_tls = nullptr;
  Counter* err_auth = nullptr;
  Counter* authentications = nullptr;
  Counter dummy;

  // User auth (owner thread only).
  std::string token;                // etcd's token; empty: none held
  bool auth_off = false;            // etcd said its auth is off: no token needed
  Status auth_refused;              // etcd's last refusal of the password,
  SteadyClock::time_point auth_retry_at;  // returned by calls until then

  std::mutex watch_mu;
  httplib::Client* watch = nullptr;  // protected by watch_mu; the running watch
  std::atomic<bool> interrupted{false};

  const std::string& Endpoint() const { return options.endpoints[endpoint]; }

  // A client for the current endpoint: TLS for https://, with the CA and
  // the client certificate when given.
  std::unique_ptr<httplib::Client> NewClient() const {
    const EtcdSecurityOptions& s = options.security;
    auto c = s.cert_file.empty()
                 ? std::make_unique<httplib::Client>(Endpoint())
                 : std::make_unique<httplib::Client>(Endpoint(), s.cert_file, s.key_file);
    if (!s.ca_file.empty()) c->set_ca_cert_path(s.ca_file);
    return c;
  }

  // A JSON POST of body to path, with the token when one is held.
  httplib::Request NewRequest(const std::string& path, std::string body) const {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = std::move(body);
    req.set_header("Content-Type", "application/json");
    if (!token.empty()) req.set_header("Authorization", token);  // etcd takes it raw
    return req;
  }

  httplib::Client& Unary() {
    if (!unary) {
      unary = NewClient();
      unary->set_keep_alive(true);
      unary->set_connection_timeout(options.request_timeout);
      unary->set_read_timeout(options.request_timeout);
      unary->set_write_timeout(options.request_timeout);
    }
    return *unary;
  }

  // Transport failure: count it and move to the next endpoint.
  // `elapsed`: how long the request ran, where known.
  Status TransportError(httplib::Error err, const std::string& path,
                        SteadyClock::duration elapsed = SteadyClock::duration::max()) {
    // Over TLS 1.3 etcd refuses a client certificate after the handshake:
    // the client's first write or read fails at once, long before a timeout.
    bool refused = (err == httplib::Error::Read || err == httplib::Error::Write) &&
                   Endpoint().starts_with("https://") && elapsed < options.request_timeout / 2;
    bool tls = refused || err == httplib::Error::SSLConnection ||
               err == httplib::Error::SSLLoadingCerts ||
               err == httplib::Error::SSLServerVerification;
    (tls ? err_tls : err == httplib::Error::Connection ? err_connect : err_timeout)->Inc();
    // A request that timed out may still take effect; one refused never does.
    bool timed_out = !refused && (err == httplib::Error::Read || err == httplib::Error::Write ||
                                  err == httplib::Error::ConnectionTimeout);
    std::string msg = "etcd " + Endpoint() + path + ": " + httplib::to_string(err);
    if (refused) {
      msg +=
          " (TLS with etcd failed: etcd closed the connection, as it does when it refuses "
          "the client certificate; check the client certificate and key)";
    } else if (tls) {
      msg +=
          " (TLS with etcd failed: check the CA file, etcd's certificate and the client "
          "certificate)";
    }
    Status st = timed_out ? DeadlineExceeded(msg) : Unavailable(msg);
    unary.reset();
    endpoint = (endpoint + 1) % options.endpoints.size();
    return st;
  }

  // POST path with body; the parsed reply (maybe etcd's error) and its HTTP
  // status, or a transport or parse failure.
  Result<json> Post(const std::string& path, const json& body, int* status) {
    httplib::Request req = NewRequest(path, body.dump());
    std::string reply_body;
    req.response_handler = [status](const httplib::Response& r) {
      *status = r.status;
      return true;
    };
    req.content_receiver = [&reply_body](const char* data, size_t n, uint64_t, uint64_t) {
      reply_body.append(data, n);
      return true;
    };
    SteadyClock::time_point sent = SteadyClock::now();
    auto res = Unary().send(req);
    if (!res) {
      // etcd's gateway ends error replies with HTTP trailers, which this
      // httplib cannot parse: it reports a read error after the status and
      // the whole body have arrived. Use them, and drop the connection.
      if (*status == 0 || !json::accept(reply_body)) {
        return TransportError(res.error(), path, SteadyClock::now() - sent);
      }
      unary.reset();
    }
    json reply = json::parse(reply_body, nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded() || !reply.is_object()) {
      err_parse->Inc();
      // etcd refuses some requests in plain text, e.g. with user auth on, a
      // client certificate that has a CommonName.
      std::string said = *status == 200 ? "" : reply_body.substr(0, reply_body.find('\n'));
      return Internal("etcd " + path + ": reply is not JSON (HTTP " + std::to_string(*status) +
                      (said.empty() ? "" : ": " + said.substr(0, 200)) + ")");
    }
    return reply;
  }

  // POST path with body; the parsed reply or a Status. A token etcd rejects
  // is renewed once.
  Result<json> Call(const std::string& path, const json& body) {
    for (bool renewed = false;; renewed = true) {
      KVPOOL_RETURN_IF_ERROR(Authenticate());
      int status = 0;
      KVPOOL_ASSIGN_OR_RETURN(json reply, Post(path, body, &status));
      if (status == 200 && !reply.contains("error")) return reply;
      err_etcd->Inc();
      if (!renewed && DropRejectedToken(Code(reply), Str(reply, "message"))) continue;
      return GatewayError(reply, "etcd " + path);
    }
  }

  // Takes a token when the client has a user and holds none.
  Status Authenticate() {
    const EtcdSecurityOptions& s = options.security;
    if (s.user.empty() || !token.empty() || auth_off) return Status::Ok();
    if (!auth_refused.ok() && SteadyClock::now() < auth_retry_at) return auth_refused;
    const std::string path = "/v3/auth/authenticate";
    int status = 0;
    KVPOOL_ASSIGN_OR_RETURN(json reply,
                            Post(path, {{"name", s.user}, {"password", s.password}}, &status));
    if (status == 200 && !reply.contains("error")) {
      token = Str(reply, "token");
      if (token.empty()) {
        err_parse->Inc();
        return Internal("etcd " + path + ": reply without a token");
      }
      auth_refused = Status::Ok();
      authentications->Inc();
      return Status::Ok();
    }
    int64_t code = Code(reply);
    if (code == 9) {  // FAILED_PRECONDITION: etcd's auth is off
      LogWarn("etcd {}: user auth is not enabled in etcd; user {} goes unused until it is",
              Endpoint(), s.user);
      auth_off = true;
      return Status::Ok();
    }
    if (code != 3) {  // INVALID_ARGUMENT is the refusal; the rest may pass
      err_etcd->Inc();
      return GatewayError(reply, "etcd " + path);
    }
    err_auth->Inc();
    auth_refused = PermissionDenied(
        fmt::format("etcd user auth: etcd {} refused user '{}' (wrong user name or password?): {}",
                    Endpoint(), s.user, Str(reply, "message")));
    auth_retry_at = SteadyClock::now() + kAuthRetry;
    LogWarn("{}", auth_refused.message());
    return auth_refused;
  }

  // When etcd turned down the token (see TokenRejected) and the client has
  // a user: drops the token, so the next Authenticate() takes a new one.
  bool DropRejectedToken(int64_t code, std::string_view message) {
    if (options.security.user.empty() || !TokenRejected(code, message)) return false;
    LogInfo("etcd {}: authenticating user {} again ({})", Endpoint(), options.security.user,
            message);
    token.clear();
    auth_off = false;
    return true;
  }

  // One watch (see WatchPrefix); *token_rejected when etcd turned down the
  // token and it was dropped, so that a second try takes a new one.
  Status Watch(const std::string& prefix, int64_t start_revision, SteadyClock::time_point deadline,
               const std::function<void(const std::vector<EtcdEvent>&)>& on_events,
               bool* token_rejected);

  // Parses a reply; a malformed one (a throw from nlohmann or the helpers
  // above) becomes Internal here, so no exception leaves this file.
  template <typename T, typename F>
  Result<T> Parse(const std::string& what, F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      err_parse->Inc();
      return Internal("etcd " + what + ": malformed reply: " + e.what());
    }
  }
};

EtcdClient::EtcdClient(EtcdClientOptions options, MetricsRegistry* metrics)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  auto counter = [&](const char* kind) {
    if (metrics == nullptr) return &impl_->dummy;
    return metrics->GetCounter("kvpool_membership_etcd_errors_total",
                               "Failed etcd requests, by kind of failure.", {{"kind", kind}});
  };
  impl_->err_connect = counter("connect");
  impl_->err_timeout = counter("timeout");
  impl_->err_etcd = counter("etcd");
  impl_->err_parse = counter("parse");
  impl_->err_tls = counter("tls");
  impl_->err_auth = counter("auth");
  impl_->authentications =
      metrics == nullptr
          ? &impl_->dummy
          : metrics->GetCounter("kvpool_membership_etcd_authentications_total",
                                "Tokens taken from etcd (user auth): the first, and one for "
                                "each token etcd rejected later.");
}

EtcdClient::~EtcdClient() = default;

Result<EtcdRange> EtcdClient::RangePrefix(const std::string& prefix) {
  json body = {{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(PrefixEnd(prefix))}};
  KVPOOL_ASSIGN_OR_RETURN(json reply, impl_->Call("/v3/kv/range", body));
  return impl_->Parse<EtcdRange>("range", [&] {
    EtcdRange r;
    r.revision = I64(reply.at("header"), "revision");
    if (reply.contains("kvs")) {
      for (const json& kv : reply.at("kvs")) r.kvs.push_back(ParseKv(kv));
    }
    return r;
  });
}

Result<EtcdRange> EtcdClient::Get(const std::string& key) {
  json body = {{"key", Base64Encode(key)}};
  KVPOOL_ASSIGN_OR_RETURN(json reply, impl_->Call("/v3/kv/range", body));
  return impl_->Parse<EtcdRange>("get", [&] {
    EtcdRange r;
    r.revision = I64(reply.at("header"), "revision");
    if (reply.contains("kvs")) {
      for (const json& kv : reply.at("kvs")) r.kvs.push_back(ParseKv(kv));
    }
    return r;
  });
}

Result<EtcdTxnResult> EtcdClient::Txn(const std::vector<EtcdCompare>& compares,
                             const std::vector<EtcdPut>& puts) {
  json cmp = json::array();
  for (const EtcdCompare& c : compares) {
    bool create = c.target == EtcdCompare::Target::kCreateRevision;
    cmp.push_back({{"key", Base64Encode(c.key)},
                   {"result", "EQUAL"},
                   {"target", create ? "CREATE" : "MOD"},
                   {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}});
  }
  json success = json::array();
  for (const EtcdPut& p : puts) {
    json put = {{"key", Base64Encode(p.key)}, {"value", Base64Encode(p.value)}};
    if (p.lease != 0) put["lease"] = std::to_string(p.lease);
    success.push_back({{"request_put", put}});
  }
  json body = {{"compare", cmp}, {"success", success}};
  KVPOOL_ASSIGN_OR_RETURN(json reply, impl_->Call("/v3/kv/txn", body));
  return impl_->Parse<EtcdTxnResult>("txn", [&] {
    return EtcdTxnResult{reply.value("succeeded", false), I64(reply.at("header"), "revision")};
  });
}

Result<EtcdLease> EtcdClient::LeaseGrant(int64_t ttl_s) {
  json body = {{"TTL", std::to_string(ttl_s)}};
  KVPOOL_ASSIGN_OR_RETURN(json reply, impl_->Call("/v3/lease/grant", body));
  return impl_->Parse<EtcdLease>("lease grant", [&] {
    EtcdLease lease{I64(reply, "ID"), I64(reply, "TTL")};
    if (lease.id == 0 || lease.ttl_s <= 0) throw std::invalid_argument("no lease granted");
    return lease;
  });
}

Result<int64_t> EtcdClient::LeaseKeepAlive(int64_t id) {
  // The gateway serves keepalive as a stream: one request in, one result
  // object (a line) out, and the response never ends. Read the first line
  // and hang up.
  const std::string path = "/v3/lease/keepalive";
  std::string buf;
  httplib::Request req = impl_->NewRequest(path, json({{"ID", std::to_string(id)}}).dump());
  req.content_receiver = [&buf](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    return buf.find('\n') == std::string::npos;
  };
  SteadyClock::time_point sent = SteadyClock::now();
  auto res = impl_->Unary().send(req);
  size_t nl = buf.find('\n');
  if (nl == std::string::npos) {
    if (!res && res.error() != httplib::Error::Canceled) {
      return impl_->TransportError(res.error(), path, SteadyClock::now() - sent);
    }
    buf.clear();  // the stream ended without a line: parse what came
  }
  // The hung-up connection cannot be reused.
  impl_->unary.reset();
  json reply = json::parse(buf.substr(0, nl), nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.is_object()) {
    impl_->err_parse->Inc();
    return Internal("etcd keepalive: reply is not JSON");
  }
  if (reply.contains("error")) {
    impl_->err_etcd->Inc();
    const json& error = reply.contains("code") ? reply : reply["error"];
    // etcd does not check tokens on keepalives today; if one does, the next
    // call takes a new token and the keepalive after it passes.
    impl_->DropRejectedToken(Code(error), Str(error, "message"));
    return GatewayError(error, "etcd keepalive");
  }
  KVPOOL_ASSIGN_OR_RETURN(int64_t ttl, impl_->Parse<int64_t>("keepalive", [&] {
    return I64(reply.at("result"), "TTL");
  }));
  // A keepalive of an unknown (expired or revoked) lease answers TTL 0.
  if (ttl <= 0) return NotFound("etcd keepalive: lease " + std::to_string(id) + " expired");
  return ttl;
}

Status EtcdClient::LeaseRevoke(int64_t id) {
  json body = {{"ID", std::to_string(id)}};
  return impl_->Call("/v3/lease/revoke", body).status();
}

Result<int64_t> EtcdClient::LeaseTimeToLive(int64_t id) {
  json body = {{"ID", std::to_string(id)}};
  KVPOOL_ASSIGN_OR_RETURN(json reply, impl_->Call("/v3/lease/timetolive", body));
  KVPOOL_ASSIGN_OR_RETURN(int64_t ttl, impl_->Parse<int64_t>("lease timetolive", [&] {
    return I64(reply, "TTL");
  }));
  // An unknown (expired or revoked) lease answers TTL -1.
  if (ttl <= 0) return NotFound("etcd lease " + std::to_string(id) + " expired");
  return ttl;
}

Status EtcdClient::Impl::Watch(const std::string& prefix, int64_t start_revision,
                               SteadyClock::time_point deadline,
                               const std::function<void(const std::vector<EtcdEvent>&)>& on_events,
                               bool* token_rejected) {
  if (interrupted.load()) return Status::Ok();
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  if (left.count() <= 0) return Status::Ok();
  KVPOOL_RETURN_IF_ERROR(Authenticate());
  const std::string path = "/v3/watch";
  std::unique_ptr<httplib::Client> client = NewClient();
  client->set_connection_timeout(std::min(left, options.request_timeout));
  client->set_write_timeout(options.request_timeout);
  // No event for the rest of the slice: the read times out at the deadline.
  client->set_read_timeout(left);
  {
    std::lock_guard<std::mutex> l(watch_mu);
    if (interrupted.load()) return Status::Ok();
    watch = client.get();
  }
  json create = {{"key", EtcdClient::Base64Encode(prefix)},
                 {"range_end", EtcdClient::Base64Encode(EtcdClient::PrefixEnd(prefix))},
                 {"start_revision", std::to_string(start_revision)}};
  httplib::Request req = NewRequest(path, json({{"create_request", create}}).dump());
  std::string buf;
  Status failure;
  Status refused;  // etcd canceled the watch for want of auth
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      // The lambda answers false when etcd reports the start revision
      // compacted, or refused the watch (refused says why).
      Result<bool> live = Parse<bool>("watch", [&] {
        json j = json::parse(line);
        if (j.contains("error")) {
          err_etcd->Inc();
          throw std::runtime_error(
              GatewayError(j["error"].is_object() ? j["error"] : j, "etcd watch").ToString());
        }
        const json& r = j.at("result");
        if (I64(r, "compact_revision") != 0) return false;
        if (r.value("canceled", false)) {
          std::string reason = Str(r, "cancel_reason");
          bool denied = Contains(reason, "code = PermissionDenied");
          if (!denied && !TokenRejected(0, reason))
            throw std::runtime_error("watch canceled by etcd");
          err_etcd->Inc();
          *token_rejected = DropRejectedToken(0, reason);
          refused = EtcdError(denied ? 7 : 16, reason, "etcd watch canceled");
          return false;
        }
        if (r.contains("events")) {
          std::vector<EtcdEvent> events;
          for (const json& e : r.at("events")) {
            EtcdEvent ev;
            ev.type = Str(e, "type") == "DELETE" ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
            ev.kv = ParseKv(e.at("kv"));
            events.push_back(std::move(ev));
          }
          if (!events.empty()) on_events(events);
        }
        return true;
      });
      if (!live.ok()) {
        failure = Unavailable(live.status().message());
        return false;
      }
      if (!*live) {
        failure =
            !refused.ok()
                ? refused
                : Aborted("etcd watch: revision " + std::to_string(start_revision) + " compacted");
        return false;
      }
    }
    return SteadyClock::now() < deadline && !interrupted.load();
  };
  auto res = client->send(req);
  {
    std::lock_guard<std::mutex> l(watch_mu);
    watch = nullptr;
  }
  if (!failure.ok()) return failure;
  if (interrupted.load() || SteadyClock::now() + std::chrono::milliseconds(20) >= deadline) {
    return Status::Ok();
  }
  if (!res) return TransportError(res.error(), path);
  err_etcd->Inc();
  return Unavailable("etcd watch: stream ended (HTTP " + std::to_string(res->status) + ")");
}

Status EtcdClient::WatchPrefix(
    const std::string& prefix, int64_t start_revision, SteadyClock::time_point deadline,
    const std::function<void(const std::vector<EtcdEvent>&)>& on_events) {
  // A token etcd rejects when the watch is created is renewed once.
  for (bool renewed = false;; renewed = true) {
    bool token_rejected = false;
    Status st = impl_->Watch(prefix, start_revision, deadline, on_events, &token_rejected);
    if (!token_rejected || renewed) return st;
  }
}

void EtcdClient::Interrupt() {
  std::lock_guard<std::mutex> l(impl_->watch_mu);
  impl_->interrupted.store(true);
  if (impl_->watch != nullptr) impl_->watch->stop();
}

std::string EtcdClient::Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kB64[(v >> s) & 63];
  }
  size_t rest = in.size() - i;
  if (rest > 0) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (rest == 2) v |= uint8_t(in[i + 1]) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool EtcdClient::Base64Decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < in.size(); i += 4) {
    int pad = (in[i + 3] == '=') + (in[i + 2] == '=');
    if (pad > 0 && i + 4 != in.size()) return false;
    if (in[i + 2] == '=' && in[i + 3] != '=') return false;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      int d = (k >= 4 - pad) ? 0 : val(in[i + k]);
      if (d < 0) return false;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out->push_back(static_cast<char>(v >> 16));
    if (pad < 2) out->push_back(static_cast<char>((v >> 8) & 0xff));
    if (pad < 1) out->push_back(static_cast<char>(v & 0xff));
  }
  return true;
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace kvpool
