// The CPU RoPE kernels: one source, compiled once per SIMD target by Highway's foreach_target,
// chosen at run time by HWY_DYNAMIC_DISPATCH (runtime.cc can force a target).
//
// Every variant is one rotation of pairs: (x_a, x_b) read as halves (i, i + r/2) or adjacent
// pairs (2i, 2i + 1), written back as halves or adjacent pairs (split-half output and its
// backward change the layout), with per-token cos/sin for each element of the pair:
//
//     y_a = x_a c_a - x_b s_a,     y_b = x_b c_b + x_a s_b       (c_b = c_a, s_b = s_a unless
//                                                               full-width rows say otherwise)
//
// Per token the angles are found once (straight from an fp32 table or row, else into fp32
// scratch, with the backward's transpose folded in) and reused across every head of q and of
// k. QK RMSNorm scales each row before it is rotated. Loads convert to fp32, stores round to
// nearest even once.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rope_kernels.cc"
#include "cpu/cpu_plan.h"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// the kernels, in the order they build on each other (each included once per target)
#include "cpu/angles-inl.h"
#include "cpu/prefetch-inl.h"
#include "cpu/qk_norm-inl.h"
#include "cpu/qk_norm_backward-inl.h"
#include "cpu/rope_tokens-inl.h"
#include "cpu/rotate-inl.h"
#include "cpu/rows-inl.h"
#include "cpu/rows_16bit-inl.h"
#include "cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Large out-of-place calls whose every output vector is aligned take streaming stores.
constexpr std::int64_t min_streaming_bytes = 8 << 20;  // well past the L2 caches

template <class IO>
bool can_stream(const cpu_plan& p) {
#if HWY_TARGET <= HWY_AVX2
  using T = typename IO::storage;
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t es = sizeof(T), half = p.rotary_dim / 2;
  const bool adjacent = p.out_pairs == pairs::adjacent;
  // halves stream vectors of `lanes` elements at i and half + i; pairs stream whole registers
  // (lanes u32 of two 16-bit elements, or two vectors of f32) at 2i; rows taken in output
  // order stream whole vectors of `lanes` elements, in either layout
  const bool output_order =
      output_order_vectors(p, lanes, true) != 0 || takes_adjacent_rows<IO>(p, lanes);
  const std::int64_t vector_bytes = adjacent && !output_order ? lanes * 4 : lanes * es;
  if (!output_order) {
    if (adjacent && !IO::pairs_encode && !f32_io::pairs_vectors) return false;
    if (half % lanes != 0) return false;
  }
  std::int64_t bytes = 0;
  for (int k = 0; k < p.num_blocks; ++k) {
    const cpu_block& b = p.blocks[k];
    if (b.in == b.out) return false;
    if (reinterpret_cast<std::uintptr_t>(b.out) % vector_bytes != 0) return false;
    for (std::int64_t stride : {b.out_b, b.out_s, b.out_h}) {
      if ((stride * es) % vector_bytes != 0) return false;
    }
    if ((half * es) % vector_bytes != 0 && !adjacent && !output_order) return false;
    bytes += p.tokens() * b.heads * p.head_dim * es;
  }
  return bytes >= min_streaming_bytes;
#else
  (void)p;
  return false;
#endif
}

template <class IO, pairs PIn, pairs POut>
void rope_tokens_layout(const cpu_plan& p, std::int64_t first, std::int64_t last, int chunk) {
  // QK RMSNorm streams when every dim rotates (pass dims are stored one element at a time)
  const bool norm_streams = p.qk_norm && p.rotary_dim == p.head_dim && can_stream<IO>(p);
  if (p.qk_norm && p.backward) {
    // f16 without AVX-512 streams where the plan says (cpu_plan::streams_f16_norm_backward: on
    // Intel) and stores normally elsewhere: on the AVX2 class (AMD EPYC), streamed, its backward
    // (norm_backward_run_ahead) was several times slower with the scratch rows at some offsets
    // (mod 4 KiB) from the output, and no faster at the others (docs/performance.md,
    // "Performance decisions"). With AVX-512 f16 always streams.
    const bool f16_streams = HWY_TARGET <= HWY_AVX3 || p.streams_f16_norm_backward;
    if (norm_streams && (f16_streams || !std::is_same_v<typename IO::plain, f16_io>)) {
      qk_norm_backward_tokens_loop<streaming_io<IO>, PIn, POut>(p, first, last, chunk);
      hwy::FlushStream();
    } else {
      qk_norm_backward_tokens_loop<IO, PIn, POut>(p, first, last, chunk);
    }
  } else if (p.qk_norm) {
    if (norm_streams) {
      if (p.hf_rounding) {
        qk_norm_tokens_loop<streaming_io<IO>, PIn, POut, true>(p, first, last);
      } else {
        qk_norm_tokens_loop<streaming_io<IO>, PIn, POut, false>(p, first, last);
      }
      hwy::FlushStream();
    } else if (p.hf_rounding) {
      qk_norm_tokens_loop<IO, PIn, POut, true>(p, first, last);
    } else {
      qk_norm_tokens_loop<IO, PIn, POut, false>(p, first, last);
    }
  } else if (can_stream<IO>(p)) {
    rope_tokens_loop<streaming_io<IO>, PIn, POut>(p, first, last);
    hwy::FlushStream();
  } else {
    rope_tokens_loop<IO, PIn, POut>(p, first, last);
  }
}

