#include "common/settings.h"

#include <fmt/format.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvpool {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ParseI64(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string Unquote(std::string_view v) {
  if (v.size() >= 2 && ((v.front() == '"' && v.back() == '"') || (v.front() == '\'' && v.back() == '\''))) {
    return std::string(v.substr(1, v.size() - 2));
  }
  return std::string(v);
}

const char* TypeName(SettingType t) {
  switch (t) {
    case SettingType::kBool: return "bool";
    case SettingType::kInt: return "int";
    case SettingType::kBytes: return "bytes";
    case SettingType::kDuration: return "duration";
    case SettingType::kString: return "string";
    case SettingType::kEnum: return "enum";
  }
  return "?";
}

}  // namespace

bool SettingsTable::ParseBytes(std::string_view text, uint64_t* out) {
  text = Trim(text);
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  uint64_t n;
  if (!ParseU64(text.substr(0, i), &n)) return false;
  std::string unit(Trim(text.substr(i)));
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t mul;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mul = 1ull << 10;
  else if (unit == "m" || unit == "mb" || unit == "mib") mul = 1ull << 20;
  else if (unit == "g" || unit == "gb" || unit == "gib") mul = 1ull << 30;
  else if (unit == "t" || unit == "tb" || unit == "tib") mul = 1ull << 40;
  else return false;
  if (n > std::numeric_limits<uint64_t>::max() / mul) return false;
  *out = n * mul;
  return true;
}

bool SettingsTable::ParseDurationMs(std::string_view text, int64_t* out) {
  text = Trim(text);
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  uint64_t n;
  if (!ParseU64(text.substr(0, i), &n)) return false;
  std::string_view unit = Trim(text.substr(i));
  uint64_t mul;
  if (unit.empty() || unit == "ms") mul = 1;
  else if (unit == "s") mul = 1000;
  else if (unit == "m" || unit == "min") mul = 60000;
  else if (unit == "h") mul = 3600000;
  else return false;
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / mul) return false;
  *out = static_cast<int64_t>(n * mul);
  return true;
}

Result<uint64_t> SettingsTable::ParseSize(std::string_view flag, std::string_view text) {
  uint64_t v;
  if (!ParseBytes(text, &v))
    return InvalidArgument(fmt::format("--{}: not a size (e.g. 64MiB, 1G, 4096): '{}'", flag, text));
  return v;
}

Result<std::chrono::milliseconds> SettingsTable::ParseDuration(std::string_view flag,
                                                               std::string_view text) {
  int64_t v;
  if (!ParseDurationMs(text, &v))
    return InvalidArgument(fmt::format("--{}: not a duration (e.g. 10s, 500ms): '{}'", flag, text));
  return std::chrono::milliseconds(v);
}

std::string SettingsTable::FormatBytes(uint64_t v) {
  static const char* kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  static const int kShifts[] = {40, 30, 20, 10};
  for (int i = 0; i < 4; ++i) {
    uint64_t m = 1ull << kShifts[i];
    if (v != 0 && v % m == 0) return fmt::format("{}{}", v / m, kUnits[i]);
  }
  return fmt::format("{}", v);
}

void SettingsTable::AddBool(std::string name, bool* field, std::string help) {
  Row r{name, SettingType::kBool, *field ? "true" : "false", std::move(help), "", nullptr, nullptr};
  r.set = [field, name](std::string_view t) {
    if (t == "true" || t == "1" || t == "yes" || t == "on") *field = true;
    else if (t == "false" || t == "0" || t == "no" || t == "off") *field = false;
    else return InvalidArgument(fmt::format("--{}: expected true or false, got '{}'", name, t));
    return Status::Ok();
  };
  r.get = [field] { return std::string(*field ? "true" : "false"); };
  rows_.push_back(std::move(r));
}

