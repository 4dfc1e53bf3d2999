// EnumNames: an enum's names, written once, next to the enum: the settings
// table parses and prints them (SettingsTable::AddEnum), and code that shows
// a value names it from the same table.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace kvpool {

template <typename E>
struct EnumName {
  std::string_view name;
  E value;
};

template <typename E, size_t N>
using EnumNames = std::array<EnumName<E>, N>;

// The name of v ("?" when the table lacks it).
template <typename E, size_t N>
constexpr std::string_view NameOf(const EnumNames<E, N>& names, E v) {
  for (const auto& n : names) {
    if (n.value == v) return n.name;
  }
  return "?";
}

// The value named `name`; nullopt when no name matches.
template <typename E, size_t N>
constexpr std::optional<E> ValueOf(const EnumNames<E, N>& names, std::string_view name) {
  for (const auto& n : names) {
    if (n.name == name) return n.value;
  }
  return std::nullopt;
}

}  // namespace kvpool
