// The admin dashboard: one self-contained HTML page (inline CSS and JS, no
// network fetches beyond the node's own /api/v1/status and /metrics).
//
// The page is authored in dashboard.html and compiled into the binary at
// build time (see CMakeLists.txt), so a node serves it with no files on disk.
// Thread-safe (immutable static data).
#pragma once

#include <string_view>

namespace kvpool {

// The page, UTF-8. Valid for the life of the process.
std::string_view DashboardHtml();

}  // namespace kvpool
