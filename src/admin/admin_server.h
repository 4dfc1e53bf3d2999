// AdminServer: the node's admin HTTP endpoint (loopback by default).
//
// Serves /metrics (Prometheus text from the registry), /healthz, /readyz,
// /api/v1/status, /api/v1/members and /api/v1/config (JSON from hooks the node provides),
// /api/v1/clients (the connected engines), /api/v1/cluster (every member's
// key figures), POST /api/v1/lookup (a router's prefix lookup, its body at
// most kMaxBodyBytes), POST /api/v1/hints (cache hints), /api/v1/history (the key figures
// of the last 15 minutes, MetricsHistory), and
// a self-contained dashboard page at / (no network fetches). It renders what
// it is given and holds no node logic.
//
// Thread-safe. Owns the node's admin thread (one epoll loop that accepts,
// reads and writes every connection) and a fixed pool of options.threads
// request threads fed by a bounded queue. /healthz and /readyz are answered
// on the admin thread itself, so they stay fast while the request threads
// are busy; the ready hook therefore runs there and must not block. The
// other hooks run on the request threads and must be thread-safe. Each
// request is counted in kvpool_admin_requests_total{path=...}, with unknown
// paths folded into path="other" so a scanner cannot grow the label set.
//
// Slow and idle clients cannot starve it: a connection has
// options.request_timeout to deliver its request head (at most 8 KiB) and
// the same again to take its response; each connection serves one request.
// At options.max_connections open connections, a new one takes the place of
// the oldest connection still waiting for its request (counted in
// kvpool_admin_connections_evicted_total); when every connection is being
// served, the new one gets a 503 (kvpool_admin_connections_refused_total).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "admin/metrics_history.h"
#include "common/metrics.h"
#include "common/status.h"

namespace kvpool {

struct AdminOptions {
  // Loopback unless told otherwise; beyond loopback it needs a bearer token
  // (or the node's --insecure).
  std::string bind_address = "127.0.0.1";
  // 0 picks a free port (tests); port() tells which.
  int port = 0;
  // Request threads. Two keep a slow scrape from blocking the dashboard.
  int threads = 2;
  // Open connections at once. Each costs a file descriptor and at most 8 KiB
  // of request buffer; the node raises its descriptor limit at start.
  int max_connections = 1024;
  // A connection must send its request head within this time, and take its
  // response within this time again; longer and it is closed. Short keeps
  // idle and trickling connections from holding slots.
  std::chrono::milliseconds request_timeout{5000};
  // Requests for the request threads (all paths but /healthz and /readyz)
  // waiting at once; beyond it a request is answered 503 at once.
  int max_queued_requests = 64;
  // Non-empty: every path but /healthz and /readyz needs the header
  // "Authorization: Bearer <token>" (compared in constant time); others are
  // answered 401 and counted in kvpool_admin_unauthorized_total. The
  // endpoint stays read-only either way.
  std::string bearer_token;
  // The dashboard's charts: key figures sampled every interval over the
  // window, served at /api/v1/history.
  HistoryOptions history;

  Status Validate() const;
};

// Any hook may be left empty: the JSON hooks then serve "{}", and a missing
// ready hook means ready (the server answers, so the node is up).
struct AdminHooks {
  std::function<std::string()> status_json;  // /api/v1/status
  std::function<std::string()> config_json;  // /api/v1/config
  std::function<std::string()> members_json;  // /api/v1/members
  std::function<std::string()> clients_json;  // /api/v1/clients
  std::function<std::string()> cluster_json;  // /api/v1/cluster
  // POST /api/v1/lookup: the request body (JSON) in, an HTTP status and a
  // JSON body out (400 with the reason for a bad request). Runs on a
  // request thread and may take its deadline.
  std::function<std::pair<int, std::string>(const std::string& body)> lookup;
  // POST /api/v1/hints: cache hints (node/hints_api.h), as lookup.
  std::function<std::pair<int, std::string>(const std::string& body)> hints;
  // /readyz: 200 when true, else 503. Runs on the admin thread: must be quick.
  std::function<bool()> ready;
  // What keeps the node from cluster work (joining, fenced), empty when
  // nothing does: /readyz still answers 200 and says it, /readyz/cluster
  // answers 503. Runs on the admin thread: must be quick.
  std::function<std::string()> cluster_missing;
  // What a request without the admin token may see, where that differs
  // (a node with tenants: aggregate figures, no tenant's and no client's).
  // Used when the server has no bearer_token (with one, such requests are
  // refused): the node should then be given --admin-token-file for the
  // details. Unset: every request sees everything.
  struct Untokened {
    std::function<std::string()> status_json;   // /api/v1/status
    std::function<std::string()> clients_json;  // /api/v1/clients
    // Whether a /metrics series line (or its # HELP / # TYPE line, given
    // with the metric's name) is shown.
    std::function<bool(std::string_view line)> metric_line_visible;
    // /api/v1/history series left out (figures of one store).
    std::vector<std::string> history_hidden;
  };
  std::optional<Untokened> untokened;
};

class AdminServer {
 public:
  // Binds and starts serving. IOError when the address cannot be bound,
  // InvalidArgument when the options are invalid.
  // REQUIRES: metrics != nullptr and outlives the server.
  static Result<std::unique_ptr<AdminServer>> Start(const AdminOptions& options,
                                                    MetricsRegistry* metrics, AdminHooks hooks);
  virtual ~AdminServer() = default;
  virtual int port() const = 0;
  // Stops accepting and waits for in-flight requests. Idempotent. Must not be
  // called from a hook (it joins the threads that run them).
  virtual void Stop() = 0;
};

}  // namespace kvpool
