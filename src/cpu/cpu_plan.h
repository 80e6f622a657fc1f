#pragma once
// The CPU backend's form of a plan: the plan (src/core/rope_plan.h), the per-block data the
// kernels read (fp32 weights in pair order, weight-gradient accumulators), and the CPU's own
// choices (prefetch distance, which 16-bit paths). run_plan.cc makes it; the kernels
// (rope_kernels.cc and its -inl.h files) run it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rope_plan.h"
#include "tilerope/dtype.h"

namespace tilerope::detail {

// The first 64-byte boundary in `v` with at least n floats after it (`v` grown to hold them):
// scratch and fp32 weights start there, so that vector loads and stores of them never split a
// cache line (a vector's own allocation is only 16-byte aligned).
inline float* line_aligned(std::vector<float>& v, std::size_t n) {
  constexpr std::size_t line = 64 / sizeof(float);
  if (v.size() < n + line) v.resize(n + line);
  const auto skip = (0 - reinterpret_cast<std::uintptr_t>(v.data())) % 64 / sizeof(float);
  return v.data() + skip;
}

// A block of heads with what the CPU kernels read for it.
struct cpu_block : head_block {
  // QK RMSNorm: the weight as fp32 [head_dim], and the weights of the first and second element
  // of each pair (forward input layout), r/2 each
  const float* weight = nullptr;
  const float* weight_a = nullptr;
  const float* weight_b = nullptr;
  // backward: the fp64 weight-gradient accumulators [chunks][head_dim], and 1 / weight [head_dim]
  // in fp64 where every weight is in [2^-32, 2^32] in magnitude (the held rows fold the weights
  // into the angles and divide dw by them), else null
  double* weight_grad = nullptr;
  const double* inverse_weight = nullptr;
};

struct cpu_plan : rope_plan {
  // the plan's blocks with their CPU data (in place of rope_plan::blocks, which it shadows)
  cpu_block blocks[2];
  // software prefetch: the lines this many bytes beyond each row read, in the same buffer
  std::int64_t prefetch_bytes = 0;
  bool held_16bit_norm_rows = false;
  bool streams_f16_norm_backward = false;
};

// The CPU's vendor string and family / model (with their extended fields), from cpuid.
struct cpu_identity {
  std::string vendor;
  int family = 0, model = 0;
};
cpu_identity this_cpu();
// The class of a CPU (docs/performance.md names the classes measured), its software prefetch
// distance and the kernel paths measured faster on it (norm_rows_held_16bit,
// f16_norm_backward_streamed).
struct cpu_class_info {
  const char* name;
  std::int64_t prefetch_bytes;
  bool hold_16bit_norm_rows;
  bool stream_f16_norm_backward;
};
cpu_class_info cpu_class_of(const cpu_identity& id);
// True when the CPU has AVX512-BF16 (vcvtneps2bf16), read once.
bool native_bf16();
// Whether QK RMSNorm's 16-bit rows of 1, 2 or 4 vectors of pairs are held in registers with
// 32 vector registers, as f32 rows are, instead of staged: on Intel and Zen 5 by default
// (docs/performance.md, "CPU classes"). The kernel tests take both (set: 0 or 1;
// -1 restores the CPU's default).
bool norm_rows_held_16bit();
void set_norm_rows_held_16bit(int held);
// Whether QK RMSNorm's backward streams f16 dx without AVX-512 (with AVX-512 it always can): on
// Intel by default (docs/performance.md). The kernel tests take both, as above.
bool f16_norm_backward_streamed();
void set_f16_norm_backward_streamed(int streamed);
// Applies TILEROPE_CPU_TARGET once, before the first kernel runs (runtime.cc).
void apply_env_target();

// Runs a CPU plan: threads take its token_blocks(plan) blocks of tokens in turn; small problems
// stay on this thread (one block), without software prefetch. Weight gradients (qk-norm
// backward) are summed into blocks[k].weight_grad, which must hold token_blocks(plan) *
// head_dim zeroed doubles, one chunk per block; run_rope_cpu adds the chunks into chunk 0 in
// block order.
void run_rope_cpu(cpu_plan& plan);
std::int64_t token_blocks(const rope_plan& plan);

// Per-target entry points (rope_kernels.cc). `chunk` selects the weight-gradient row.
void rope_tokens(const cpu_plan& plan, std::int64_t first, std::int64_t last, int chunk);
void convert_f32_to_16(dtype to, const float* in, std::uint16_t* out, std::int64_t n);
// fp32 -> bf16 as rows of bf16 halves store it where the target takes them a vector of bf16 at
// a time (two fp32 vectors narrowed together, one NaN test for both), else convert_f32_to_16.
void convert_f32_to_bf16_blocks(const float* in, std::uint16_t* out, std::int64_t n);
// fp32 -> bf16 as rows of adjacent pairs store it: even and odd values joined in u32 lanes.
void convert_f32_to_bf16_pairs(const float* in, std::uint16_t* out, std::int64_t n);
void convert_16_to_f32(dtype from, const std::uint16_t* in, float* out, std::int64_t n);

}  // namespace tilerope::detail
