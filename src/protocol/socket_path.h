// Where a node's Unix socket is when none is configured: the one rule the
// node and every client (libkvpool, kvpoolctl, kvpool-bench, the Python
// package through libkvpool) share, so they meet at the same path.
//
// Candidate directories, in order:
//   1. /run/kvpool                 (created 0750 by a node that may)
//   2. $XDG_RUNTIME_DIR/kvpool     (when set to an absolute path; 0700)
//   3. /tmp/kvpool-<uid>           (0700, owned by that uid)
// The socket is "kvpool.sock" in the first directory the node can use. A
// client takes the first candidate holding a socket file, else the first
// candidate. Thread-safe (pure functions; they only lstat).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpool::protocol {

inline constexpr char kSocketFileName[] = "kvpool.sock";
inline constexpr char kSystemSocketDir[] = "/run/kvpool";

// The candidate directories for this uid. xdg_runtime_dir: the value of
// $XDG_RUNTIME_DIR, or null (callers read the environment).
std::vector<std::string> DefaultSocketDirs(const char* xdg_runtime_dir, uid_t uid);

// The client's choice: the first candidate whose kvpool.sock is a socket
// (lstat: a symlink there does not count), else the first candidate's.
std::string FindDefaultSocket(const char* xdg_runtime_dir, uid_t uid);

// The directory part of a socket path ("." when it has none).
std::string SocketDirOf(const std::string& socket_path);

// Whether `dir` is one of this uid's private default directories, which
// only that user's node may serve: kXdg ($XDG_RUNTIME_DIR/kvpool, inside a
// directory the spec makes the user's alone) or kTmp (/tmp/kvpool-<uid>,
// which must be 0700 itself); kShared for any other.
enum class SocketDirKind { kShared, kXdg, kTmp };
SocketDirKind KindOfSocketDir(const std::string& dir, const char* xdg_runtime_dir, uid_t uid);

// The node's service user (the packages' "kvpool"), or -1 when there is none.
int64_t ServiceUid();

// A client's check of a socket's directory before it connects, mirroring
// the node's own rules (node/socket_dir.cc), so that a directory another
// user made (a squatter) is refused before anything is sent. Returns the
// uids whose node may serve the socket (the server's SO_PEERCRED uid must
// be one of them):
//   kXdg, kTmp: a real directory (not a symbolic link) owned by client_uid,
//     with mode 0700 for kTmp; the node must be client_uid.
//   kShared (/run/kvpool, or any other explicit path): a real directory,
//     owned by root, by client_uid or by the service user, and not writable
//     by others; the node must be its owner or root (a root-owned one: also
//     the service user, as systemd's RuntimeDirectory= may leave it).
// FailedPrecondition naming the path, the directory's owner and mode and
// what was expected.
Result<std::vector<int64_t>> CheckSocketDirForClient(const std::string& socket_path,
                                                     SocketDirKind kind, uid_t client_uid);

}  // namespace kvpool::protocol
