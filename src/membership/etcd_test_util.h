// EtcdTestServer: a real single-member etcd for integration tests, on free
// loopback ports with a temporary data directory, killed and removed on
// destruction. Needs the `etcd` binary on PATH. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "testing/wait_for.h"  // testing::WaitFor, which etcd tests use

namespace kvpool {

struct EtcdTestServerOptions {
  // More etcd flags, e.g. --auth-token-ttl, or TLS (--cert-file, ...).
  std::vector<std::string> extra_flags;
  // TLS on the client port (its flags go in extra_flags): endpoint() is
  // https://, and the health check trusts ca_file and presents the client
  // certificate when one is given.
  bool https = false;
  std::string ca_file;
  std::string client_cert_file;
  std::string client_key_file;
};

class EtcdTestServer {
 public:
  // Starts etcd and waits (bounded) until it answers /health.
  static Result<std::unique_ptr<EtcdTestServer>> Start(EtcdTestServerOptions options = {});
  ~EtcdTestServer();

  // "http://127.0.0.1:PORT" (https:// with options.https)
  const std::string& endpoint() const { return endpoint_; }
  // SIGSTOP / SIGCONT: etcd hangs (connections are accepted, never
  // answered), which is harder on clients than a refused connection.
  void Pause();
  void Resume();
  // SIGKILL, then start again on the same ports and data directory.
  Status Restart();
  // Restart() in two steps: etcd stays down between them.
  void Stop() { Kill(); }
  Status Relaunch();
  Status WaitHealthy(std::chrono::milliseconds timeout) const;

 private:
  EtcdTestServer() = default;
  Status Spawn();
  // One GET /health that answers healthy.
  bool Healthy() const;
  void Kill();

  EtcdTestServerOptions options_;
  std::string dir_;
  std::string endpoint_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kvpool
