#pragma once
/// \file apply.h
/// `tilerope apply`: RoPE on q (and k) read from .npy files.

#include <CLI/CLI.hpp>

namespace tilerope::cli {

/// Registers the `apply` subcommand on `app`. Its callback reads the inputs, rotates them out
/// of place in memory with rope_apply, and only then writes the outputs (same dtype and shape
/// as the inputs), each whole or not at all. Every problem is a tilerope::error.
void add_apply_command(CLI::App& app);

}  // namespace tilerope::cli
