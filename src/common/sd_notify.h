// The service manager's readiness protocol (systemd's sd_notify): one
// datagram of newline-separated KEY=value lines ("READY=1", "STATUS=...",
// "STOPPING=1") to the Unix datagram socket the service manager names in
// $NOTIFY_SOCKET (main reads it), an abstract socket when the name starts
// with '@'. Nothing to do, and no error, when there is none.
#pragma once

#include <string_view>

#include "common/status.h"

namespace kvpool {

// Sends `state` to the socket `name` ($NOTIFY_SOCKET; null or empty: none).
// OK when sent or when there is none; an error (which the caller may log
// and ignore) when the socket cannot be reached.
Status NotifyServiceManager(const char* name, std::string_view state);

}  // namespace kvpool
