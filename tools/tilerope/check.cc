#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "check/builtin_cases.h"
#include "check/case_file.h"
#include "commands.h"
#include "tilerope/error.h"
#include "tilerope/runtime.h"

namespace tilerope::cli {

namespace {

using check::ref_case;
using check::rope_case;

// One printed row of `tilerope check`.
struct row {
  std::string name, variant, dtype, shape, note;
  double max_abs = 0, max_rel = 0, atol = 0, rtol = 0;
  bool pass = false;
};

row run_one(const rope_case& c) {
  row r{c.name, check::variant_of(c), std::string(to_string(c.x_type)), check::shape_of(c), ""};
  try {
    const check::case_result res = check::run_case(c);
    r.max_abs = res.max_abs_err;
    r.max_rel = res.max_rel_err;
    r.atol = res.atol;
    r.rtol = res.rtol;
    r.pass = res.pass;
    r.note = res.problem;
  } catch (const error& e) {
    r.note = e.what();
  }
  return r;
}

row run_one(const ref_case& c) {
  row r{c.name, check::ref_variant_of(c), std::string(to_string(c.x_type)), "", ""};
  try {
    const check::ref_result res = check::run_ref_case(c);
    r.shape = res.shape;
    r.max_abs = res.max_abs_err;
    r.max_rel = res.max_rel_err;
    r.atol = res.atol;
    r.rtol = res.rtol;
    r.pass = res.pass;
    char note[96];
    std::snprintf(note, sizeof note, "ub %zu/%zu", res.report.peak_ub_bytes,
                  res.report.ub_budget_bytes);
    r.note = note;
    if (res.prod_max_abs_err) {
      std::snprintf(note, sizeof note, " prod %.3e", *res.prod_max_abs_err);
      r.note += note;
    }
    if (!res.problem.empty()) r.note += " " + res.problem;
  } catch (const error& e) {
    r.note = e.what();
  }
  return r;
}

}  // namespace

void add_check_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "check",
      "Run the built-in cases (and CASES.json files) through the fp64 golden, the "
      "production kernels and the tile-layer reference kernels; one row per case; exit 0 "
      "only if all pass");
  auto files = std::make_shared<std::vector<std::string>>();
  auto no_builtin = std::make_shared<bool>(false);
  cmd->add_option("cases", *files,
                  "JSON case files: a list of case objects or {\"cases\": [...]}; a case with a "
                  "\"kernel\" key runs a reference kernel");
  cmd->add_flag("--no-builtin", *no_builtin, "Run only the cases of the given files");
  cmd->callback([files, no_builtin, &exit_code] {
    std::vector<rope_case> rope_cases;
    std::vector<ref_case> ref_cases;
    if (!*no_builtin) {
      rope_cases = check::builtin_cases();
      ref_cases = check::builtin_ref_cases();
    }
    for (const auto& f : *files) {
      check::case_list from_file = check::cases_from_file(f);
      rope_cases.insert(rope_cases.end(), from_file.rope_cases.begin(), from_file.rope_cases.end());
      ref_cases.insert(ref_cases.end(), from_file.ref_cases.begin(), from_file.ref_cases.end());
    }
    std::printf("tilerope check: cpu target %s, %d threads, prefetch %lld bytes\n",
                cpu_target().c_str(), num_threads(), static_cast<long long>(prefetch_bytes()));
    std::printf("%-40s %-22s %-5s %-34s %10s %10s %17s  %s\n", "case", "variant", "dtype", "shape",
                "max_abs", "max_rel", "tol (atol/rtol)", "result");
    int passed = 0, failed = 0;
    auto print = [&](const row& r) {
      char tol[64];
      std::snprintf(tol, sizeof tol, "%.1e/%.1e", r.atol, r.rtol);
      std::printf("%-40s %-22s %-5s %-34s %10.3e %10.3e %17s  %s%s%s\n", r.name.c_str(),
                  r.variant.c_str(), r.dtype.c_str(), r.shape.c_str(), r.max_abs, r.max_rel, tol,
                  r.pass ? "PASS" : "FAIL", r.note.empty() ? "" : "  ", r.note.c_str());
      std::fflush(stdout);
      (r.pass ? passed : failed)++;
    };
    for (const auto& c : rope_cases) print(run_one(c));
    for (const auto& c : ref_cases) print(run_one(c));
    std::printf("%d passed, %d failed\n", passed, failed);
    exit_code = failed ? 1 : 0;
  });
}

}  // namespace tilerope::cli
