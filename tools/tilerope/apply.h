#pragma once
/// \file apply.h
/// `tilerope apply`: one RoPE variant (rope, vision, mrope, qk-norm-rope, interleave) on q (and
/// k) read from .npy files.

#include <CLI/CLI.hpp>

namespace tilerope::cli {

/// Registers the `apply` subcommand on `app`. Its callback checks that every flag given is one
/// the chosen --variant reads, reads the inputs, runs the variant (rope_apply,
/// qk_norm_rope_apply or qk_norm_rope_backward) out of place in memory, and only then writes
/// the outputs (q and k outputs of the inputs' dtype and shape; qk-norm-rope --backward also
/// the float32 [D] weight gradients), each whole or not at all. Every problem is a
/// tilerope::error.
void add_apply_command(CLI::App& app);

}  // namespace tilerope::cli
