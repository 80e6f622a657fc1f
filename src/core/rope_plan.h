#pragma once
// The plan of one call: what validation decided, for a backend to run. src/core builds it
// (rope.cc: shapes, strides, pair layout, where the positions and angles come from, the blocks
// of heads, the norm's parameters) and a backend consumes it (run_plan); it holds no backend's
// choices.

#include <cstdint>

#include "tilerope/dtype.h"
#include "tilerope/freqs.h"
#include "tilerope/rope.h"
#include "tilerope/tensor.h"

namespace tilerope::detail {

// q or k: heads rows of head_dim elements per token, addressed as b * b_stride + s * s_stride
// + h * h_stride (elements).
struct head_block {
  const void* in = nullptr;
  void* out = nullptr;
  std::int64_t heads = 0;
  std::int64_t in_b = 0, in_s = 0, in_h = 0;
  std::int64_t out_b = 0, out_s = 0, out_h = 0;
  // QK RMSNorm backward: the forward's input x
  const void* x = nullptr;
  std::int64_t x_b = 0, x_s = 0, x_h = 0;
};

// How the two elements of each rotated pair sit in a row: (i, i + r/2) or (2i, 2i + 1).
enum class pairs : std::uint8_t { halves, adjacent };

struct rope_plan {
  rope_style style = rope_style::neox;
  bool backward = false;
  // the kernel reads pairs as `in_pairs` and writes them as `out_pairs` (backward of a
  // split-half output reads halves and writes adjacent pairs); full-width angle rows are split
  // by the forward's output layout, `table_pairs`
  pairs in_pairs = pairs::halves, out_pairs = pairs::halves, table_pairs = pairs::halves;
  dtype x_type = dtype::f32;
  std::int64_t batch = 0, seq = 0;  // tokens = batch * seq
  std::int64_t head_dim = 0, rotary_dim = 0;
  head_block blocks[2];
  int num_blocks = 0;
  int threads = 0;  // 0: the backend's default

  // positions: ids[b * ids_b + s * ids_s] (ids_b = 0 when shared by the batch), else start + s
  const void* ids = nullptr;
  dtype ids_type = dtype::i64;
  std::int64_t ids_b = 0, ids_s = 0;
  std::int64_t start = 0;
  // multi-axis positions: frequency i of token s reads ids[axis_of_frequency[i] * ids_axis + s]
  const int* axis_of_frequency = nullptr;
  std::int64_t ids_axis = 0, num_axes = 0;

  // angles: table rows cos[p * table_row], or computed from inv_freq
  const void* cos = nullptr;
  const void* sin = nullptr;
  dtype table_type = dtype::f32;
  std::int64_t table_row = 0;
  const double* inv_freq = nullptr;     // accurate
  const float* inv_freq_f32 = nullptr;  // hf_compat
  angle_precision precision = angle_precision::accurate;
  double attention_scaling = 1.0;  // computed angles
  // per-token rows: cos[plane * rows_plane + b * rows_b + s * rows_s + column], `rows_width`
  // columns (rotary_dim: full rows; rotary_dim / 2: one per frequency); the plane of
  // frequency i is axis_of_frequency[i] when that is set, else 0
  const void* rows_cos = nullptr;
  const void* rows_sin = nullptr;
  dtype rows_type = dtype::f32;
  std::int64_t rows_plane = 0, rows_b = 0, rows_s = 0, rows_width = 0;

  // QK RMSNorm + RoPE: the weight of each block ([head_dim], f32, f16 or bf16), forward or
  // backward; the backward writes dL/dweight into weight_grads ([head_dim] f32, any stride)
  bool qk_norm = false;
  float eps = 0;
  bool hf_rounding = false;
  tensor_view weights[2];
  tensor_view weight_grads[2];

  std::int64_t tokens() const { return batch * seq; }
};

// Runs a validated plan: its outputs overlap none of its inputs, except an output that is
// exactly its input (in place). The CPU backend defines it (src/cpu/run_plan.cc).
void run_plan(const rope_plan& plan);

}  // namespace tilerope::detail
