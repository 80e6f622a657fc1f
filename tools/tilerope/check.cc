#include "check.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cases.h"
#include "tilerope/error.h"
#include "tilerope/runtime.h"

namespace tilerope::cli {

void add_check_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "check", "Run the built-in cases (and CASES.json files) through the fp64 golden and the "
               "production kernels; one row per case; exit 0 only if all pass");
  auto files = std::make_shared<std::vector<std::string>>();
  auto no_builtin = std::make_shared<bool>(false);
  cmd->add_option("cases", *files, "JSON case files: a list of case objects or {\"cases\": [...]}");
  cmd->add_flag("--no-builtin", *no_builtin, "Run only the cases of the given files");
  cmd->callback([files, no_builtin, &exit_code] {
    std::vector<rope_case> cases;
    if (!*no_builtin) cases = builtin_cases();
    for (const auto& f : *files) {
      auto more = cases_from_file(f);
      cases.insert(cases.end(), more.begin(), more.end());
    }
    std::printf("tilerope check: cpu target %s, %d threads\n", cpu_target().c_str(), num_threads());
    std::printf("%-34s %-10s %-5s %-30s %10s %10s %18s  %s\n", "case", "variant", "dtype",
                "shape", "max_abs", "max_rel", "tol (atol/rtol)", "result");
    int passed = 0, failed = 0;
    for (const auto& c : cases) {
      case_result r;
      std::string note;
      try {
        r = run_case(c);
      } catch (const error& e) {
        r.pass = false;
        note = e.what();
      }
      if (!r.problem.empty()) note = r.problem;
      char tol[64];
      std::snprintf(tol, sizeof tol, "%.1e/%.1e", r.atol, r.rtol);
      std::printf("%-34s %-10s %-5s %-30s %10.3e %10.3e %18s  %s%s%s\n", c.name.c_str(),
                  variant_of(c).c_str(), std::string(to_string(c.x_type)).c_str(),
                  shape_of(c).c_str(), r.max_abs_err, r.max_rel_err, tol, r.pass ? "PASS" : "FAIL",
                  note.empty() ? "" : "  ", note.c_str());
      (r.pass ? passed : failed)++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    exit_code = failed ? 1 : 0;
  });
}

}  // namespace tilerope::cli
