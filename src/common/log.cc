#include "common/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <string>

namespace kvpool {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
const char* LevelTag(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarn: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void LogLine(LogLevel level, std::string_view message) {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  gmtime_r(&tv.tv_sec, &t);
  std::string line = fmt::format("{} {:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z kvpool: {}\n",
                                 LevelTag(level), t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                                 t.tm_hour, t.tm_min, t.tm_sec, tv.tv_usec / 1000, message);
  ssize_t r = ::write(STDERR_FILENO, line.data(), line.size());
  (void)r;
}

}  // namespace kvpool
