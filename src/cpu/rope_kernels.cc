// The CPU RoPE kernels: one source, compiled once per SIMD target by Highway's foreach_target,
// chosen at run time by HWY_DYNAMIC_DISPATCH (runtime.cc can force a target).
//
// Per token the cos/sin row is read once into fp32 scratch (sign of sin folded in for
// backward) and reused across every head of q and of k. Loads convert to fp32, stores round
// to nearest even once.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rope_kernels.cc"
#include "cpu/rope_plan.h"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using df32 = hn::ScalableTag<float>;
using vf32 = hn::Vec<df32>;
constexpr std::size_t max_f32_lanes = HWY_MAX_BYTES / sizeof(float);

// ---- fp32 <-> 16-bit conversions, round to nearest even on every target --------------------

// f16 bits (in u32 lanes) -> fp32. Exact for normals, subnormals, +-0, +-Inf and NaN.
HWY_INLINE vf32 f16_to_f32(df32 d, hn::Vec<hn::RebindToUnsigned<df32>> h) {
  const hn::RebindToUnsigned<df32> du;
  const hn::RebindToSigned<df32> di;
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto mag = hn::And(h, hn::Set(du, 0x7fffu));
  // Normal: shift the exponent and mantissa into place and re-bias (15 -> 127);
  // Inf/NaN get a second re-bias so that their exponent becomes 255.
  auto bits = hn::Add(hn::ShiftLeft<13>(mag), hn::Set(du, 112u << 23));
  const auto is_special = hn::Gt(hn::BitCast(di, mag), hn::Set(di, 0x7bff));
  bits =
      hn::IfThenElse(hn::RebindMask(du, is_special), hn::Add(bits, hn::Set(du, 112u << 23)), bits);
  // Subnormal (and zero): mag * 2^-24, exact in fp32.
  const auto sub = hn::Mul(hn::ConvertTo(d, hn::BitCast(di, mag)), hn::Set(d, 0x1p-24f));
  const auto is_sub = hn::Lt(hn::BitCast(di, mag), hn::Set(di, 0x400));
  const auto magnitude = hn::IfThenElse(hn::RebindMask(d, is_sub), sub, hn::BitCast(d, bits));
  return hn::Or(magnitude, hn::BitCast(d, sign));
}

// fp32 -> f16 bits in u32 lanes, round to nearest even.
HWY_INLINE hn::Vec<hn::RebindToUnsigned<df32>> f32_to_f16(df32 d, vf32 v) {
  const hn::RebindToUnsigned<df32> du;
  const hn::RebindToSigned<df32> di;
  const auto u = hn::BitCast(du, v);
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const auto abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const auto abs_i = hn::BitCast(di, abs);
  // Normal range: re-bias 127 -> 15 and round away the 13 low mantissa bits, ties to even.
  const auto rebased = hn::Sub(abs, hn::Set(du, 112u << 23));
  const auto lsb = hn::And(hn::ShiftRight<13>(rebased), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<13>(hn::Add(rebased, hn::Add(hn::Set(du, 0xfffu), lsb)));
  // Subnormal range: adding 0.5 leaves the value rounded (by the FPU, to even) to a multiple
  // of 2^-24, the f16 subnormal step; the low bits of the sum are then the f16 mantissa.
  const auto sum = hn::Add(hn::BitCast(d, abs), hn::Set(d, 0.5f));
  const auto sub = hn::Sub(hn::BitCast(du, sum), hn::Set(du, 0x3f000000u));
  const auto nan =
      hn::Or(hn::Set(du, 0x7e00u), hn::And(hn::ShiftRight<13>(abs), hn::Set(du, 0x3ffu)));
  auto r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 0x38800000))), sub, normal);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x477fefff))),
                     hn::Set(du, 0x7c00u), r);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x7f800000))), nan, r);
  return hn::Or(r, sign);
}

