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

#include <string>
#include <vector>

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

}  // namespace kvpool::protocol
