#include "common/secret_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace kvpool {

Result<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return FailedPrecondition(fmt::format("{} {}: {}", what, path, std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return FailedPrecondition(fmt::format("{} {}: cannot stat", what, path));
  }
  Status bad = Status::Ok();
  if (!S_ISREG(st.st_mode)) {
    bad = FailedPrecondition(fmt::format("{} {} is not a regular file", what, path));
  } else if (st.st_uid != geteuid()) {
    bad = FailedPrecondition(fmt::format(
        "{} {} is owned by uid {}, not by this process's user (uid {}); chown it", what, path,
        st.st_uid, geteuid()));
  } else if ((st.st_mode & 077) != 0) {
    bad = FailedPrecondition(fmt::format(
        "{} {} has mode {:04o}: group and others may not have any access; chmod 600 it", what,
        path, st.st_mode & 07777));
  } else if (st.st_size > 4096) {
    bad = FailedPrecondition(fmt::format("{} {} is larger than 4 KiB", what, path));
  }
  std::string text;
  if (bad.ok()) {
    text.resize(static_cast<size_t>(st.st_size));
    ssize_t n = read(fd, text.data(), text.size());
    if (n < 0) bad = FailedPrecondition(fmt::format("{} {}: {}", what, path, std::strerror(errno)));
    text.resize(n < 0 ? 0 : static_cast<size_t>(n));
  }
  ::close(fd);
  if (!bad.ok()) return bad;
  return text;
}

std::vector<std::string> SecretLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    size_t e = line.find_last_not_of(" \t\r");
    out.push_back(line.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace kvpool
