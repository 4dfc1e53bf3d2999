// Placing the node's Unix socket safely: the directory is the node's own
// (created 0750, or 0700 for the per-user fallbacks), never a symbolic link,
// owned by this user or root, and not world-writable unless allowed; a
// socket file already at the path is replaced only when connecting to it is
// refused (no process serves it). Every refusal names the path.
// Thread-safe (stateless); run once at node start.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/status.h"

namespace kvpool {

struct SocketPlacement {
  // The configured socket path; empty: the default location (socket_path.h).
  std::string socket_path;
  // $XDG_RUNTIME_DIR as read by main ("" when unset).
  std::string xdg_runtime_dir;
  // Group given the directory the node creates and the socket (empty: the
  // node's own group).
  std::string group;
  // Accept a directory any user may write (such as /tmp), where another
  // user can take the socket's name before the node starts.
  bool allow_world_writable_dir = false;
};

// Picks the socket path (the configured one, else the first default
// directory the node may create or use) and prepares its directory.
// FailedPrecondition naming the directory when it is unsafe.
Result<std::string> PrepareSocketPath(const SocketPlacement& placement);

// Makes `path` free for bind(): nothing there, or a stale socket (connect
// refused) that is removed. FailedPrecondition naming the path when it is a
// symbolic link, not a socket, or a socket something answers on.
Status ClaimSocketPath(const std::string& path);

// After bind(): the socket file's mode and group, without following links.
Status SetSocketAccess(const std::string& path, uint32_t mode, const std::string& group);

}  // namespace kvpool
