#include "protocol/socket_path.h"

#include <sys/stat.h>

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

}  // namespace kvpool::protocol
