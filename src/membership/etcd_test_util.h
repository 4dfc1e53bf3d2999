// EtcdTestServer: a real single-member etcd for integration tests, on free
// loopback ports with a temporary data directory, killed and removed on
// destruction. Needs the `etcd` binary on PATH. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace kvpool {

class EtcdTestServer {
 public:
  // Starts etcd and waits (bounded) until it answers /health.
  static Result<std::unique_ptr<EtcdTestServer>> Start();
  ~EtcdTestServer();

  // "http://127.0.0.1:PORT"
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
  void Kill();

  std::string dir_;
  std::string endpoint_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kvpool
