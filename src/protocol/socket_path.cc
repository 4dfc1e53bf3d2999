#include "protocol/socket_path.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fmt/format.h>

namespace kvpool::protocol {

std::vector<std::string> DefaultSocketDirs(const char* xdg_runtime_dir, uid_t uid) {
  std::vector<std::string> dirs = {kSystemSocketDir};
  // A relative or empty value is ignored, as the XDG spec asks.
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] == '/') {
    std::string x = xdg_runtime_dir;
    while (x.size() > 1 && x.back() == '/') x.pop_back();
    dirs.push_back(x + "/kvpool");
  }
  dirs.push_back("/tmp/kvpool-" + std::to_string(uid));
  return dirs;
}

std::string FindDefaultSocket(const char* xdg_runtime_dir, uid_t uid) {
  const std::vector<std::string> dirs = DefaultSocketDirs(xdg_runtime_dir, uid);
  for (const auto& dir : dirs) {
    const std::string path = dir + "/" + kSocketFileName;
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return path;
  }
  return dirs.front() + "/" + kSocketFileName;
}

std::string SocketDirOf(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return socket_path.substr(0, slash);
}

SocketDirKind KindOfSocketDir(const std::string& dir, const char* xdg_runtime_dir, uid_t uid) {
  const std::vector<std::string> dirs = DefaultSocketDirs(xdg_runtime_dir, uid);
  if (dirs.size() == 3 && dir == dirs[1]) return SocketDirKind::kXdg;
  if (dir == dirs.back()) return SocketDirKind::kTmp;
  return SocketDirKind::kShared;
}

int64_t ServiceUid() {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);  // large NSS entries need room
  if (getpwnam_r("kvpool", &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return -1;
  }
  return found->pw_uid;
}

Result<std::vector<int64_t>> CheckSocketDirForClient(const std::string& socket_path,
                                                     SocketDirKind kind, uid_t client_uid) {
  const std::string dir = SocketDirOf(socket_path);
  struct stat st;
  if (::lstat(socket_path.c_str(), &st) != 0 && errno == ENOENT) {
    return Unavailable(fmt::format("no kvpool node at {}: no socket there", socket_path));
  }
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return Unavailable(fmt::format("no kvpool node at {}: {} does not exist", socket_path, dir));
    }
    return ErrnoStatus(fmt::format("socket directory {}", dir), errno);
  }
  auto refuse = [&](const std::string& why) {
    return FailedPrecondition(fmt::format(
        "refusing the socket {}: its directory {} (owner uid {}, mode {:o}) {}; another user "
        "may have taken its name, so nothing was sent to it",
        socket_path, dir, st.st_uid, st.st_mode & 07777, why));
  };
  if (S_ISLNK(st.st_mode)) return refuse("is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return refuse("is not a directory");
  if (kind != SocketDirKind::kShared) {
    const bool tmp = kind == SocketDirKind::kTmp;
    if (st.st_uid != client_uid || (tmp && (st.st_mode & 077) != 0)) {
      return refuse(fmt::format(
          "is a per-user socket directory and must be owned by this user (uid {}){}", client_uid,
          tmp ? " with mode 0700" : ""));
    }
    return std::vector<int64_t>{static_cast<int64_t>(client_uid)};
  }
  const int64_t service = ServiceUid();
  if (st.st_uid != 0 && st.st_uid != client_uid && static_cast<int64_t>(st.st_uid) != service) {
    return refuse(fmt::format(
        "must belong to root, to this user (uid {}){}; set kvpool_options.expected_server_uid "
        "to trust another user's node",
        client_uid, service >= 0 ? fmt::format(" or to the service user kvpool (uid {})", service)
                                 : std::string()));
  }
  if ((st.st_mode & S_IWOTH) != 0) {
    return refuse(
        "is writable by others; set kvpool_options.expected_server_uid to trust such a node");
  }
  std::vector<int64_t> servers = {static_cast<int64_t>(st.st_uid), 0};
  if (st.st_uid == 0 && service >= 0) servers.push_back(service);
  return servers;
}

}  // namespace kvpool::protocol
