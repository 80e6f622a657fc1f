#pragma once
// Check cases of the production kernels: one rope_apply (or qk_norm_rope_apply, or its
// backward) configuration, its seeded inputs, and its comparison against the fp64 golden.
// `tilerope check` and the kernel tests run the same cases.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"

namespace tilerope::check {

enum class x_layout { thd, bshd, bhsd };
std::string_view to_string(x_layout l);
x_layout x_layout_from_string(std::string_view name);

struct rope_case {
  std::string name;
  rope_style style = rope_style::neox;
  dtype x_type = dtype::f32;
  x_layout layout = x_layout::thd;
  std::int64_t batch = 1;   // bshd / bhsd only
  std::int64_t tokens = 7;  // T for thd, S for bshd / bhsd
  std::int64_t q_heads = 4;
  std::int64_t k_heads = 2;  // 0: q only
  std::int64_t head_dim = 64;
  int rotary_dim = 0;   // 0: head_dim
  bool packed = false;  // q and k cut from one [.., Hq + 2 Hk, D] qkv buffer
  bool inplace = true;
  bool backward = false;
  std::string positions = "i64";  // i32 | i64 | offset
  bool shared_positions = false;  // bshd / bhsd: one [S] row for the whole batch
  std::int64_t offset = 0;        // first position, positions = "offset"
  std::int64_t max_pos = 4096;    // ids are drawn from [0, max_pos)
  std::string table = "f32";      // f32 | f16 | bf16 | none (computed from theta)
  angle_precision precision = angle_precision::accurate;
  double theta = 10000.0;
  std::uint64_t seed = 1;
  std::optional<double> atol, rtol;  // default: the golden's tolerance table
  // MRoPE: positions [3, T] (temporal, height, width), sections over the rotary_dim/2
  // frequencies (thd layout only)
  std::optional<std::array<int, 3>> mrope_section;
  mrope_layout mrope = mrope_layout::chunked;
  // Qwen2-VL vision: positions [2, T] (row, column), head_dim/4 frequencies per axis
  bool vision_2d = false;
  // where the rotated pairs are written (gptj + split_half: the NPU-compatible interleave)
  rope_output_layout output_layout = rope_output_layout::as_input;
  // angles as one row per token (rope_angles::from_token_rows) of this dtype instead of a
  // table: "" (no), "f32", "f16", "bf16"; full rows (rotary_dim wide) unless rows_half; with
  // mrope_section, planes [3, T, w]; random_rows fills them with uniform [-1, 1] values
  // instead of true angles (the formula is then checked with unrelated cos and sin columns)
  std::string rows;
  bool rows_half = false;
  bool random_rows = false;
  // Qwen3 QK RMSNorm before the rotation, weights [D] of the x dtype drawn around 1
  bool qk_norm = false;
  // every third weight 0 (the backward's held rows fold the weights into the angles only when
  // none is 0: this takes its other path)
  bool zero_weights = false;
  double eps = 1e-6;
  qk_norm_rounding norm_rounding = qk_norm_rounding::fp32_once;
};

struct case_result {
  double max_abs_err = 0, max_rel_err = 0;
  double atol = 0, rtol = 0;
  bool pass = false;
  std::string problem;  // why it failed, when not by tolerance alone
};

// "neox gptj" variant column, "f32", "q[7,4,64] k[7,2,64]" shape column.
std::string variant_of(const rope_case& c);
std::string shape_of(const rope_case& c);

// Builds the inputs, runs rope_apply and the golden, compares. Throws tilerope::error for
// an invalid case (e.g. a bad field), as rope_apply would.
case_result run_case(const rope_case& c);

}  // namespace tilerope::check
