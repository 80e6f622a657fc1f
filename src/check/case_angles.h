#pragma once
// The positions and angles a rope_case passes to the kernel, and the cos and sin the golden
// rotates by for the same tokens (internal to run_case).

#include <random>
#include <vector>

#include "check/rope_case.h"
#include "golden/golden.h"
#include "tilerope/freqs.h"
#include "tilerope/rope.h"
#include "tilerope/tensor.h"

namespace tilerope::check {

// The kernel's positions and angles are views into the tensors held here.
struct case_angles {
  tensor ids;                    // per token: [T], [S] (shared by the batch) or [B, S]
  tensor axis_ids;               // MRoPE and vision: [A, T]
  vision_2d_frequencies vision;  // vision_2d: the kernel's frequencies and their axes
  rope_table table;
  tensor row_cos, row_sin;  // per-token rows: [T, w], [B, S, w], [S, w] or planes [A, T, w]
  rope_positions positions;
  rope_angles angles;
  // The golden's cos and sin, [B*S, rotary_dim]: one full row per token, its columns paired
  // as the output's are, and how the golden rotates a row by them.
  std::vector<double> golden_cos, golden_sin;
  golden::variant golden_variant = golden::variant::neox;
};

// Draws the positions (and random rows) with `rng`, after the case's x.
case_angles make_case_angles(const rope_case& c, std::mt19937_64& rng);

}  // namespace tilerope::check
