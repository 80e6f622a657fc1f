#pragma once
/// \file freqs.h
/// `tilerope freqs`: the RoPE frequencies of a Hugging Face config.json (or of plain RoPE).

#include <CLI/CLI.hpp>

namespace tilerope::cli {

/// Registers `tilerope freqs --config config.json [--seq-len N] [--json]` and
/// `tilerope freqs --theta F --rotary-dim N [--json]`: prints rope_type, theta, head_dim,
/// rotary_dim, attention_scaling, the mrope fields and every inv_freq (%.17g). With --json one
/// object with the keys "rope_type", "theta", "head_dim", "rotary_dim", "attention_scaling",
/// "inv_freq", "mrope_section" (null when absent) and "mrope_interleaved". Every problem is a
/// tilerope::error.
void add_freqs_command(CLI::App& app);

}  // namespace tilerope::cli
