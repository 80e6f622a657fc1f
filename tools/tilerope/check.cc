#include "check.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cases.h"
#include "ref_cases.h"
#include "tilerope/error.h"
#include "tilerope/runtime.h"

namespace tilerope::cli {

namespace {

struct row {
  std::string name, variant, dtype, shape, note;
  double max_abs = 0, max_rel = 0, atol = 0, rtol = 0;
  bool pass = false;
};

row run_one(const rope_case& c) {
  row r{c.name, variant_of(c), std::string(to_string(c.x_type)), shape_of(c), ""};
  try {
    const case_result res = run_case(c);
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
  row r{c.name, ref_variant_of(c), std::string(to_string(c.x_type)), "", ""};
  try {
    const ref_result res = run_ref_case(c);
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

std::vector<ref_case> builtin_ref_cases() {
  std::vector<ref_case> cases;
  auto add = [&](ref_case c) { cases.push_back(std::move(c)); };
  ref_case v;
  v.name = "ref-vision-smoke-31x16x128";
  v.kernel = ref_kernel::vision;
  v.x_type = dtype::f16;
  v.seq = 31, v.heads = 16, v.k_heads = 16;
  add(v);
  ref_case m;
  m.name = "ref-mrope-smoke-1x16x31x128";
  m.kernel = ref_kernel::mrope;
  m.x_type = dtype::f16;
  m.batch = 1, m.heads = 16, m.k_heads = 2, m.seq = 31;
  add(m);
  ref_case s;
  s.name = "ref-skeleton-4x16x64";
  s.kernel = ref_kernel::skeleton;
  s.batch = 4, s.seq = 16, s.head_dim = 64;
  add(s);
  ref_case q;
  q.name = "ref-qk-norm-rope-q-s7";
  q.kernel = ref_kernel::qk_norm_rope;
  q.x_type = dtype::bf16;
  q.seq = 7, q.heads = 16;
  q.atol = q.rtol = 1e-2;
  add(q);
  for (auto out :
       {reference::interleave_output::interleaved, reference::interleave_output::split_half}) {
    for (auto path :
         {reference::interleave_path::deinterleave, reference::interleave_path::gathermask}) {
      ref_case i;
      i.kernel = ref_kernel::interleave;
      i.x_type = dtype::bf16;
      i.batch = 1, i.heads = 4, i.seq = 37, i.head_dim = 64;
      i.output = out;
      i.path = path;
      i.name = ref_variant_of(i) + "-1x4x37x64";
      i.atol = 1e-4;
      i.rtol = 7.8125e-3;
      add(i);
    }
  }
  return cases;
}

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
      rope_cases = builtin_cases();
      ref_cases = builtin_ref_cases();
    }
    for (const auto& f : *files) {
      for (const auto& item : read_case_list(f)) {
        if (item.is_object() && item.contains("kernel")) {
          ref_cases.push_back(ref_case_from_json(item));
        } else {
          rope_cases.push_back(case_from_json(item));
        }
      }
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