void SettingsTable::AddIntRow(std::string name, int64_t initial, int64_t min, int64_t max,
                              std::string help, std::function<void(int64_t)> set,
                              std::function<int64_t()> get) {
  Row r{name, SettingType::kInt, std::to_string(initial), std::move(help),
        fmt::format("{}..{}", min, max), nullptr, nullptr};
  r.set = [=](std::string_view t) {
    int64_t v;
    if (!ParseI64(Trim(t), &v)) return InvalidArgument(fmt::format("--{}: not an integer: '{}'", name, t));
    if (v < min || v > max)
      return InvalidArgument(fmt::format("--{}: {} is outside {}..{}", name, v, min, max));
    set(v);
    return Status::Ok();
  };
  r.get = [get] { return std::to_string(get()); };
  rows_.push_back(std::move(r));
}

void SettingsTable::AddBytesRow(std::string name, uint64_t initial, uint64_t min, uint64_t max,
                                std::string help, std::function<void(uint64_t)> set,
                                std::function<uint64_t()> get) {
  Row r{name, SettingType::kBytes, FormatBytes(initial), std::move(help),
        fmt::format("{}..{}", FormatBytes(min), FormatBytes(max)), nullptr, nullptr};
  r.set = [=](std::string_view t) {
    Result<uint64_t> parsed = ParseSize(name, t);
    if (!parsed.ok()) return parsed.status();
    const uint64_t v = *parsed;
    if (v < min || v > max)
      return InvalidArgument(fmt::format("--{}: {} is outside {}..{}", name, FormatBytes(v),
                                         FormatBytes(min), FormatBytes(max)));
    set(v);
    return Status::Ok();
  };
  r.get = [get] { return FormatBytes(get()); };
  rows_.push_back(std::move(r));
}

void SettingsTable::AddDuration(std::string name, std::chrono::milliseconds* field,
                                std::chrono::milliseconds min, std::chrono::milliseconds max,
                                std::string help) {
  Row r{name, SettingType::kDuration, fmt::format("{}ms", field->count()), std::move(help),
        fmt::format("{}ms..{}ms", min.count(), max.count()), nullptr, nullptr};
  r.set = [=](std::string_view t) {
    Result<std::chrono::milliseconds> parsed = ParseDuration(name, t);
    if (!parsed.ok()) return parsed.status();
    const int64_t v = parsed->count();
    if (v < min.count() || v > max.count())
      return InvalidArgument(fmt::format("--{}: {}ms is outside {}ms..{}ms", name, v, min.count(),
                                         max.count()));
    *field = std::chrono::milliseconds(v);
    return Status::Ok();
  };
  r.get = [field] { return fmt::format("{}ms", field->count()); };
  rows_.push_back(std::move(r));
}

void SettingsTable::AddString(std::string name, std::string* field, std::string help) {
  Row r{name, SettingType::kString, *field, std::move(help), "", nullptr, nullptr};
  r.set = [field](std::string_view t) {
    *field = std::string(t);
    return Status::Ok();
  };
  r.get = [field] { return *field; };
  rows_.push_back(std::move(r));
}

void SettingsTable::AddEnum(std::string name, std::string* field, std::vector<std::string> choices,
                            std::string help) {
  AddEnumRow(
      std::move(name), choices, std::move(help),
      [field, choices](size_t i) { *field = choices[i]; }, [field] { return *field; });
}

void SettingsTable::AddEnumRow(std::string name, std::vector<std::string> choices, std::string help,
                               std::function<void(size_t)> set, std::function<std::string()> get) {
  std::string joined;
  for (const auto& c : choices) joined += (joined.empty() ? "" : "|") + c;
  Row r{name, SettingType::kEnum, get(), std::move(help), joined, nullptr, std::move(get)};
  r.set = [name, choices = std::move(choices), joined, set = std::move(set)](std::string_view t) {
    for (size_t i = 0; i < choices.size(); ++i) {
      if (choices[i] == t) {
        set(i);
        return Status::Ok();
      }
    }
    return InvalidArgument(fmt::format("--{}: '{}' is not one of {}", name, t, joined));
  };
  rows_.push_back(std::move(r));
}

