// WaitFor: the one way a test waits for what another thread, a socket or a
// process does in its own time. It polls the condition and returns as soon
// as it holds, so a test waits no longer than it must; the timeout only
// bounds a failing test. A test that can drive the time itself (ManualClock)
// or run the work itself (a Sync, a Flush) does that instead.
#pragma once

#include <chrono>
#include <functional>

namespace kvpool::testing {

// Polls cond every `every` until it holds or timeout passes; returns its
// last answer (so a caller may ASSERT_TRUE on it).
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds timeout = std::chrono::seconds(10),
             std::chrono::milliseconds every = std::chrono::milliseconds(5));

}  // namespace kvpool::testing
