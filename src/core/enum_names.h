#pragma once
// The names of a scoped enum's values in one table, which both to_string and from_string read:
// a name cannot be added to one and forgotten in the other. Aliases (accepted, never printed)
// follow the names.

#include <string>
#include <string_view>

#include "tilerope/error.h"

namespace tilerope::detail {

template <class E>
struct enum_name {
  E value;
  std::string_view name;
  bool alias = false;
};

// The name of `value`, or "?" for a value outside the enum.
template <class E, std::size_t N>
constexpr std::string_view name_of(const enum_name<E> (&names)[N], E value) {
  for (const auto& n : names) {
    if (!n.alias && n.value == value) return n.name;
  }
  return "?";
}

// The value named `name`; else tilerope::error "<what> '<name>' is not one of <names> (also:
// <aliases>)".
template <class E, std::size_t N>
E value_named(const enum_name<E> (&names)[N], std::string_view name, std::string_view what) {
  std::string listed, aliases;
  for (const auto& n : names) {
    if (n.name == name) return n.value;
    std::string& to = n.alias ? aliases : listed;
    to += (to.empty() ? "" : ", ") + std::string(n.name);
  }
  throw error(std::string(what) + " '" + std::string(name) + "' is not one of " + listed +
              (aliases.empty() ? "" : " (also: " + aliases + ")"));
}

}  // namespace tilerope::detail
