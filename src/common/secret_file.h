// Reading a secret (a cluster key, a bearer token) from a file that only
// this process's user can read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpool {

// The contents of `path`, `what` naming it in errors ("cluster key file").
// The file must be a regular file (not a link), at most 4 KiB, owned by this
// process's effective user, with no permission for group or others (0600
// or 0400); otherwise FailedPrecondition with what to fix (chown, chmod).
Result<std::string> ReadSecretFile(const std::string& path, const std::string& what);

// The contents of a file that is not secret but decides who may do what
// (a tenants file): a regular file (not a link) of at most max_bytes, owned
// by this process's effective user or root, that group and others cannot
// write; otherwise FailedPrecondition with what to fix.
Result<std::string> ReadTrustedFile(const std::string& path, const std::string& what,
                                    uint64_t max_bytes);

// The lines of `text` that are not blank or comments ('#'), trimmed.
std::vector<std::string> SecretLines(const std::string& text);

}  // namespace kvpool
