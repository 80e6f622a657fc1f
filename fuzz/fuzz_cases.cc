// libFuzzer target: the JSON case loader of `tilerope check`, then each loaded case small
// enough to run quickly, through the production kernels, the tile-layer reference kernels and
// the golden. Every input is loaded or rejected with tilerope::error; a case runs or is
// rejected with tilerope::error; never a crash or a sanitizer report.

#include <cstdint>
#include <string>

#include "check/case_file.h"
#include "check/ref_case.h"
#include "check/rope_case.h"
#include "tilerope/error.h"

namespace {
// Small enough for thousands of runs a second: the structure is what is fuzzed, not the size.
bool small(const tilerope::check::rope_case& c) {
  return c.batch <= 2 && c.tokens <= 8 && c.q_heads <= 4 && c.k_heads <= 4 && c.head_dim <= 128 &&
         c.max_pos <= 1024 && c.offset <= 1024;
}
bool small(const tilerope::check::ref_case& c) {
  return c.batch <= 2 && c.seq <= 8 && c.heads <= 4 && c.k_heads <= 4 && c.head_dim <= 128;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto cases = tilerope::check::cases_from_text(text, "fuzz.json");
    for (const auto& c : cases.rope_cases) {
      if (!small(c)) continue;
      try {
        (void)tilerope::check::run_case(c);
      } catch (const tilerope::error&) {
      }
    }
    for (const auto& c : cases.ref_cases) {
      if (!small(c)) continue;
      try {
        (void)tilerope::check::run_ref_case(c);
      } catch (const tilerope::error&) {
      }
    }
  } catch (const tilerope::error&) {
  }
  return 0;
}
