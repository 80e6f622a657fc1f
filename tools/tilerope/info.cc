#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "tilerope/runtime.h"

namespace tilerope::cli {

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Version, SIMD targets compiled and chosen, threads");
  cmd->callback([] {
    std::printf("tilerope %s\n", std::string(version()).c_str());
    std::printf("cpu targets compiled:  %s\n", joined(compiled_cpu_targets()).c_str());
    std::printf("cpu targets supported: %s\n", joined(supported_cpu_targets()).c_str());
    std::printf("cpu target chosen:     %s\n", cpu_target().c_str());
    std::printf("cpu class:             %s\n", cpu_class().c_str());
    std::printf("threads:               %d\n", num_threads());
    std::printf("prefetch bytes:        %lld\n", static_cast<long long>(prefetch_bytes()));
  });
}

}  // namespace tilerope::cli