// fp32 -> bf16 bits in u32 lanes, round to nearest even; NaN stays a quiet NaN.
HWY_INLINE hn::Vec<hn::RebindToUnsigned<df32>> f32_to_bf16(df32, vf32 v) {
  const hn::RebindToUnsigned<df32> du;
  const hn::RebindToSigned<df32> di;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  const auto is_nan =
      hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu))), hn::Set(di, 0x7f800000));
  return hn::IfThenElse(hn::RebindMask(du, is_nan), quiet, rounded);
}

// Element types as the kernels see them: load N values as fp32, store N fp32 rounded once.
struct f32_io {
  using storage = float;
  static vf32 load(df32 d, const float* p) { return hn::LoadU(d, p); }
  static void store(df32 d, vf32 v, float* p) { hn::StoreU(v, d, p); }
  // the stored vector, its descriptor and lane type (for streaming stores)
  using out_tag = df32;
  using out_lane = float;
  static constexpr bool pairs_encode = false;
  static vf32 encode(df32, vf32 v) { return v; }
  static void load_pairs(df32 d, const float* p, vf32& even, vf32& odd) {
    hn::LoadInterleaved2(d, p, even, odd);
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, float* p) {
    hn::StoreInterleaved2(even, odd, d, p);
  }
};

// A pair of 16-bit values read as one u32 lane: the even element in the low half (x86, Arm
// and every target Highway supports are little-endian).
using du32_t = hn::RebindToUnsigned<df32>;
HWY_INLINE hn::Vec<du32_t> load_u16_pairs(const std::uint16_t* p) {
  return hn::LoadU(du32_t(), reinterpret_cast<const std::uint32_t*>(p));
}

struct f16_io {
  using storage = std::uint16_t;
  static vf32 load(df32 d, const std::uint16_t* p) {
#if HWY_TARGET <= HWY_AVX2
    const hn::Rebind<hwy::float16_t, df32> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#else
    const hn::Rebind<std::uint16_t, df32> d16;
    return f16_to_f32(d, hn::PromoteTo(hn::RebindToUnsigned<df32>(), hn::LoadU(d16, p)));
#endif
  }
  using out_tag = hn::Rebind<std::uint16_t, df32>;
  using out_lane = std::uint16_t;
  static constexpr bool pairs_encode = true;
  static hn::Vec<out_tag> encode(df32 d, vf32 v) {
#if HWY_TARGET <= HWY_AVX2
    // F16C's vcvtps2ph with rounding immediate 0: round to nearest even.
    (void)d;
    return hn::BitCast(out_tag(), hn::DemoteTo(hn::Rebind<hwy::float16_t, df32>(), v));
#else
    return hn::DemoteTo(out_tag(), hn::BitCast(hn::RebindToSigned<df32>(), f32_to_f16(d, v)));
#endif
  }
  static void store(df32 d, vf32 v, std::uint16_t* p) { hn::StoreU(encode(d, v), out_tag(), p); }
  static hn::Vec<du32_t> encode_pairs(df32 d, vf32 even, vf32 odd) {
    return hn::Or(f32_to_f16(d, even), hn::ShiftLeft<16>(f32_to_f16(d, odd)));
  }
  static void load_pairs(df32 d, const std::uint16_t* p, vf32& even, vf32& odd) {
    const auto u = load_u16_pairs(p);
    even = f16_to_f32(d, hn::And(u, hn::Set(du32_t(), 0xffffu)));
    odd = f16_to_f32(d, hn::ShiftRight<16>(u));
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, std::uint16_t* p) {
    hn::StoreU(encode_pairs(d, even, odd), du32_t(), reinterpret_cast<std::uint32_t*>(p));
  }
};

struct bf16_io {
  using storage = std::uint16_t;
  static vf32 load(df32 d, const std::uint16_t* p) {
    const hn::Rebind<std::uint16_t, df32> d16;
    const auto wide = hn::PromoteTo(hn::RebindToUnsigned<df32>(), hn::LoadU(d16, p));
    return hn::BitCast(d, hn::ShiftLeft<16>(wide));
  }
  using out_tag = hn::Rebind<std::uint16_t, df32>;
  using out_lane = std::uint16_t;
  static constexpr bool pairs_encode = true;
  static hn::Vec<out_tag> encode(df32 d, vf32 v) {
    return hn::DemoteTo(out_tag(), hn::BitCast(hn::RebindToSigned<df32>(), f32_to_bf16(d, v)));
  }
  static void store(df32 d, vf32 v, std::uint16_t* p) { hn::StoreU(encode(d, v), out_tag(), p); }
  static hn::Vec<du32_t> encode_pairs(df32 d, vf32 even, vf32 odd) {
    return hn::Or(f32_to_bf16(d, even), hn::ShiftLeft<16>(f32_to_bf16(d, odd)));
  }
  static void load_pairs(df32 d, const std::uint16_t* p, vf32& even, vf32& odd) {
    const auto u = load_u16_pairs(p);
    even = hn::BitCast(d, hn::ShiftLeft<16>(u));
    odd = hn::BitCast(d, hn::And(u, hn::Set(du32_t(), 0xffff0000u)));
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, std::uint16_t* p) {
    hn::StoreU(encode_pairs(d, even, odd), du32_t(), reinterpret_cast<std::uint32_t*>(p));
  }
};

// The same element type with non-temporal (streaming) stores, for large out-of-place calls:
// the output lines are written whole, so they need not be read for ownership first. Needs
// vector-aligned stores (the caller checks). f32 pairs are stored interleaved by two stores
// of halves, which is not one aligned vector: they keep normal stores.
template <class IO>
struct streaming_io : IO {
  static void store(df32 d, vf32 v, typename IO::storage* p) {
    hn::Stream(IO::encode(d, v), typename IO::out_tag(),
               reinterpret_cast<typename IO::out_lane*>(p));
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, typename IO::storage* p) {
    if constexpr (IO::pairs_encode) {
      hn::Stream(IO::encode_pairs(d, even, odd), du32_t(), reinterpret_cast<std::uint32_t*>(p));
    } else {
      IO::store_pairs(d, even, odd, p);
    }
  }
};

// ---- the rotations ---------------------------------------------------------------------------

// One vector step of rotate-half: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
template <class IO>
HWY_INLINE void neox_step(df32 d, const typename IO::storage* x1p, const typename IO::storage* x2p,
                          typename IO::storage* y1p, typename IO::storage* y2p, const float* c,
                          const float* s) {
  const vf32 x1 = IO::load(d, x1p);
  const vf32 x2 = IO::load(d, x2p);
  const vf32 cv = hn::LoadU(d, c);
  const vf32 sv = hn::LoadU(d, s);
  IO::store(d, hn::MulSub(x1, cv, hn::Mul(x2, sv)), y1p);
  IO::store(d, hn::MulAdd(x2, cv, hn::Mul(x1, sv)), y2p);
}

// One vector step of adjacent pairs: (x[2i], x[2i+1]) -> (xe c - xo s, xo c + xe s).
template <class IO>
HWY_INLINE void gptj_step(df32 d, const typename IO::storage* xp, typename IO::storage* yp,
                          const float* c, const float* s) {
  vf32 xe, xo;
  IO::load_pairs(d, xp, xe, xo);
  const vf32 cv = hn::LoadU(d, c);
  const vf32 sv = hn::LoadU(d, s);
  IO::store_pairs(d, hn::MulSub(xe, cv, hn::Mul(xo, sv)), hn::MulAdd(xo, cv, hn::Mul(xe, sv)), yp);
}

