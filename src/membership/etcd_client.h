// EtcdClient: the few etcd v3 calls kvpool needs, over etcd's JSON gateway
// (POST http://host:port/v3/...; keys and values base64, int64s as strings).
//
// This is the one place where HTTP and JSON errors become Status:
// Unavailable for transport failures and timeouts (retry), NotFound for an
// unknown or expired lease, Aborted for a compacted watch revision, Internal
// for a reply that does not parse, PermissionDenied when etcd refuses the
// user (wrong password, no user where etcd requires one, a role without the
// permission). Every request has a deadline: connect, write and each read are
// bounded by request_timeout (a watch by its own deadline). On a transport
// failure the next call tries the next endpoint.
//
// With a user, the client authenticates on its first call and sends the
// token etcd returns (raw, in the Authorization header) with every request.
// A token etcd rejects (expired after --auth-token-ttl, or dropped when the
// user's password was set) is renewed once and the call retried; a refused
// password is asked again at most every 5 s, in between the calls fail at
// once with the refusal.
// With TLS the process must ignore SIGPIPE (kvpool-node does): OpenSSL
// writes to a socket etcd may have closed without MSG_NOSIGNAL.
// Not thread-safe (one owner thread), except Interrupt().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics.h"
#include "common/status.h"

namespace kvpool {

// etcd's own access control; every field empty: none (plain etcd).
struct EtcdSecurityOptions {
  // etcd user auth (`etcdctl auth enable`). Empty: no user. The password is
  // a secret: it goes to etcd's authenticate call only, never to a log or a
  // Status. A user with an etcd whose auth is off runs without a token.
  std::string user;
  std::string password;
  // TLS, for https:// endpoints: the PEM CA that signed etcd's server
  // certificate (empty: the system's CAs), and a client certificate with its
  // key for etcd's --client-cert-auth (both or neither). Read again for each
  // new connection, so rotated files take effect without a restart.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// etcd access as a node is given it (--etcd-user, --etcd-password-file,
// --etcd-ca-file, --etcd-cert-file, --etcd-key-file): the password still in
// its file (a secret file, mode 0600/0400), every field optional.
struct EtcdSecurityFiles {
  std::string user;
  std::string password_file;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;

  bool empty() const {
    return user.empty() && password_file.empty() && ca_file.empty() && cert_file.empty() &&
           key_file.empty();
  }
  // The client's options, the password read from its file: the first line,
  // exactly (a trailing CR aside). InvalidArgument when a user comes
  // without a password file or the reverse, a certificate without its key
  // or the reverse, or the first line is empty; the file's own errors
  // (ReadSecretFile) otherwise.
  Result<EtcdSecurityOptions> Load() const;
};

struct EtcdClientOptions {
  // "http://host:port" or "https://host:port" of each etcd member.
  std::vector<std::string> endpoints;
  // Bounds connect, write and each read of a unary call: how long a call
  // to a hung etcd blocks before it counts as failed.
  std::chrono::milliseconds request_timeout{1000};
  EtcdSecurityOptions security;

  // Also reads the TLS files: InvalidArgument naming a file that is missing,
  // unreadable or not PEM (or a key that does not match its certificate).
  Status Validate() const;
};

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  int64_t revision = 0;  // the store revision the reply reflects
  std::vector<EtcdKv> kvs;
};

// One compare of a txn; all compare for equality.
struct EtcdCompare {
  enum class Target { kCreateRevision, kModRevision };
  std::string key;
  Target target = Target::kModRevision;
  int64_t revision = 0;  // 0 matches a key that does not exist
};

struct EtcdPut {
  std::string key;
  std::string value;
  int64_t lease = 0;  // 0: no lease
};

struct EtcdTxnResult {
  bool succeeded = false;  // every compare held and the puts were applied
  int64_t revision = 0;    // the store revision after the txn
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKv kv;  // for a delete, only key and mod_revision
};

struct EtcdLease {
  int64_t id = 0;
  int64_t ttl_s = 0;  // as granted (etcd may raise a too small TTL)
};

class EtcdClient {
 public:
  // metrics may be null; otherwise it must outlive the client. Counts
  // kvpool_membership_etcd_errors_total{kind} and
  // kvpool_membership_etcd_authentications_total.
  EtcdClient(EtcdClientOptions options, MetricsRegistry* metrics);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Every key starting with prefix.
  Result<EtcdRange> RangePrefix(const std::string& prefix);
  Result<EtcdRange> Get(const std::string& key);
  // Applies puts if every compare holds.
  Result<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdPut>& puts);
  Result<EtcdLease> LeaseGrant(int64_t ttl_s);
  // One renewal; returns the new TTL. NotFound when the lease is gone.
  Result<int64_t> LeaseKeepAlive(int64_t id);
  // NotFound when the lease is already gone (its keys are gone too).
  Status LeaseRevoke(int64_t id);
  // Seconds the lease has left; NotFound when it has expired or was revoked.
  Result<int64_t> LeaseTimeToLive(int64_t id);

  // Watches keys with prefix from start_revision, calling on_events for each
  // batch (all events of a revision come in one batch), until the deadline
  // (returns OK), Interrupt() (OK), or a failure. Aborted when
  // start_revision was compacted: re-read with RangePrefix.
  Status WatchPrefix(const std::string& prefix, int64_t start_revision,
                     std::chrono::steady_clock::time_point deadline,
                     const std::function<void(const std::vector<EtcdEvent>&)>& on_events);
  // Breaks a blocked WatchPrefix, and makes every later one return at once
  // (used when stopping). Thread-safe.
  void Interrupt();

  // Exposed for tests.
  static std::string Base64Encode(std::string_view in);
  static bool Base64Decode(std::string_view in, std::string* out);
  // The smallest key greater than every key with this prefix.
  static std::string PrefixEnd(const std::string& prefix);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool
