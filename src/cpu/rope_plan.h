#pragma once
// The validated, resolved form of one rope_apply call, as the CPU kernels consume it.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tilerope/dtype.h"
#include "tilerope/freqs.h"
#include "tilerope/rope.h"
#include "tilerope/runtime.h"

namespace tilerope::detail {

// The first 64-byte boundary in `v` with at least n floats after it (`v` grown to hold them):
// scratch and fp32 weights start there, so that the kernels' vector loads and stores of them
// never split a cache line (a vector's own allocation is only 16-byte aligned; bench --only
// qk-norm-rope-bwd found its rows at 16, 32 and 48 bytes past a line).
inline float* line_aligned(std::vector<float>& v, std::size_t n) {
  constexpr std::size_t line = 64 / sizeof(float);
  if (v.size() < n + line) v.resize(n + line);
  const auto skip = (0 - reinterpret_cast<std::uintptr_t>(v.data())) % 64 / sizeof(float);
  return v.data() + skip;
}

// q or k: heads rows of head_dim elements per token, addressed as b * b_stride + s * s_stride
// + h * h_stride (elements).
struct head_block {
  const void* in = nullptr;
  void* out = nullptr;
  std::int64_t heads = 0;
  std::int64_t in_b = 0, in_s = 0, in_h = 0;
  std::int64_t out_b = 0, out_s = 0, out_h = 0;
  // QK RMSNorm: the weight as fp32 [head_dim]; backward: the forward's input x and the fp64
  // weight-gradient accumulator [chunks][head_dim]
  const float* weight = nullptr;
  const float* weight_a = nullptr;  // the weights of the first / second element of each pair
  const float* weight_b = nullptr;  // (forward input layout), r/2 each
  const void* x = nullptr;
  std::int64_t x_b = 0, x_s = 0, x_h = 0;
  double* weight_grad = nullptr;
  // backward: 1 / weight [head_dim] in fp64 where every weight is in [2^-32, 2^32] in magnitude
  // (the held rows fold the weights into the angles and divide dw by them), else null
  const double* inverse_weight = nullptr;
};

// How the two elements of each rotated pair sit in a row: (i, i + r/2) or (2i, 2i + 1).
enum class pairs : std::uint8_t { halves, adjacent };

// True on Intel CPUs, read once.
bool intel_cpu();
// Whether QK RMSNorm's 16-bit rows of 1, 2 or 4 vectors of pairs are held in registers with
// 32 vector registers, as f32 rows are (norm_rotate_block_held), instead of staged. On Intel
// (the default there) bf16 in place, one thread, took 0.195-0.208 ns per element in memory
// against 0.246-0.247 staged, and the same in cache (0.158-0.162 against 0.160-0.163); on Zen
// 4 held rows measured slower in cache (0.216 against 0.177). The kernel tests take both (set:
// 0 or 1; -1 restores the CPU's default).
bool norm_rows_held_16bit();
void set_norm_rows_held_16bit(int held);
// Whether QK RMSNorm's backward streams f16 dx without AVX-512 (with AVX-512 it always can). On
// Intel (the default there) with AVX2, one thread, 32 + 8 heads of 128, T = 8192, out of place,
// the output at nine offsets mod 4 KiB: 0.40-0.43 ns per element streamed against 0.51-0.55
// stored normally. On the AVX2 class (AMD EPYC) streamed f16 measured 2.5 to 3 times slower
// at some offsets of the output from the scratch rows, mod 4 KiB (docs/performance.md). The
// kernel tests take both (set: 0 or 1; -1 restores the CPU's default).
bool f16_norm_backward_streamed();
void set_f16_norm_backward_streamed(int streamed);

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

  // QK RMSNorm + RoPE (blocks[k].weight), forward or backward (blocks[k].x, weight_grad)
  bool qk_norm = false;
  float eps = 0;
  bool hf_rounding = false;

  // software prefetch: the lines this many bytes beyond each row read, in the same buffer
  std::int64_t prefetch_bytes = tilerope::prefetch_bytes();
  bool held_16bit_norm_rows = norm_rows_held_16bit();
  bool streams_f16_norm_backward = f16_norm_backward_streamed();

  std::int64_t tokens() const { return batch * seq; }
};

// Runs the plan on the CPU: threads take its token_blocks(plan) blocks of tokens in turn;
// small problems stay on this thread (one block), without software prefetch. Weight gradients
// (qk-norm backward) are summed into blocks[k].weight_grad, which must hold token_blocks(plan) *
// head_dim zeroed doubles, one chunk per block; run_rope_cpu adds the chunks into chunk 0 in block
// order. A problem that stays on this thread has its plan's prefetch_bytes set to 0.
void run_rope_cpu(rope_plan& plan);
std::int64_t token_blocks(const rope_plan& plan);
// True when the CPU has AVX512-BF16 (vcvtneps2bf16), read once.
bool native_bf16();

// Per-target entry points (rope_kernels.cc). `chunk` selects the weight-gradient row.
void rope_tokens(const rope_plan& plan, std::int64_t first, std::int64_t last, int chunk);
void convert_f32_to_16(dtype to, const float* in, std::uint16_t* out, std::int64_t n);
// fp32 -> bf16 as rows of bf16 halves store it where the target takes them a vector of bf16 at
// a time (two fp32 vectors narrowed together, one NaN test for both), else convert_f32_to_16.
void convert_f32_to_bf16_blocks(const float* in, std::uint16_t* out, std::int64_t n);
// fp32 -> bf16 as rows of adjacent pairs store it: even and odd values joined in u32 lanes.
void convert_f32_to_bf16_pairs(const float* in, std::uint16_t* out, std::int64_t n);
void convert_16_to_f32(dtype from, const std::uint16_t* in, float* out, std::int64_t n);

}  // namespace tilerope::detail
