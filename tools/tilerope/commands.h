#pragma once
/// \file commands.h
/// The subcommands of `tilerope`, one file each; main.cc registers them and reports errors.
/// Every problem is thrown as a tilerope::error, which main prints and exits 2 on.

#include <CLI/CLI.hpp>

namespace tilerope::cli {

/// `tilerope check [CASES.json ...] [--no-builtin]`: built-in and file cases through the
/// golden, the production kernels and the reference kernels, one row per case; sets
/// `exit_code` to 0 only if all pass.
void add_check_command(CLI::App& app, int& exit_code);

/// `tilerope run NAME [--tile ..] [--ub ..] [--dtype ..] [--json]`, `tilerope run --list`: one
/// reference kernel through the tile layer on the article's smoke shape, against the golden;
/// sets `exit_code` to 0 only if it passes.
void add_run_command(CLI::App& app, int& exit_code);

/// `tilerope apply`: one RoPE variant (rope, vision, mrope, qk-norm-rope, interleave) on q (and
/// k) read from .npy files. Its callback checks that every flag given is one the chosen
/// --variant reads, reads the inputs, runs the variant (rope_apply, qk_norm_rope_apply or
/// qk_norm_rope_backward) out of place in memory, and only then writes the outputs (q and k
/// outputs of the inputs' dtype and shape; qk-norm-rope --backward also the float32 [D] weight
/// gradients), each whole or not at all.
void add_apply_command(CLI::App& app);

/// `tilerope freqs --config config.json [--seq-len N] [--json]` and
/// `tilerope freqs --theta F --rotary-dim N [--json]`: prints rope_type, theta, head_dim,
/// rotary_dim, attention_scaling, the mrope fields and every inv_freq (%.17g). With --json one
/// object with the keys "rope_type", "theta", "head_dim", "rotary_dim", "attention_scaling",
/// "inv_freq", "mrope_section" (null when absent) and "mrope_interleaved".
void add_freqs_command(CLI::App& app);

/// `tilerope bench [--quick] [--json FILE] [--repeats N] [--only NAME]`: the kernels against
/// the memory-bandwidth ceiling and an unfused baseline, measured in the same run.
void add_bench_command(CLI::App& app);

/// `tilerope info`: version, SIMD targets compiled, supported and chosen, threads, prefetch.
void add_info_command(CLI::App& app);

}  // namespace tilerope::cli
