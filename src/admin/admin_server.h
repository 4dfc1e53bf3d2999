// AdminServer: the node's admin HTTP endpoint (loopback by default).
//
// Serves /metrics (Prometheus text from the registry), /healthz, /readyz,
// /api/v1/status, /api/v1/members and /api/v1/config (JSON from hooks the node provides), and
// a self-contained dashboard page at / (no network fetches). It renders what
// it is given and holds no node logic.
//
// Thread-safe. Owns the node's admin thread (it accepts connections) and a
// fixed pool of options.threads request threads; the hooks are called on
// those threads and must be thread-safe. Each request is counted in
// kvpool_admin_requests_total{path=...}, with unknown paths folded into
// path="other" so a scanner cannot grow the label set.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "common/status.h"

namespace kvpool {

struct AdminOptions {
  // Loopback unless told otherwise: the admin endpoint is not authenticated.
  std::string bind_address = "127.0.0.1";
  // 0 picks a free port (tests); port() tells which.
  int port = 0;
  // Request threads. Two keep a slow scrape from blocking the dashboard.
  int threads = 2;

  Status Validate() const;
};

// Any hook may be left empty: the JSON hooks then serve "{}", and a missing
// ready hook means ready (the server answers, so the node is up).
struct AdminHooks {
  std::function<std::string()> status_json;  // /api/v1/status
  std::function<std::string()> config_json;  // /api/v1/config
  std::function<std::string()> members_json;  // /api/v1/members
  std::function<bool()> ready;               // /readyz: 200 when true, else 503
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
