// AdminServer on cpp-httplib. This file is the one boundary where httplib's
// bool/int error returns and any exception thrown while serving a request
// become Status values, logs, or HTTP 500s; nothing httplib leaks out.

#include "admin/admin_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>
#include <utility>

#include "admin/dashboard_page.h"
#include "common/check.h"
#include "common/log.h"

namespace kvpool {

Status AdminOptions::Validate() const {
  if (bind_address.empty()) return InvalidArgument("admin: bind_address is empty");
  if (port < 0 || port > 65535) {
    return InvalidArgument("admin: port must be in 0..65535, got " + std::to_string(port));
  }
  if (threads < 1 || threads > 16) {
    return InvalidArgument("admin: threads must be in 1..16, got " + std::to_string(threads));
  }
  return Status::Ok();
}

namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kJsonContentType[] = "application/json";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";
constexpr char kHtmlContentType[] = "text/html; charset=utf-8";

// The browser enforces "no network fetches" for us: the page may only talk to
// the node that served it, and scripts/styles must be the inline ones.
constexpr char kDashboardCsp[] =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

// The request-counter label set is fixed: every other path counts as "other".
constexpr std::array<std::string_view, 7> kKnownPaths = {
    "/", "/metrics", "/healthz", "/readyz", "/api/v1/status", "/api/v1/config",
    "/api/v1/members"};
constexpr std::string_view kOtherPath = "other";

// Keep-alive would let one open dashboard (polling every 2 s) pin request
// threads between polls and starve a scraper, so each connection serves one
// request; a new loopback connection per request is cheap at this rate. The
// short wait still bounds how long a connection that never sends a request
// (a browser's speculative preconnect) can hold a thread.
constexpr size_t kKeepAliveMaxCount = 1;
constexpr time_t kFirstRequestWaitSec = 1;
constexpr time_t kIoTimeoutSec = 5;
// Only GETs are served; a large body is refused before it is buffered.
constexpr size_t kMaxPayloadBytes = 4096;

std::string ErrorJson(std::string_view error, std::string_view path) {
  nlohmann::json j = {{"error", error}, {"path", path}};
  // The path comes from the client; replace invalid UTF-8 rather than throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class HttpAdminServer final : public AdminServer {
 public:
  HttpAdminServer(MetricsRegistry* metrics, AdminHooks hooks)
      : metrics_(metrics), hooks_(std::move(hooks)) {
    // Registered up front so every series is exported (as 0) from the start.
    for (size_t i = 0; i < kKnownPaths.size(); ++i) {
      path_counters_[i] = RegisterCounter(kKnownPaths[i]);
    }
    other_counter_ = RegisterCounter(kOtherPath);
  }

  ~HttpAdminServer() override { Stop(); }

  // Configures routes and binds the listening socket; does not serve yet.
  Status Bind(const AdminOptions& options) {
    const size_t threads = static_cast<size_t>(options.threads);
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    // httplib's default also sets SO_REUSEPORT, which would let a second node
    // bind the same admin port and silently take half its requests.
    server_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    server_.set_keep_alive_max_count(kKeepAliveMaxCount);
    server_.set_keep_alive_timeout(kFirstRequestWaitSec);
    server_.set_read_timeout(kIoTimeoutSec, 0);
    server_.set_write_timeout(kIoTimeoutSec, 0);
    server_.set_payload_max_length(kMaxPayloadBytes);
    server_.set_default_headers({{"Cache-Control", "no-store"}});
    InstallRoutes();

    const std::string where = options.bind_address + ":" + std::to_string(options.port);
    if (options.port == 0) {
      port_ = server_.bind_to_any_port(options.bind_address);
      if (port_ < 0) return IOError("admin: cannot bind " + where);
    } else {
      if (!server_.bind_to_port(options.bind_address, options.port)) {
        return IOError("admin: cannot bind " + where);
      }
      port_ = options.port;
    }
    return Status::Ok();
  }

  // Starts the admin thread and returns once it is accepting connections.
  Status Serve() {
    thread_ = std::thread([this] {
      if (!server_.listen_after_bind()) LogError("admin: listener failed on port {}", port_);
      listener_exited_.store(true);
    });
    // httplib's stop() is a no-op until the listener marks itself running, so
    // a Stop() racing ahead of the thread would leave it listening forever.
    // The wait is the few microseconds it takes the new thread to start.
    while (!server_.is_running() && !listener_exited_.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (listener_exited_.load()) {
      Stop();
      return IOError("admin: listener exited on start, port " + std::to_string(port_));
    }
    return Status::Ok();
  }

  int port() const override { return port_; }

  void Stop() override {
    std::lock_guard lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    // Closes the listening socket; the listener then drains and joins the
    // request threads (in-flight requests finish) before it returns.
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Counter* RegisterCounter(std::string_view path) {
    return metrics_->GetCounter("kvpool_admin_requests_total",
                                "Admin HTTP requests received, by path (unknown paths: other).",
                                {{"path", std::string(path)}});
  }

  Counter* CounterFor(const std::string& path) {
    for (size_t i = 0; i < kKnownPaths.size(); ++i) {
      if (path == kKnownPaths[i]) return path_counters_[i];
    }
    return other_counter_;
  }

  void InstallRoutes() {
    // Runs before routing for every request: counts it, and refuses anything
    // but GET/HEAD before a body is read.
    server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      CounterFor(req.path)->Inc();
      if (req.method == "GET" || req.method == "HEAD") {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      res.status = 405;
      res.set_header("Allow", "GET, HEAD");
      res.set_content(ErrorJson("method not allowed", req.path), kJsonContentType);
      return httplib::Server::HandlerResponse::Handled;
    });

    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_->RenderPrometheus(), kMetricsContentType);
    });
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", kTextContentType);
    });
    server_.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
      const bool ready = !hooks_.ready || hooks_.ready();
      res.status = ready ? 200 : 503;
      res.set_content(ready ? "ready" : "not ready", kTextContentType);
    });
    server_.Get("/api/v1/status", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(hooks_.status_json ? hooks_.status_json() : "{}", kJsonContentType);
    });
    server_.Get("/api/v1/members", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(hooks_.members_json ? hooks_.members_json() : "{}", kJsonContentType);
    });
    server_.Get("/api/v1/config", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(hooks_.config_json ? hooks_.config_json() : "{}", kJsonContentType);
    });
    server_.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_header("Content-Security-Policy", kDashboardCsp);
      res.set_header("X-Content-Type-Options", "nosniff");
      const std::string_view html = DashboardHtml();
      res.set_content(html.data(), html.size(), kHtmlContentType);
    });
    // Last, so it only catches what no route above matched.
    server_.Get(".*", [](const httplib::Request& req, httplib::Response& res) {
      res.status = 404;
      res.set_content(ErrorJson("not found", req.path), kJsonContentType);
    });

    // A throwing hook (or std::bad_alloc) becomes a 500 for that request only.
    server_.set_exception_handler(
        [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          LogError("admin: {} {} failed: {}", req.method, req.path, what);
          res.status = 500;
          res.set_content(ErrorJson("internal error", req.path), kJsonContentType);
        });
  }

  MetricsRegistry* const metrics_;  // not owned; outlives this server
  const AdminHooks hooks_;
  std::array<Counter*, kKnownPaths.size()> path_counters_{};
  Counter* other_counter_ = nullptr;

  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;  // the node's admin thread: runs the accept loop
  std::atomic<bool> listener_exited_{false};

  std::mutex stop_mu_;
  bool stopped_ = false;  // protected by stop_mu_
};

}  // namespace

Result<std::unique_ptr<AdminServer>> AdminServer::Start(const AdminOptions& options,
                                                        MetricsRegistry* metrics,
                                                        AdminHooks hooks) {
  KVPOOL_CHECK(metrics != nullptr);
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto server = std::make_unique<HttpAdminServer>(metrics, std::move(hooks));
  KVPOOL_RETURN_IF_ERROR(server->Bind(options));
  KVPOOL_RETURN_IF_ERROR(server->Serve());
  LogInfo("admin: serving on http://{}:{}/", options.bind_address, server->port());
  return std::unique_ptr<AdminServer>(std::move(server));
}

}  // namespace kvpool