// A partial vector goes through a zero-padded copy: no load or store past the row.
template <class IO>
void neox_row(df32 d, const typename IO::storage* x, typename IO::storage* y, const float* c,
              const float* s, std::int64_t half) {
  using T = typename IO::storage;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + n <= half; i += n)
    neox_step<IO>(d, x + i, x + half + i, y + i, y + half + i, c + i, s + i);
  if (i == half) return;
  const auto rest = static_cast<std::size_t>(half - i);
  T a[max_f32_lanes] = {}, b[max_f32_lanes] = {};
  float cc[max_f32_lanes] = {}, ss[max_f32_lanes] = {};
  std::memcpy(a, x + i, rest * sizeof(T));
  std::memcpy(b, x + half + i, rest * sizeof(T));
  std::memcpy(cc, c + i, rest * sizeof(float));
  std::memcpy(ss, s + i, rest * sizeof(float));
  neox_step<IO>(d, a, b, a, b, cc, ss);
  std::memcpy(y + i, a, rest * sizeof(T));
  std::memcpy(y + half + i, b, rest * sizeof(T));
}

template <class IO>
void gptj_row(df32 d, const typename IO::storage* x, typename IO::storage* y, const float* c,
              const float* s, std::int64_t half) {
  using T = typename IO::storage;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;  // pairs
  for (; i + n <= half; i += n) gptj_step<IO>(d, x + 2 * i, y + 2 * i, c + i, s + i);
  if (i == half) return;
  const auto rest = static_cast<std::size_t>(half - i);
  T a[2 * max_f32_lanes] = {};
  float cc[max_f32_lanes] = {}, ss[max_f32_lanes] = {};
  std::memcpy(a, x + 2 * i, 2 * rest * sizeof(T));
  std::memcpy(cc, c + i, rest * sizeof(float));
  std::memcpy(ss, s + i, rest * sizeof(float));
  gptj_step<IO>(d, a, a, cc, ss);
  std::memcpy(y + 2 * i, a, 2 * rest * sizeof(T));
}

// ---- per-token angles ------------------------------------------------------------------------

std::int64_t position_of(const rope_plan& p, std::int64_t b, std::int64_t s) {
  if (p.ids == nullptr) return p.start + s;
  const std::int64_t at = b * p.ids_b + s * p.ids_s;
  return p.ids_type == dtype::i32 ? static_cast<const std::int32_t*>(p.ids)[at]
                                  : static_cast<const std::int64_t*>(p.ids)[at];
}

// The x dtype's rounding of an fp32 value (hf_compat keeps its tables in the x dtype).
float round_to(dtype t, float v) {
  if (t == dtype::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  if (t == dtype::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  return v;
}

// A 16-bit table row widened to fp32, whole vectors first.
template <class IO>
void widen_row(df32 d, const std::uint16_t* from, float* to, std::int64_t n,
               float (*scalar)(std::uint16_t)) {
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(IO::load(d, from + i), d, to + i);
  for (; i < n; ++i) to[i] = scalar(from[i]);
}

// Points c and s at cos_i and sin_i of position pos (i < half), with the sign of sin folded in
// for backward: straight into an fp32 table when it can, else through `scratch` (2 * half).
void angles_at(const rope_plan& p, std::int64_t pos, float* scratch, const float*& c,
               const float*& s) {
  const df32 d;
  const std::int64_t half = p.rotary_dim / 2;
  float* cc = scratch;
  float* ss = scratch + half;
  if (p.cos != nullptr) {
    const std::int64_t row = pos * p.table_row;
    if (p.table_type == dtype::f32) {
      c = static_cast<const float*>(p.cos) + row;
      s = static_cast<const float*>(p.sin) + row;
      if (!p.backward) return;
      std::memcpy(ss, s, static_cast<std::size_t>(half) * sizeof(float));
    } else {
      const auto* c16 = static_cast<const std::uint16_t*>(p.cos) + row;
      const auto* s16 = static_cast<const std::uint16_t*>(p.sin) + row;
      if (p.table_type == dtype::f16) {
        widen_row<f16_io>(d, c16, cc, half, f16_bits_to_f32);
        widen_row<f16_io>(d, s16, ss, half, f16_bits_to_f32);
      } else {
        widen_row<bf16_io>(d, c16, cc, half, bf16_bits_to_f32);
        widen_row<bf16_io>(d, s16, ss, half, bf16_bits_to_f32);
      }
      c = cc;
    }
  } else if (p.precision == angle_precision::accurate) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos) * p.inv_freq[i];
      cc[i] = static_cast<float>(std::cos(a));
      ss[i] = static_cast<float>(std::sin(a));
    }
    c = cc;
  } else {
    for (std::int64_t i = 0; i < half; ++i) {
      const double a = static_cast<float>(pos) * p.inv_freq_f32[i];
      cc[i] = round_to(p.x_type, static_cast<float>(std::cos(a)));
      ss[i] = round_to(p.x_type, static_cast<float>(std::sin(a)));
    }
    c = cc;
  }
  if (p.backward) {
    for (std::int64_t i = 0; i < half; ++i) ss[i] = -ss[i];
  }
  s = ss;
}

constexpr std::int64_t prefetch_tokens = 2;

// Multi-axis positions (MRoPE): each frequency reads the position of its own axis, so the
// row is gathered entry by entry into `scratch`.
void axis_angles_at(const rope_plan& p, std::int64_t token, float* scratch, const float*& c,
                    const float*& s) {
  const std::int64_t half = p.rotary_dim / 2;
  float* cc = scratch;
  float* ss = scratch + half;
  for (std::int64_t i = 0; i < half; ++i) {
    const std::int64_t at = p.axis_of_frequency[i] * p.ids_axis + token;
    const std::int64_t pos = p.ids_type == dtype::i32 ? static_cast<const std::int32_t*>(p.ids)[at]
                                                      : static_cast<const std::int64_t*>(p.ids)[at];
    if (p.cos != nullptr) {
      const std::int64_t e = pos * p.table_row + i;
      switch (p.table_type) {
        case dtype::f16:
          cc[i] = f16_bits_to_f32(static_cast<const std::uint16_t*>(p.cos)[e]);
          ss[i] = f16_bits_to_f32(static_cast<const std::uint16_t*>(p.sin)[e]);
          break;
        case dtype::bf16:
          cc[i] = bf16_bits_to_f32(static_cast<const std::uint16_t*>(p.cos)[e]);
          ss[i] = bf16_bits_to_f32(static_cast<const std::uint16_t*>(p.sin)[e]);
          break;
        default:
          cc[i] = static_cast<const float*>(p.cos)[e];
          ss[i] = static_cast<const float*>(p.sin)[e];
      }
    } else if (p.precision == angle_precision::accurate) {
      const double a = static_cast<double>(pos) * p.inv_freq[i];
      cc[i] = static_cast<float>(std::cos(a));
      ss[i] = static_cast<float>(std::sin(a));
    } else {
      const double a = static_cast<float>(pos) * p.inv_freq_f32[i];
      cc[i] = round_to(p.x_type, static_cast<float>(std::cos(a)));
      ss[i] = round_to(p.x_type, static_cast<float>(std::sin(a)));
    }
    if (p.backward) ss[i] = -ss[i];
  }
  c = cc;
  s = ss;
}

template <class IO>
void rope_tokens_loop(const rope_plan& p, std::int64_t first, std::int64_t last) {
  using T = typename IO::storage;
  const df32 d;
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim;
  const std::int64_t pass = p.head_dim - rotary;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<std::size_t>(2 * half));
  const float* c = nullptr;
  const float* s = nullptr;
  for (std::int64_t t = first; t < last; ++t) {
    const std::int64_t b = t / p.seq, q = t % p.seq;
    if (p.axis_of_frequency != nullptr) {
      axis_angles_at(p, q, scratch.data(), c, s);
    } else {
      angles_at(p, position_of(p, b, q), scratch.data(), c, s);
    }
    for (int k = 0; k < p.num_blocks; ++k) {
      const head_block& blk = p.blocks[k];
      const T* in = static_cast<const T*>(blk.in) + b * blk.in_b + q * blk.in_s;
      T* out = static_cast<T*>(blk.out) + b * blk.out_b + q * blk.out_s;
      // Each head row is touched once: ask for the same row `ahead` tokens on while this one
      // computes, so that loads stay in flight across the per-token work.
      const bool prefetch = t + prefetch_tokens < last && (t + prefetch_tokens) / p.seq == b;
      const T* next = in + prefetch_tokens * blk.in_s;
      const std::int64_t row_bytes = p.head_dim * static_cast<std::int64_t>(sizeof(T));
      for (std::int64_t h = 0; h < blk.heads; ++h) {
        const T* x = in + h * blk.in_h;
        T* y = out + h * blk.out_h;
        if (prefetch) {
          const auto* line = reinterpret_cast<const char*>(next + h * blk.in_h);
          for (std::int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(line + o);
        }
        if (p.style == rope_style::neox) {
          neox_row<IO>(d, x, y, c, s, half);
        } else {
          gptj_row<IO>(d, x, y, c, s, half);
        }
        if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
      }
    }
  }
}

