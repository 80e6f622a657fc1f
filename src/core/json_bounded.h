#pragma once
// JSON from untrusted files (config.json, case files): nesting is limited while parsing, so
// that no later step (an error message's dump, a copy, the destructor) recurses without
// bound, and every failure of the parser is a tilerope::error naming the origin.

#include <nlohmann/json.hpp>
#include <string>

#include "tilerope/error.h"

namespace tilerope::detail {

// Deeper than any config or case file needs; far from what overflows a thread's stack.
inline constexpr int max_json_depth = 64;

template <class Input>
nlohmann::json parse_json_bounded(Input&& input, const std::string& origin) {
  const auto limit = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > max_json_depth) {
      throw error(origin + ": JSON nested deeper than " + std::to_string(max_json_depth) +
                  " levels");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(std::forward<Input>(input), limit);
  } catch (const nlohmann::json::exception& e) {
    throw error(origin + ": invalid JSON: " + e.what());
  }
}

}  // namespace tilerope::detail
