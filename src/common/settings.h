// SettingsTable: one table of every setting of a program (name, type,
// default, bounds, help) that parses flags and a config file, validates,
// prints --help, and renders the effective values as JSON.
//
// Rows bind to fields of a plain options struct whose in-place initializers
// are the defaults. Not thread-safe; build and parse it before starting
// threads, then treat it as read-only (ToJson may be called concurrently).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/enum_names.h"
#include "common/status.h"

namespace kvpool {

enum class SettingType { kBool, kInt, kBytes, kDuration, kString, kEnum };

class SettingsTable {
 public:
  void AddBool(std::string name, bool* field, std::string help);
  // Integer rows bind fields of any integer type; bounds must fit the type.
  template <typename T>
  void AddInt(std::string name, T* field, int64_t min, int64_t max, std::string help) {
    AddIntRow(std::move(name), static_cast<int64_t>(*field), min, max, std::move(help),
              [field](int64_t v) { *field = static_cast<T>(v); },
              [field] { return static_cast<int64_t>(*field); });
  }
  // A duration field as a whole number of its own unit (microseconds for
  // std::chrono::microseconds): the row's name says the unit ("-us").
  template <typename Rep, typename Period>
  void AddInt(std::string name, std::chrono::duration<Rep, Period>* field, int64_t min, int64_t max,
              std::string help) {
    using D = std::chrono::duration<Rep, Period>;
    AddIntRow(
        std::move(name), static_cast<int64_t>(field->count()), min, max, std::move(help),
        [field](int64_t v) { *field = D(static_cast<Rep>(v)); },
        [field] { return static_cast<int64_t>(field->count()); });
  }
  template <typename T>
  void AddBytes(std::string name, T* field, uint64_t min, uint64_t max, std::string help) {
    AddBytesRow(std::move(name), static_cast<uint64_t>(*field), min, max, std::move(help),
                [field](uint64_t v) { *field = static_cast<T>(v); },
                [field] { return static_cast<uint64_t>(*field); });
  }
  void AddDuration(std::string name, std::chrono::milliseconds* field,
                   std::chrono::milliseconds min, std::chrono::milliseconds max, std::string help);
  void AddString(std::string name, std::string* field, std::string help);
  // An enum row of the names in `names` (common/enum_names.h), which must
  // outlive the table (a constant next to the enum).
  template <typename E, size_t N>
  void AddEnum(std::string name, E* field, const EnumNames<E, N>& names, std::string help) {
    std::vector<std::string> choices;
    for (const auto& n : names) choices.emplace_back(n.name);
    AddEnumRow(
        std::move(name), std::move(choices), std::move(help),
        [field, &names](size_t i) { *field = names[i].value; },
        [field, &names] { return std::string(NameOf(names, *field)); });
  }
  // A string row that takes one of `choices`.
  void AddEnum(std::string name, std::string* field, std::vector<std::string> choices,
               std::string help);

  // Parses and stores one value; InvalidArgument names the setting and why.
  Status Set(std::string_view name, std::string_view text);
  // Applies `name = value` lines (# starts a comment) from a file.
  Status LoadFile(const std::string& path);
  // Parses --name=value, --name value, --flag (bools), --no-flag, and
  // --config FILE (applied first, so flags override it). Sets *help when
  // --help is given. Positional arguments are refused.
  Status ParseArgs(int argc, const char* const* argv, bool* help);

  std::string HelpText(std::string_view program, std::string_view summary) const;
  // {"name": {"value": ..., "default": ..., "type": ..., "help": ...}, ...}
  std::string ToJson() const;

  // The parsers behind bytes and duration rows, also used by the tools so
  // that a value means the same on every command line. Sizes: "64MiB", "1G",
  // "4096" (binary units; a bare number is bytes). Durations: "10s",
  // "500ms", "2m", "1h", "250" (a bare number is milliseconds). On bad input
  // the InvalidArgument names `flag` ("--flag: not a size ...: 'text'"),
  // exactly as a bytes or duration row reports it; no bounds are applied.
  static Result<uint64_t> ParseSize(std::string_view flag, std::string_view text);
  static Result<std::chrono::milliseconds> ParseDuration(std::string_view flag,
                                                         std::string_view text);
  // The same, as bare predicates.
  static bool ParseBytes(std::string_view text, uint64_t* out);
  static bool ParseDurationMs(std::string_view text, int64_t* out);
  // Largest exact binary unit: 3MiB, 1GiB, 1000 (no unit: bytes).
  static std::string FormatBytes(uint64_t v);

 private:
  struct Row {
    std::string name;
    SettingType type;
    std::string default_text;
    std::string help;
    std::string bounds_text;
    std::function<Status(std::string_view)> set;
    std::function<std::string()> get;
  };
  Row* Find(std::string_view name);
  void AddIntRow(std::string name, int64_t initial, int64_t min, int64_t max, std::string help,
                 std::function<void(int64_t)> set, std::function<int64_t()> get);
  void AddBytesRow(std::string name, uint64_t initial, uint64_t min, uint64_t max,
                   std::string help, std::function<void(uint64_t)> set,
                   std::function<uint64_t()> get);
  // set(i): choices[i] was given; get(): the current value's name.
  void AddEnumRow(std::string name, std::vector<std::string> choices, std::string help,
                  std::function<void(size_t)> set, std::function<std::string()> get);
  std::vector<Row> rows_;
};

}  // namespace kvpool
