#pragma once
// CLI11 saturates an int64 option that is out of range (2^64 reads as 2^63 - 1); this
// validator rejects such a value instead, naming it.

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>

namespace tilerope::cli {

inline CLI::Validator int64_in(std::int64_t lo, std::int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        std::int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [at, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || at != end || v < lo || v > hi) {
          return "'" + text + "' is not an integer in " + range;
        }
        return {};
      },
      "INT in " + range);
}

}  // namespace tilerope::cli