SettingsTable::Row* SettingsTable::Find(std::string_view name) {
  for (auto& r : rows_) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

Status SettingsTable::Set(std::string_view name, std::string_view text) {
  Row* r = Find(name);
  if (r == nullptr) return InvalidArgument(fmt::format("unknown setting '{}' (see --help)", name));
  return r->set(text);
}

Status SettingsTable::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(fmt::format("cannot read config file '{}'", path));
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string_view l = line;
    if (auto hash = l.find('#'); hash != std::string_view::npos) l = l.substr(0, hash);
    l = Trim(l);
    if (l.empty()) continue;
    auto eq = l.find('=');
    if (eq == std::string_view::npos)
      return InvalidArgument(fmt::format("{}:{}: expected 'name = value'", path, lineno));
    std::string_view name = Trim(l.substr(0, eq));
    std::string value = Unquote(Trim(l.substr(eq + 1)));
    Status s = Set(name, value);
    if (!s.ok()) return InvalidArgument(fmt::format("{}:{}: {}", path, lineno, s.message()));
  }
  return Status::Ok();
}

Status SettingsTable::ParseArgs(int argc, const char* const* argv, bool* help) {
  *help = false;
  // The config file first, so that flags override it.
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--config") {
      if (i + 1 >= argc) return InvalidArgument("--config needs a file");
      KVPOOL_RETURN_IF_ERROR(LoadFile(argv[i + 1]));
    } else if (a.starts_with("--config=")) {
      KVPOOL_RETURN_IF_ERROR(LoadFile(std::string(a.substr(9))));
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      continue;
    }
    if (a == "--config") {
      ++i;
      continue;
    }
    if (a.starts_with("--config=")) continue;
    if (!a.starts_with("--")) return InvalidArgument(fmt::format("unexpected argument '{}'", a));
    a.remove_prefix(2);
    if (auto eq = a.find('='); eq != std::string_view::npos) {
      KVPOOL_RETURN_IF_ERROR(Set(a.substr(0, eq), a.substr(eq + 1)));
      continue;
    }
    Row* r = Find(a);
    if (r == nullptr && a.starts_with("no-")) {
      Row* b = Find(a.substr(3));
      if (b != nullptr && b->type == SettingType::kBool) {
        KVPOOL_RETURN_IF_ERROR(b->set("false"));
        continue;
      }
    }
    if (r == nullptr) return InvalidArgument(fmt::format("unknown flag '--{}' (see --help)", a));
    if (r->type == SettingType::kBool) {
      KVPOOL_RETURN_IF_ERROR(r->set("true"));
      continue;
    }
    if (i + 1 >= argc) return InvalidArgument(fmt::format("--{} needs a value", a));
    KVPOOL_RETURN_IF_ERROR(r->set(argv[++i]));
  }
  return Status::Ok();
}

std::string SettingsTable::HelpText(std::string_view program, std::string_view summary) const {
  std::ostringstream o;
  o << "usage: " << program << " [--config FILE] [--setting=value ...]\n"
    << "       " << program << " --help | --version\n\n"
    << summary << "\n\n";
  o << "Settings (flags, or 'name = value' lines in the --config file):\n";
  for (const auto& r : rows_) {
    std::string head = fmt::format("  --{} <{}>", r.name, TypeName(r.type));
    o << fmt::format("{:<40} {}\n", head, r.help);
    o << fmt::format("{:<40} default: {}{}\n", "",
                     r.default_text.empty() ? "\"\"" : r.default_text,
                     r.bounds_text.empty() ? "" : fmt::format("; allowed: {}", r.bounds_text));
  }
  o << "  --help                                   print this help\n";
  return o.str();
}

std::string SettingsTable::ToJson() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& r : rows_) {
    j[r.name] = {{"value", r.get()},
                 {"default", r.default_text},
                 {"type", TypeName(r.type)},
                 {"allowed", r.bounds_text},
                 {"help", r.help}};
  }
  return j.dump(2);
}

}  // namespace kvpool
