#pragma once
#include <CLI/CLI.hpp>

namespace tilerope::cli {
/// `tilerope apply`: RoPE on .npy inputs, written to .npy outputs of the same dtype and shape.
/// Outputs are written only after the whole computation succeeded.
void add_apply_command(CLI::App& app);
}  // namespace tilerope::cli
