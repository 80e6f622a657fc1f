#pragma once
#include <CLI/CLI.hpp>

namespace tilerope::cli {
/// `tilerope run NAME [--tile ..] [--ub ..] [--json]`, `tilerope run --list`: one reference
/// kernel through the tile layer on the article's smoke shape, against the golden.
void add_run_command(CLI::App& app, int& exit_code);
}  // namespace tilerope::cli
