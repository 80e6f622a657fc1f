// tilerope: the command-line program. Subcommands: check, apply, freqs, run, bench, info.
// Every error prints "tilerope: error: <message>" and exits 2.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "apply.h"
#include "bench.h"
#include "check.h"
#include "freqs.h"
#include "run.h"
#include "tilerope/error.h"
#include "tilerope/runtime.h"

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench",
                                 "Kernels against the memory-bandwidth ceiling and an unfused "
                                 "baseline, measured in the same run");
  auto o = std::make_shared<tilerope::bench::bench_options>();
  auto json = std::make_shared<std::string>();
  cmd->add_flag("--quick", o->quick, "The subset covering every target, under 2 minutes");
  cmd->add_option("--json", *json, "Write every row to this JSON file");
  cmd->add_option("--repeats", o->repeats, "Timed runs per row (default 10 quick, 20 full)");
  cmd->add_option("--only", o->only,
                  "Only the kernels whose name contains this (e.g. qk-norm; prefetch: the "
                  "prefetch-distance sweep)");
  cmd->callback([o, json] {
    if (!json->empty()) o->json = *json;
    tilerope::bench::run_bench(*o);
  });
}

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Version, SIMD targets compiled and chosen, threads");
  cmd->callback([] {
    std::printf("tilerope %s\n", std::string(tilerope::version()).c_str());
    std::printf("cpu targets compiled:  %s\n", joined(tilerope::compiled_cpu_targets()).c_str());
    std::printf("cpu targets supported: %s\n", joined(tilerope::supported_cpu_targets()).c_str());
    std::printf("cpu target chosen:     %s\n", tilerope::cpu_target().c_str());
    std::printf("threads:               %d\n", tilerope::num_threads());
    std::printf("prefetch bytes:        %lld\n",
                static_cast<long long>(tilerope::prefetch_bytes()));
  });
}

int fail(const std::string& message) {
  std::fprintf(stderr, "tilerope: error: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tilerope: rotary position embedding kernels, checked against an fp64 golden"};
  app.require_subcommand(1);
  int exit_code = 0;
  tilerope::cli::add_check_command(app, exit_code);
  tilerope::cli::add_apply_command(app);
  tilerope::cli::add_freqs_command(app);
  tilerope::cli::add_run_command(app, exit_code);
  add_bench_command(app);
  add_info_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(e.what());
  } catch (const tilerope::error& e) {
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return exit_code;
}
