// Minimal leveled logging to stderr: one line per call, timestamped.
// Thread-safe (each line is written with one write(2)).
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "common/enum_names.h"

namespace kvpool {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
inline constexpr EnumNames<LogLevel, 4> kLogLevelNames = {{{"debug", LogLevel::kDebug},
                                                           {"info", LogLevel::kInfo},
                                                           {"warn", LogLevel::kWarn},
                                                           {"error", LogLevel::kError}}};

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogLine(LogLevel level, std::string_view message);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < GetLogLevel()) return;
  LogLine(level, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void LogInfo(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kInfo, f, std::forward<Args>(args)...);
}
template <typename... Args>
void LogWarn(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kWarn, f, std::forward<Args>(args)...);
}
template <typename... Args>
void LogError(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kError, f, std::forward<Args>(args)...);
}
template <typename... Args>
void LogDebug(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kDebug, f, std::forward<Args>(args)...);
}

}  // namespace kvpool
