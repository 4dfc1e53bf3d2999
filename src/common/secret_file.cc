#include "common/secret_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/settings.h"

namespace kvpool {

namespace {

// What a protected file must be: who may own it, which mode bits it may
// not have, how large it may be.
struct FileRules {
  bool root_may_own = false;
  mode_t forbidden_bits = 077;
  const char* fix_mode = "chmod 600";
  const char* forbidden_what = "group and others may not have any access";
  uint64_t max_bytes = 4096;
};

Result<std::string> ReadProtected(const std::string& path, const std::string& what,
                                  const FileRules& rules) {
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
  const bool owner_ok = st.st_uid == geteuid() || (rules.root_may_own && st.st_uid == 0);
  if (!S_ISREG(st.st_mode)) {
    bad = FailedPrecondition(fmt::format("{} {} is not a regular file", what, path));
  } else if (!owner_ok) {
    bad = FailedPrecondition(fmt::format(
        "{} {} is owned by uid {}, not by this process's user (uid {}){}; chown it", what, path,
        st.st_uid, geteuid(), rules.root_may_own ? " or root" : ""));
  } else if ((st.st_mode & rules.forbidden_bits) != 0) {
    bad = FailedPrecondition(fmt::format("{} {} has mode {:04o}: {}; {} it", what, path,
                                         st.st_mode & 07777, rules.forbidden_what,
                                         rules.fix_mode));
  } else if (static_cast<uint64_t>(st.st_size) > rules.max_bytes) {
    bad = FailedPrecondition(fmt::format("{} {} is larger than {}", what, path,
                                         SettingsTable::FormatBytes(rules.max_bytes)));
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

}  // namespace

Result<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  return ReadProtected(path, what, FileRules{});
}

Result<std::string> ReadTrustedFile(const std::string& path, const std::string& what,
                                    uint64_t max_bytes) {
  return ReadProtected(path, what,
                       FileRules{true, 022, "chmod go-w", "group and others may not write it",
                                 max_bytes});
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
