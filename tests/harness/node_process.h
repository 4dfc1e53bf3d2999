// NodeProcess: runs the real kvpool-node binary for integration tests, in a
// temporary directory, with the admin endpoint on a free loopback port.
// Not thread-safe; owned by one test.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvpool::testing {

std::string NodeBinary();
std::string CtlBinary();
std::string CSmokeBinary();

// The cluster key file every test cluster shares (one per test process,
// mode 0600): NodeProcess::Start gives it to a node with --peers or --etcd
// unless the arguments name a key file or --insecure.
std::string TestClusterKeyFile();

class NodeProcess {
 public:
  // Starts a node with small defaults (64 MiB DRAM) plus extra_args, and
  // waits until it serves. socket_path empty: one in a fresh temp dir.
  // Returns nullptr (and the log via *log) when it does not come up.
  static std::unique_ptr<NodeProcess> Start(const std::vector<std::string>& extra_args = {},
                                            const std::string& socket_path = "",
                                            std::string* log = nullptr);
  ~NodeProcess();

  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  int admin_port() const { return admin_port_; }
  pid_t pid() const { return pid_; }
  // Sends sig and waits for the exit; returns the wait status.
  int Stop(int sig = 15);
  std::string Log() const;

  // GET on the admin endpoint; *status gets the HTTP status (0 on failure).
  // With the node's admin token when it was started with
  // --admin-token-file (its first line); HttpGetWithoutToken never sends it.
  std::string HttpGet(const std::string& path, int* status = nullptr) const;
  std::string HttpGetWithoutToken(const std::string& path, int* status = nullptr) const;
  // POST of a JSON body on the admin endpoint (with the token, as HttpGet).
  std::string HttpPost(const std::string& path, const std::string& body,
                       int* status = nullptr) const;
  // The value of one exact series line in /metrics ("name{labels}"), or -1.
  double Metric(const std::string& series) const;

 private:
  NodeProcess() = default;
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_;
  std::string log_path_;
  int admin_port_ = 0;
  std::string admin_token_;  // from --admin-token-file, when given
  bool own_dir_ = true;
};

// Runs a command, returns its exit status and captures stdout (and stderr
// when merge_stderr).
int RunCommand(const std::vector<std::string>& argv, std::string* out, bool merge_stderr = false,
               const std::string& stdin_data = "");

// Runs fn in a forked child and returns the string it returned (its
// output through a pipe), or "died:SIGNAL" when the child was killed.
std::string InChild(const std::function<std::string()>& fn);
// InChild as uid, group gid (65534, nogroup) and no supplementary groups:
// a client of another user. "cannot become uid U" when the drop fails.
std::string AsUser(uid_t uid, const std::function<std::string()>& fn, gid_t gid = 65534);

// A deterministic byte pattern for (seed, size): values verify without an oracle.
std::vector<uint8_t> Pattern(uint64_t seed, size_t size);

}  // namespace kvpool::testing