// Large out-of-place calls whose every output vector is aligned take streaming stores.
constexpr std::int64_t min_streaming_bytes = 8 << 20;  // well past the L2 caches

template <class IO>
bool can_stream(const rope_plan& p) {
#if HWY_TARGET <= HWY_AVX2
  using T = typename IO::storage;
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t es = sizeof(T), half = p.rotary_dim / 2;
  // neox stores vectors of `lanes` elements at i and half + i; gptj vectors of 2 * lanes
  const std::int64_t vector_bytes = lanes * es * (p.style == rope_style::gptj ? 2 : 1);
  if (p.style == rope_style::gptj && !IO::pairs_encode) return false;
  if (half % lanes != 0) return false;
  std::int64_t bytes = 0;
  for (int k = 0; k < p.num_blocks; ++k) {
    const head_block& b = p.blocks[k];
    if (b.in == b.out) return false;
    if (reinterpret_cast<std::uintptr_t>(b.out) % vector_bytes != 0) return false;
    for (std::int64_t stride : {b.out_b, b.out_s, b.out_h}) {
      if ((stride * es) % vector_bytes != 0) return false;
    }
    if ((half * es) % vector_bytes != 0 && p.style == rope_style::neox) return false;
    bytes += p.tokens() * b.heads * p.head_dim * es;
  }
  return bytes >= min_streaming_bytes;
#else
  (void)p;
  return false;
#endif
}

template <class IO>
void rope_tokens_typed(const rope_plan& p, std::int64_t first, std::int64_t last) {
  if (can_stream<IO>(p)) {
    rope_tokens_loop<streaming_io<IO>>(p, first, last);
    hwy::FlushStream();
  } else {
    rope_tokens_loop<IO>(p, first, last);
  }
}

void rope_tokens_impl(const rope_plan& p, std::int64_t first, std::int64_t last) {
  switch (p.x_type) {
    case dtype::f16:
      return rope_tokens_typed<f16_io>(p, first, last);
    case dtype::bf16:
      return rope_tokens_typed<bf16_io>(p, first, last);
    default:
      return rope_tokens_typed<f32_io>(p, first, last);
  }
}

void convert_f32_to_16_impl(dtype to, const float* in, std::uint16_t* out, std::int64_t n) {
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const vf32 v = hn::LoadU(d, in + i);
    to == dtype::f16 ? f16_io::store(d, v, out + i) : bf16_io::store(d, v, out + i);
  }
  for (; i < n; ++i) out[i] = to == dtype::f16 ? f32_to_f16_bits(in[i]) : f32_to_bf16_bits(in[i]);
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
HWY_EXPORT(convert_16_to_f32_impl);

void rope_tokens(const rope_plan& plan, std::int64_t first, std::int64_t last) {
  HWY_DYNAMIC_DISPATCH(rope_tokens_impl)(plan, first, last);
}
void convert_f32_to_16(dtype to, const float* in, std::uint16_t* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(convert_f32_to_16_impl)(to, in, out, n);
}
void convert_16_to_f32(dtype from, const std::uint16_t* in, float* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(convert_16_to_f32_impl)(from, in, out, n);
}

}  // namespace tilerope::detail
#endif