template <class IO>
void rope_tokens_typed(const cpu_plan& p, std::int64_t first, std::int64_t last, int chunk) {
  constexpr pairs H = pairs::halves, A = pairs::adjacent;
  if (p.in_pairs == H) {
    return p.out_pairs == H ? rope_tokens_layout<IO, H, H>(p, first, last, chunk)
                            : rope_tokens_layout<IO, H, A>(p, first, last, chunk);
  }
  return p.out_pairs == H ? rope_tokens_layout<IO, A, H>(p, first, last, chunk)
                          : rope_tokens_layout<IO, A, A>(p, first, last, chunk);
}

void rope_tokens_impl(const cpu_plan& p, std::int64_t first, std::int64_t last, int chunk) {
  switch (p.x_type) {
    case dtype::f16:
      return rope_tokens_typed<f16_io>(p, first, last, chunk);
    case dtype::bf16:
#ifdef TILEROPE_NATIVE_BF16
      if (native_bf16()) return rope_tokens_typed<bf16_native_io>(p, first, last, chunk);
#endif
      return rope_tokens_typed<bf16_io>(p, first, last, chunk);
    default:
      return rope_tokens_typed<f32_io>(p, first, last, chunk);
  }
}

void convert_f32_to_16_impl(dtype to, const float* in, std::uint16_t* out, std::int64_t n) {
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const vf32 v = hn::LoadU(d, in + i);
    if (to == dtype::f16) {
      f16_io::store(d, v, out + i);
#ifdef TILEROPE_NATIVE_BF16
    } else if (native_bf16()) {
      bf16_native_io::store(d, v, out + i);
#endif
    } else {
      bf16_io::store(d, v, out + i);
    }
  }
  for (; i < n; ++i) out[i] = to == dtype::f16 ? f32_to_f16_bits(in[i]) : f32_to_bf16_bits(in[i]);
}

// fp32 -> bf16 through narrow_bf16_blocks, 2n at a time, where the target has it (else as
// convert_f32_to_16): its rounding and NaN test, for the tests.
void convert_f32_to_bf16_blocks_impl(const float* in, std::uint16_t* out, std::int64_t n) {
  std::int64_t i = 0;
#ifdef TILEROPE_BF16_BLOCKS
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    vf32 first, second;
    to_block_order(d, hn::LoadU(d, in + i), hn::LoadU(d, in + i + lanes), first, second);
    const bool nan = may_hold_nan(d, hn::Add(first, second));
    hn::StoreU(narrow_bf16_blocks(d, first, second, nan), du16_t(), out + i);
  }
#endif
  convert_f32_to_16_impl(dtype::bf16, in + i, out + i, n - i);
}

// fp32 -> bf16 as rows of adjacent pairs store it: even and odd values joined in u32 lanes
// (encode_pairs), its rounding and NaN test, for the tests.
void convert_f32_to_bf16_pairs_impl(const float* in, std::uint16_t* out, std::int64_t n) {
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    vf32 even, odd;
    hn::LoadInterleaved2(d, in + i, even, odd);
#ifdef TILEROPE_NATIVE_BF16
    if (native_bf16()) {
      bf16_native_io::store_pairs(d, even, odd, out + i);
      continue;
    }
#endif
    bf16_io::store_pairs(d, even, odd, out + i);
  }
  convert_f32_to_16_impl(dtype::bf16, in + i, out + i, n - i);
}

void convert_16_to_f32_impl(dtype from, const std::uint16_t* in, float* out, std::int64_t n) {
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(from == dtype::f16 ? f16_io::load(d, in + i) : bf16_io::load(d, in + i), d, out + i);
  }
  for (; i < n; ++i) out[i] = from == dtype::f16 ? f16_bits_to_f32(in[i]) : bf16_bits_to_f32(in[i]);
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tilerope::detail {

HWY_EXPORT(rope_tokens_impl);
HWY_EXPORT(convert_f32_to_16_impl);
HWY_EXPORT(convert_f32_to_bf16_blocks_impl);
HWY_EXPORT(convert_f32_to_bf16_pairs_impl);
HWY_EXPORT(convert_16_to_f32_impl);

void rope_tokens(const cpu_plan& plan, std::int64_t first, std::int64_t last, int chunk) {
  HWY_DYNAMIC_DISPATCH(rope_tokens_impl)(plan, first, last, chunk);
}
void convert_f32_to_16(dtype to, const float* in, std::uint16_t* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(convert_f32_to_16_impl)(to, in, out, n);
}
void convert_f32_to_bf16_blocks(const float* in, std::uint16_t* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(convert_f32_to_bf16_blocks_impl)(in, out, n);
}
void convert_f32_to_bf16_pairs(const float* in, std::uint16_t* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(convert_f32_to_bf16_pairs_impl)(in, out, n);
}
void convert_16_to_f32(dtype from, const std::uint16_t* in, float* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(convert_16_to_f32_impl)(from, in, out, n);
}

}  // namespace tilerope::detail
#endif
