// The CPU backend: a validated plan made into a cpu_plan (the norm's weights in fp32 and pair
// order, the weight-gradient accumulators, this CPU's choices) and run by threads in blocks of
// tokens.

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "cpu/cpu_plan.h"
#include "tilerope/runtime.h"

namespace tilerope::detail {
namespace {

// Below this many elements of q and k a call runs on the calling thread: waking a team
// costs more than the work (a decode step is a few thousand elements).
constexpr std::int64_t min_parallel_elements = 1 << 18;

// A parallel call's tokens go in up to this many blocks per thread, taken by whichever thread
// is free: a thread the machine slows down then holds up the call by one block, not by its
// half (docs/performance.md, "Performance decisions").
constexpr std::int64_t blocks_per_thread = 16;

// Elements of q and k in one call.
std::int64_t elements_of(const rope_plan& plan) {
  std::int64_t heads = 0;
  for (int k = 0; k < plan.num_blocks; ++k) heads += plan.blocks[k].heads;
  return plan.tokens() * heads * plan.head_dim;
}

// What a cpu_plan points into, owned for the length of the call.
struct norm_storage {
  // per block (q, k): the norm weight [head_dim] in fp32, then its r/2 pairs' first and second
  // weights where they are not already its two halves (gptj); in `weights_here` (not cleared)
  // when they fit, as they do up to head_dim 256, else one allocation; both start a cache line
  float* weights(std::size_t n) {
    if (n <= std::size(weights_here)) return weights_here;
    return line_aligned(weights_heap, n);
  }
  alignas(64) float weights_here[1024];
  std::vector<float> weights_heap;
  std::vector<double> weight_grad[2];
  std::vector<double> inverse_weight[2];
};

// The norm's weights as the kernels read them, and for the backward its accumulators.
void prepare_norm(cpu_plan& p, norm_storage& st) {
  // the weights in pair order of the forward's input: (i, i + r/2), the weight's own halves,
  // or (2i, 2i + 1), taken apart
  const std::int64_t D = p.head_dim, half = p.rotary_dim / 2;
  const bool adjacent = p.style == rope_style::gptj;
  const std::int64_t per_block = D + (adjacent ? 2 * half : 0);
  float* const weights = st.weights(static_cast<std::size_t>(p.num_blocks * per_block));
  for (int k = 0; k < p.num_blocks; ++k) {
    float* w = weights + k * per_block;
    const tensor_view& given = p.weights[k];
    if (given.type == dtype::f32) {
      std::memcpy(w, given.data, static_cast<std::size_t>(D) * sizeof(float));
    } else {  // f16, bf16: the kernels' vector conversion (a decode call converts both weights)
      convert_16_to_f32(given.type, static_cast<const std::uint16_t*>(given.data), w, D);
    }
    cpu_block& b = p.blocks[k];
    b.weight = w;
    b.weight_a = w;
    b.weight_b = w + half;
    if (adjacent) {
      float* pairs = w + D;
      for (std::int64_t i = 0; i < half; ++i) {
        pairs[i] = w[2 * i];
        pairs[half + i] = w[2 * i + 1];
      }
      b.weight_a = pairs;
      b.weight_b = pairs + half;
    }
    if (!p.backward) continue;
    st.weight_grad[k].assign(static_cast<std::size_t>(token_blocks(p) * D), 0.0);
    b.weight_grad = st.weight_grad[k].data();
    // weights that fold into the angles (none 0, subnormal, huge, inf or NaN)
    if (std::all_of(w, w + D,
                    [](float v) { return std::fabs(v) >= 0x1p-32f && std::fabs(v) <= 0x1p32f; })) {
      st.inverse_weight[k].resize(static_cast<std::size_t>(D));
      for (std::int64_t j = 0; j < D; ++j) {
        st.inverse_weight[k][static_cast<std::size_t>(j)] = 1.0 / w[j];
      }
      b.inverse_weight = st.inverse_weight[k].data();
    }
  }
}

}  // namespace

namespace {
int threads_of(const rope_plan& plan) { return plan.threads > 0 ? plan.threads : num_threads(); }
}  // namespace

std::int64_t token_blocks(const rope_plan& plan) {
  const std::int64_t tokens = plan.tokens();
  const std::int64_t elements = elements_of(plan);
  const std::int64_t threads = std::min<std::int64_t>(threads_of(plan), tokens);
  if (threads <= 1 || elements < min_parallel_elements) return 1;
  return std::min<std::int64_t>(tokens, blocks_per_thread * threads);
}

void run_rope_cpu(cpu_plan& plan) {
  apply_env_target();
  const std::int64_t tokens = plan.tokens();
  if (tokens == 0) return;
  // a problem small enough for one thread is read from cache: prefetching would only cost
  if (elements_of(plan) < min_parallel_elements) plan.prefetch_bytes = 0;
  const std::int64_t blocks = token_blocks(plan);
  if (blocks == 1) {
    rope_tokens(plan, 0, tokens, 0);
    return;
  }
  // Block b holds tokens [T b / n, T (b + 1) / n) and sums its weight-gradient terms into
  // chunk b, so the sums do not depend on which thread took which block.
  const int threads = static_cast<int>(std::min<std::int64_t>(threads_of(plan), tokens));
  std::atomic<std::int64_t> next{0};
#pragma omp parallel num_threads(threads)
  for (std::int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1)) {
    rope_tokens(plan, tokens * b / blocks, tokens * (b + 1) / blocks, static_cast<int>(b));
  }
  // weight gradients: the chunks added in a fixed order into chunk 0
  for (int k = 0; k < plan.num_blocks; ++k) {
    double* g = plan.blocks[k].weight_grad;
    if (g == nullptr) continue;
    for (std::int64_t c = 1; c < blocks; ++c) {
      for (std::int64_t j = 0; j < plan.head_dim; ++j) g[j] += g[c * plan.head_dim + j];
    }
  }
}

void run_plan(const rope_plan& plan) {
  apply_env_target();
  cpu_plan p;
  static_cast<rope_plan&>(p) = plan;
  for (int k = 0; k < 2; ++k) static_cast<head_block&>(p.blocks[k]) = plan.blocks[k];
  p.prefetch_bytes = prefetch_bytes();
  p.held_16bit_norm_rows = norm_rows_held_16bit();
  p.streams_f16_norm_backward = f16_norm_backward_streamed();
  norm_storage st;
  if (p.qk_norm) prepare_norm(p, st);
  run_rope_cpu(p);
  if (!(p.qk_norm && p.backward)) return;
  for (int k = 0; k < p.num_blocks; ++k) {  // the fp64 sums, rounded once into dw
    auto* out = static_cast<float*>(p.weight_grads[k].data);
    const std::int64_t stride = p.weight_grads[k].strides[0];
    for (std::int64_t j = 0; j < p.head_dim; ++j) {
      out[j * stride] = static_cast<float>(st.weight_grad[k][static_cast<std::size_t>(j)]);
    }
  }
}

}  // namespace tilerope::detail
