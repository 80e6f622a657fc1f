#include "bench.h"

#include <memory>
#include <string>

#include "commands.h"

namespace tilerope::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench",
                                 "Kernels against the memory-bandwidth ceiling and an unfused "
                                 "baseline, measured in the same run");
  auto o = std::make_shared<bench::bench_options>();
  auto json = std::make_shared<std::string>();
  cmd->add_flag("--quick", o->quick, "The subset covering every target, under 2 minutes");
  cmd->add_option("--json", *json, "Write every row to this JSON file");
  cmd->add_option("--repeats", o->repeats, "Timed runs per row (default 10 quick, 20 full)");
  cmd->add_option("--only", o->only,
                  "Only the kernels whose name contains this (e.g. qk-norm; prefetch: the "
                  "prefetch-distance sweep)");
  cmd->callback([o, json] {
    if (!json->empty()) o->json = *json;
    bench::run_bench(*o);
  });
}

}  // namespace tilerope::cli
