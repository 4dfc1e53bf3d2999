#include "node/socket_dir.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "common/log.h"
#include "protocol/socket_path.h"

namespace kvpool {
namespace {

Result<gid_t> LookUpGroup(const std::string& group) {
  if (group.empty()) return static_cast<gid_t>(-1);
  struct group* g = ::getgrnam(group.c_str());
  if (g == nullptr) return InvalidArgument(fmt::format("socket group '{}' does not exist", group));
  return g->gr_gid;
}

// Why a directory cannot be made or used by this user: the default
// location then falls back to the next candidate.
bool IsPermissionError(int err) { return err == EACCES || err == EPERM || err == EROFS; }

// Creates `dir` (one level) when missing, then checks it is safe to put a
// socket in. `private_dir`: the per-user fallbacks, which must be this
// user's alone. Sets *perm_denied when the directory cannot be created or
// written by this user (rather than being unsafe).
Status PrepareDir(const std::string& dir, mode_t create_mode, bool private_dir,
                  const SocketPlacement& p, bool* perm_denied) {
  *perm_denied = false;
  struct stat st;
  bool created = false;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoStatus(fmt::format("socket directory {}", dir), errno);
    if (::mkdir(dir.c_str(), create_mode) != 0 && errno != EEXIST) {
      *perm_denied = IsPermissionError(errno);
      return ErrnoStatus(fmt::format("cannot create socket directory {}", dir), errno);
    }
    created = true;
    if (::lstat(dir.c_str(), &st) != 0) {
      return ErrnoStatus(fmt::format("socket directory {}", dir), errno);
    }
  }
  if (S_ISLNK(st.st_mode)) {
    return FailedPrecondition(fmt::format(
        "socket directory {} is a symbolic link; refusing to follow it (use a real directory)",
        dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return FailedPrecondition(fmt::format("socket directory {} is not a directory", dir));
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return FailedPrecondition(fmt::format(
        "socket directory {} belongs to uid {}, not to this user ({}) or root; refusing it",
        dir, st.st_uid, me));
  }
  if (private_dir && (st.st_uid != me || (st.st_mode & 077) != 0)) {
    return FailedPrecondition(fmt::format(
        "socket directory {} must be owned by uid {} with mode 0700 (it is uid {}, mode {:o})",
        dir, me, st.st_uid, st.st_mode & 07777));
  }
  if ((st.st_mode & S_IWOTH) && !p.allow_world_writable_dir) {
    return FailedPrecondition(fmt::format(
        "socket directory {} is world-writable: another user could take the socket's name "
        "first; use a private directory or pass --socket-allow-world-writable-dir",
        dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    *perm_denied = IsPermissionError(errno);
    return ErrnoStatus(fmt::format("socket directory {} is not writable", dir), errno);
  }
  if (created) {
    // mkdir's mode went through the umask: set it exactly.
    ::chmod(dir.c_str(), create_mode);
    KVPOOL_ASSIGN_OR_RETURN(gid_t gid, LookUpGroup(p.group));
    if (gid != static_cast<gid_t>(-1) && ::lchown(dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
      return ErrnoStatus(fmt::format("cannot give {} to group {}", dir, p.group), errno);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> PrepareSocketPath(const SocketPlacement& p) {
  bool perm_denied = false;
  if (!p.socket_path.empty()) {
    KVPOOL_RETURN_IF_ERROR(PrepareDir(protocol::SocketDirOf(p.socket_path), 0750,
                                      /*private_dir=*/false, p, &perm_denied));
    return p.socket_path;
  }
  const auto dirs = protocol::DefaultSocketDirs(
      p.xdg_runtime_dir.empty() ? nullptr : p.xdg_runtime_dir.c_str(), ::geteuid());
  Status last;
  for (size_t i = 0; i < dirs.size(); ++i) {
    // The system directory is shared with a group; the fallbacks are the
    // user's own.
    const bool system_dir = i == 0;
    last = PrepareDir(dirs[i], system_dir ? 0750 : 0700, !system_dir && i + 1 == dirs.size(), p,
                      &perm_denied);
    if (last.ok()) return dirs[i] + "/" + protocol::kSocketFileName;
    // Only "not allowed to create or write here" moves on: an unsafe
    // directory is reported, not silently replaced by another.
    if (!perm_denied) return last;
    LogInfo("socket: {}; trying the next default location", last.message());
  }
  return last;
}

Status ClaimSocketPath(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoStatus(fmt::format("socket path {}", path), errno);
  }
  if (S_ISLNK(st.st_mode)) {
    return FailedPrecondition(fmt::format(
        "socket path {} is a symbolic link; refusing to follow or replace it", path));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return FailedPrecondition(fmt::format("socket path {} exists and is not a socket", path));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), std::min(path.size(), sizeof(addr.sun_path) - 1));
  int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return ErrnoStatus("socket", errno);
  const int rc = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(probe);
  if (rc == 0) {
    return FailedPrecondition(fmt::format(
        "another kvpool-node is serving {} (or some other process listens there); refusing to "
        "replace it",
        path));
  }
  // Only a refused connection proves nobody listens: anything else (a full
  // backlog, no permission) leaves the file alone.
  if (err != ECONNREFUSED) {
    return FailedPrecondition(fmt::format(
        "socket path {}: cannot tell whether a process serves it ({}); remove it if it is stale",
        path, std::strerror(err)));
  }
  if (::unlink(path.c_str()) != 0) {
    return ErrnoStatus(fmt::format("cannot remove the stale socket {}", path), errno);
  }
  LogInfo("socket: replaced the stale socket {} (nothing served it)", path);
  return Status::Ok();
}

Status SetSocketAccess(const std::string& path, uint32_t mode, const std::string& group) {
  // The directory is this user's (PrepareDir), so nothing swaps the file
  // between bind() and here; lstat still makes sure no link is followed.
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return FailedPrecondition(fmt::format("socket path {} changed after bind", path));
  }
  if (::chmod(path.c_str(), mode) != 0) return ErrnoStatus(fmt::format("chmod {}", path), errno);
  KVPOOL_ASSIGN_OR_RETURN(gid_t gid, LookUpGroup(group));
  if (gid != static_cast<gid_t>(-1) && ::lchown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return ErrnoStatus(fmt::format("cannot give {} to group {}", path, group), errno);
  }
  return Status::Ok();
}

}  // namespace kvpool
