// Small parsers and formatters shared by kvpool's command-line tools.
// Header-only; the tools link only the public client library.
#pragma once

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvpool::tools {

// "64KiB", "1MiB", "1M", "4096" -> bytes (binary units; "kB"/"KB" are 1024
// too, as in the node's settings). False when malformed or zero.
inline bool ParseBytes(std::string_view text, uint64_t* out) {
  size_t i = 0;
  uint64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (n > (UINT64_MAX - 9) / 10) return false;
    n = n * 10 + static_cast<uint64_t>(text[i] - '0');
    ++i;
  }
  if (i == 0) return false;
  std::string unit;
  for (char c : text.substr(i)) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift;
  if (unit.empty() || unit == "b") shift = 0;
  else if (unit == "k" || unit == "kb" || unit == "kib") shift = 10;
  else if (unit == "m" || unit == "mb" || unit == "mib") shift = 20;
  else if (unit == "g" || unit == "gb" || unit == "gib") shift = 30;
  else return false;
  if (n == 0 || n > (UINT64_MAX >> shift)) return false;
  *out = n << shift;
  return true;
}

// "5s", "500ms", "2m", "3" (seconds) -> milliseconds. False when malformed.
inline bool ParseDurationMs(std::string_view text, int64_t* out) {
  size_t i = 0;
  int64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (n > 1'000'000'000) return false;
    n = n * 10 + (text[i] - '0');
    ++i;
  }
  if (i == 0) return false;
  std::string_view unit = text.substr(i);
  if (unit.empty() || unit == "s") *out = n * 1000;
  else if (unit == "ms") *out = n;
  else if (unit == "m" || unit == "min") *out = n * 60000;
  else return false;
  return true;
}

inline std::string FormatBytes(uint64_t v) {
  if (v >= (1ull << 30) && v % (1ull << 30) == 0) return std::to_string(v >> 30) + "GiB";
  if (v >= (1ull << 20) && v % (1ull << 20) == 0) return std::to_string(v >> 20) + "MiB";
  if (v >= (1ull << 10) && v % (1ull << 10) == 0) return std::to_string(v >> 10) + "KiB";
  return std::to_string(v) + "B";
}

}  // namespace kvpool::tools
