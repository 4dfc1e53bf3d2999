// The service manager's readiness protocol (systemd's sd_notify): one
// datagram of newline-separated KEY=value lines ("READY=1", "STATUS=...",
// "STOPPING=1") to the Unix datagram socket named by $NOTIFY_SOCKET, an
// abstract socket when the name starts with '@'. Nothing to do, and no
// error, when the variable is unset (not run by a service manager).
#pragma once

#include <string_view>

#include "common/status.h"

namespace kvpool {

// Sends `state` to $NOTIFY_SOCKET. OK when sent or when unset; an error
// (which the caller may log and ignore) when the socket cannot be reached.
Status NotifyServiceManager(std::string_view state);

}  // namespace kvpool
