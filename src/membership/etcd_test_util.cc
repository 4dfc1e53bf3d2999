#include "membership/etcd_test_util.h"

#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "common/loopback_test_util.h"

namespace kvpool {

Result<std::unique_ptr<EtcdTestServer>> EtcdTestServer::Start(EtcdTestServerOptions options) {
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<EtcdTestServer> s(new EtcdTestServer());
    s->options_ = options;
    char tmpl[] = "/tmp/kvpool-etcd-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return ErrnoStatus("mkdtemp", errno);
    s->dir_ = tmpl;
    s->client_port_ = testing::FreePort();
    s->peer_port_ = testing::FreePort();
    s->endpoint_ = std::string(options.https ? "https" : "http") +
                   "://127.0.0.1:" + std::to_string(s->client_port_);
    last = s->Spawn();
    if (last.ok()) last = s->WaitHealthy(std::chrono::seconds(10));
    if (last.ok()) return s;
  }
  return last;
}

Status EtcdTestServer::Spawn() {
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {"etcd",
                                   "--name", "t",
                                   "--data-dir", dir_ + "/data",
                                   "--listen-client-urls", endpoint_,
                                   "--advertise-client-urls", endpoint_,
                                   "--listen-peer-urls", peer,
                                   "--initial-advertise-peer-urls", peer,
                                   "--initial-cluster", "t=" + peer};
  args.insert(args.end(), options_.extra_flags.begin(), options_.extra_flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/etcd.log";
  pid_t pid = fork();
  if (pid < 0) return ErrnoStatus("fork", errno);
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execvp("etcd", argv.data());
    _exit(127);
  }
  pid_ = pid;
  return Status::Ok();
}

Status EtcdTestServer::WaitHealthy(std::chrono::milliseconds timeout) const {
  bool exited = false;
  const bool healthy = testing::WaitFor(
      [&] {
        int wstatus = 0;
        if (pid_ > 0 && waitpid(pid_, &wstatus, WNOHANG) == pid_) exited = true;
        return exited || Healthy();
      },
      timeout, std::chrono::milliseconds(50));
  if (exited) return Unavailable("etcd exited; see " + dir_ + "/etcd.log");
  if (healthy) return Status::Ok();
  return DeadlineExceeded("etcd at " + endpoint_ + " not healthy; see " + dir_ + "/etcd.log");
}

bool EtcdTestServer::Healthy() const {
  httplib::Client c =
      options_.client_cert_file.empty()
          ? httplib::Client(endpoint_)
          : httplib::Client(endpoint_, options_.client_cert_file, options_.client_key_file);
  if (!options_.ca_file.empty()) c.set_ca_cert_path(options_.ca_file);
  c.set_connection_timeout(std::chrono::milliseconds(200));
  c.set_read_timeout(std::chrono::milliseconds(500));
  auto res = c.Get("/health");
  return res && res->status == 200 && res->body.find("true") != std::string::npos;
}

void EtcdTestServer::Pause() { kill(pid_, SIGSTOP); }
void EtcdTestServer::Resume() { kill(pid_, SIGCONT); }

void EtcdTestServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

Status EtcdTestServer::Restart() {
  Kill();
  return Relaunch();
}

Status EtcdTestServer::Relaunch() {
  KVPOOL_RETURN_IF_ERROR(Spawn());
  return WaitHealthy(std::chrono::seconds(10));
}

EtcdTestServer::~EtcdTestServer() {
  Kill();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace kvpool
