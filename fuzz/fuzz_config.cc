// libFuzzer target: the Hugging Face config.json reader, then the frequencies and a small
// cos/sin table of what it accepts. Every input is read or rejected with tilerope::error.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/rope_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto c = tilerope::rope_config::from_hf_json_text(text, "fuzz.json");
    for (std::int64_t seq_len : {0, 1, 4096, 1 << 20}) {
      const auto f = c.frequencies(seq_len);
      for (double v : f.inv_freq) {
        if (std::isnan(v)) std::abort();  // a validated config gives numbers
      }
    }
    if (c.head_dim <= 512) (void)tilerope::make_rope_table(8, c.frequencies(8));
  } catch (const tilerope::error&) {
  }
  return 0;
}
