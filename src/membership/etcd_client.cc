#include "membership/etcd_client.h"

#include <httplib.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "common/log.h"

namespace kvpool {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

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

// A gateway error body {"error", "message", "code"} (gRPC codes) to Status.
Status GatewayError(const json& j, const std::string& what) {
  int64_t code = 0;
  try {
    code = I64(j, "code");
  } catch (const std::exception&) {
  }
  std::string msg = what + ": " + Str(j, "message");
  switch (code) {
    case 5:  // NOT_FOUND
      return NotFound(msg);
    case 3:  // INVALID_ARGUMENT
      return InvalidArgument(msg);
    default:  // leader changes, timeouts, overload: try again
      return Unavailable(msg);
  }
}

}  // namespace

Status EtcdClientOptions::Validate() const {
  if (endpoints.empty()) return InvalidArgument("etcd: no endpoints");
  for (const std::string& e : endpoints) {
    if (e.rfind("http://", 0) != 0) {
      return InvalidArgument("etcd: endpoint '" + e + "' must be http://host:port");
    }
  }
  if (request_timeout.count() <= 0) return InvalidArgument("etcd: request_timeout must be > 0");
  return Status::Ok();
}

struct EtcdClient::Impl {
  EtcdClientOptions options;
  size_t endpoint = 0;
  std::unique_ptr<httplib::Client> unary;
  Counter* err_connect = nullptr;
  Counter* err_timeout = nullptr;
  Counter* err_etcd = nullptr;
  Counter* err_parse = nullptr;
  Counter dummy;

  std::mutex watch_mu;
  httplib::Client* watch = nullptr;  // protected by watch_mu; the running watch
  std::atomic<bool> interrupted{false};

  const std::string& Endpoint() const { return options.endpoints[endpoint]; }

  httplib::Client& Unary() {
    if (!unary) {
      unary = std::make_unique<httplib::Client>(Endpoint());
      unary->set_keep_alive(true);
      unary->set_connection_timeout(options.request_timeout);
      unary->set_read_timeout(options.request_timeout);
      unary->set_write_timeout(options.request_timeout);
    }
    return *unary;
  }

  // Transport failure: count it and move to the next endpoint.
  Status TransportError(httplib::Error err, const std::string& path) {
    (err == httplib::Error::Connection ? err_connect : err_timeout)->Inc();
    // A request that timed out may still take effect; one refused never does.
    bool timed_out = err == httplib::Error::Read || err == httplib::Error::Write ||
                     err == httplib::Error::ConnectionTimeout;
    std::string msg = "etcd " + Endpoint() + path + ": " + httplib::to_string(err);
    Status st = timed_out ? DeadlineExceeded(msg) : Unavailable(msg);
    unary.reset();
    endpoint = (endpoint + 1) % options.endpoints.size();
    return st;
  }

  // POST path with body; the parsed reply or a Status.
  Result<json> Call(const std::string& path, const json& body) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    int status = 0;
    std::string reply_body;
    req.response_handler = [&status](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&reply_body](const char* data, size_t n, uint64_t, uint64_t) {
      reply_body.append(data, n);
      return true;
    };
    auto res = Unary().send(req);
    if (!res) {
      // etcd's gateway ends error replies with HTTP trailers, which this
      // httplib cannot parse: it reports a read error after the status and
      // the whole body have arrived. Use them, and drop the connection.
      if (status == 0 || !json::accept(reply_body)) return TransportError(res.error(), path);
      unary.reset();
    }
    json reply = json::parse(reply_body, nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded() || !reply.is_object()) {
      err_parse->Inc();
      return Internal("etcd " + path + ": reply is not JSON (HTTP " + std::to_string(status) + ")");
    }
    if (status != 200 || reply.contains("error")) {
      err_etcd->Inc();
      return GatewayError(reply, "etcd " + path);
    }
    return reply;
  }

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
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = json({{"ID", std::to_string(id)}}).dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&buf](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    return buf.find('\n') == std::string::npos;
  };
  auto res = impl_->Unary().send(req);
  size_t nl = buf.find('\n');
  if (nl == std::string::npos) {
    if (!res && res.error() != httplib::Error::Canceled) {
      return impl_->TransportError(res.error(), path);
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
    return GatewayError(reply.contains("code") ? reply : reply["error"], "etcd keepalive");
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

Status EtcdClient::WatchPrefix(const std::string& prefix, int64_t start_revision,
                               Clock::time_point deadline,
                               const std::function<void(const std::vector<EtcdEvent>&)>& on_events) {
  if (impl_->interrupted.load()) return Status::Ok();
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return Status::Ok();
  const std::string path = "/v3/watch";
  httplib::Client client(impl_->Endpoint());
  client.set_connection_timeout(std::min(left, impl_->options.request_timeout));
  client.set_write_timeout(impl_->options.request_timeout);
  // No event for the rest of the slice: the read times out at the deadline.
  client.set_read_timeout(left);
  {
    std::lock_guard<std::mutex> l(impl_->watch_mu);
    if (impl_->interrupted.load()) return Status::Ok();
    impl_->watch = &client;
  }
  json create = {{"key", Base64Encode(prefix)},
                 {"range_end", Base64Encode(PrefixEnd(prefix))},
                 {"start_revision", std::to_string(start_revision)}};
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = json({{"create_request", create}}).dump();
  req.set_header("Content-Type", "application/json");
  std::string buf;
  Status failure;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      // The lambda answers false when etcd reports the start revision compacted.
      Result<bool> live = impl_->Parse<bool>("watch", [&] {
        json j = json::parse(line);
        if (j.contains("error")) {
          impl_->err_etcd->Inc();
          throw std::runtime_error(
              GatewayError(j["error"].is_object() ? j["error"] : j, "etcd watch").ToString());
        }
        const json& r = j.at("result");
        if (I64(r, "compact_revision") != 0) return false;
        if (r.value("canceled", false)) throw std::runtime_error("watch canceled by etcd");
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
        failure = Aborted("etcd watch: revision " + std::to_string(start_revision) + " compacted");
        return false;
      }
    }
    return Clock::now() < deadline && !impl_->interrupted.load();
  };
  auto res = client.send(req);
  {
    std::lock_guard<std::mutex> l(impl_->watch_mu);
    impl_->watch = nullptr;
  }
  if (!failure.ok()) return failure;
  if (impl_->interrupted.load() || Clock::now() + std::chrono::milliseconds(20) >= deadline) {
    return Status::Ok();
  }
  if (!res) return impl_->TransportError(res.error(), path);
  impl_->err_etcd->Inc();
  return Unavailable("etcd watch: stream ended (HTTP " + std::to_string(res->status) + ")");
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
