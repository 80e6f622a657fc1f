#pragma once
#include <CLI/CLI.hpp>

namespace tilerope::cli {
/// `tilerope check [CASES.json ...]`: built-in and file cases through the golden, the
/// production kernels and the reference kernels, one row per case; exit 0 only if all pass.
void add_check_command(CLI::App& app, int& exit_code);
}  // namespace tilerope::cli
