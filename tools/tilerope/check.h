#pragma once
#include <CLI/CLI.hpp>

namespace tilerope::cli {
/// `tilerope check [CASES.json ...]`: built-in and file cases through the golden and the
/// production kernels, one row per case; exit 0 only if all pass, 1 otherwise.
void add_check_command(CLI::App& app, int& exit_code);
}  // namespace tilerope::cli
