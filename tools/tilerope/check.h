#pragma once
#include <CLI/CLI.hpp>
#include <vector>

#include "ref_cases.h"

namespace tilerope::cli {
/// `tilerope check [CASES.json ...]`: built-in and file cases through the golden, the
/// production kernels and the reference kernels, one row per case; exit 0 only if all pass.
void add_check_command(CLI::App& app, int& exit_code);
/// The built-in reference-kernel cases (the article's smoke shapes and small ones).
std::vector<ref_case> builtin_ref_cases();
}  // namespace tilerope::cli
