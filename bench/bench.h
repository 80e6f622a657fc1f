#pragma once
// tilerope bench: kernels against the memory-bandwidth ceiling measured in the same run.

#include <optional>
#include <string>

namespace tilerope::bench {

struct bench_options {
  bool quick = false;               ///< the subset that covers every target, in under 2 minutes
  std::optional<std::string> json;  ///< write all rows to this file
  int repeats = 0;                  ///< timed runs per row (0: 10 quick, 20 full)
  std::string only;                 ///< run only the kernels whose name contains this
};

/// Runs the table, prints it, writes JSON if asked. Returns 0.
int run_bench(const bench_options& options);

}  // namespace tilerope::bench
