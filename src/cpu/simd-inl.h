// SIMD types, fp32 <-> 16-bit conversions (round to nearest even on every target) and
// the load/store policies of each element type (f32, f16, bf16, native bf16, streaming).
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_SIMD_INL_H_
#undef TILEROPE_CPU_SIMD_INL_H_
#else
#define TILEROPE_CPU_SIMD_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/cpu_plan.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#undef TILEROPE_NATIVE_BF16  // each target's pass decides anew
#undef TILEROPE_BF16_BLOCKS
#undef TILEROPE_LANE_PAIRS
#undef TILEROPE_NORM_SUMS_AHEAD
// A lambda a kernel's loop calls, inlined into it: GCC calls the larger ones out of line,
// through their closures.
#ifndef TILEROPE_INLINE_LAMBDA
#if defined(__GNUC__)
#define TILEROPE_INLINE_LAMBDA __attribute__((always_inline))
#else
#define TILEROPE_INLINE_LAMBDA
#endif
#endif

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

// The bf16 bits of v in the upper half of each u32 lane (the lower half is left over). Where
// no lane is NaN (`nan` false), the rounding alone: five integer operations where f32_to_bf16
// takes ten. Callers test their vectors for NaN once (may_hold_nan).
HWY_INLINE hn::Vec<hn::RebindToUnsigned<df32>> bf16_high(df32 d, vf32 v, bool nan) {
  const hn::RebindToUnsigned<df32> du;
  if (HWY_UNLIKELY(nan)) return hn::ShiftLeft<16>(f32_to_bf16(d, v));
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  return hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb));
}

#if HWY_TARGET != HWY_SCALAR
// bf16 rounding in u16 lanes, for 2n values at once: `high` the fp32's upper halves (the
// truncated bf16), `low` its lower halves (the bits rounded away). Round to nearest even adds
// one where low + (high & 1) > 0x8000, i.e. where the 17-bit sum low + (high & 1) + 0x7fff
// reaches 0x10000: its halving rounded up (pavgw, which keeps the 17th bit) then has bit 15
// set. Five operations for 2n values, where bf16_high takes four for n. Not for NaN lanes.
HWY_INLINE hn::Vec<hn::Repartition<std::uint16_t, df32>> round_bf16_halves(
    hn::Vec<hn::Repartition<std::uint16_t, df32>> low,
    hn::Vec<hn::Repartition<std::uint16_t, df32>> high) {
  const hn::Repartition<std::uint16_t, df32> d16;
  const auto bias = hn::Or(hn::And(high, hn::Set(d16, 1)), hn::Set(d16, 0x7ffe));
  return hn::Add(high, hn::ShiftRight<15>(hn::AverageRound(low, bias)));
}
#endif

// Whether some lane of v may be NaN. Callers pass sums of the vectors they store: a NaN makes
// the sum NaN (so does Inf - Inf, which then only takes the long way to the same bits).
HWY_INLINE bool may_hold_nan(df32 d, vf32 v) { return !hn::AllFalse(d, hn::IsNaN(v)); }

// Element types as the kernels see them: load N values as fp32, store N fp32 rounded once.
struct f32_io {
  using storage = float;
  using plain = f32_io;
  static constexpr bool cheap_pairs = false;
  static constexpr bool dot_pairs = false;  // no add_squares (bf16_native_io has one)
  static vf32 load(df32 d, const float* p) { return hn::LoadU(d, p); }
  static float load1(const float* p) { return *p; }
  static void store1(float v, float* p) { *p = v; }
  static vf32 round(df32, vf32 v) { return v; }
  static void store(df32 d, vf32 v, float* p) { hn::StoreU(v, d, p); }
  // the stored vector, its descriptor and lane type (for streaming stores)
  using out_tag = df32;
  using out_lane = float;
  static constexpr bool pairs_encode = false;
  static vf32 encode(df32, vf32 v) { return v; }
  static void encode_halves(df32, vf32 a, vf32 b, vf32& ea, vf32& eb) {
    ea = a;
    eb = b;
  }
  static void load_pairs(df32 d, const float* p, vf32& even, vf32& odd) {
    hn::LoadInterleaved2(d, p, even, odd);
  }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // (even, odd) -> the 2N floats e0 o0 e1 o1 ..., as two whole vectors: one vpermt2ps each
  // (Highway's StoreInterleaved2 takes six shuffles), so that they can also be streamed.
  static constexpr bool pairs_vectors = true;
  static void interleave_pairs(vf32 even, vf32 odd, vf32& lo, vf32& hi) {
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    lo.raw = _mm512_permutex2var_ps(even.raw, first, odd.raw);
    hi.raw = _mm512_permutex2var_ps(even.raw, second, odd.raw);
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, float* p) {
    vf32 lo, hi;
    interleave_pairs(even, odd, lo, hi);
    hn::StoreU(lo, d, p);
    hn::StoreU(hi, d, p + hn::Lanes(d));
  }
#elif HWY_TARGET == HWY_AVX2
  // (even, odd) -> e0 o0 e1 o1 ... as two whole vectors: the pairs of each 128-bit block
  // interleaved (vunpcklps, vunpckhps), then the blocks put in order (two vperm2f128), the
  // shuffles StoreInterleaved2 takes, ending in whole vectors that can also be streamed.
  static constexpr bool pairs_vectors = true;
  static void interleave_pairs(vf32 even, vf32 odd, vf32& lo, vf32& hi) {
    const df32 d;
    const vf32 first = hn::InterleaveLower(d, even, odd);   // e0 o0 e1 o1 | e4 o4 e5 o5
    const vf32 second = hn::InterleaveUpper(d, even, odd);  // e2 o2 e3 o3 | e6 o6 e7 o7
    lo = hn::ConcatLowerLower(d, second, first);
    hi = hn::ConcatUpperUpper(d, second, first);
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, float* p) {
    vf32 lo, hi;
    interleave_pairs(even, odd, lo, hi);
    hn::StoreU(lo, d, p);
    hn::StoreU(hi, d, p + hn::Lanes(d));
  }
#else
  static constexpr bool pairs_vectors = false;
  static void store_pairs(df32 d, vf32 even, vf32 odd, float* p) {
    hn::StoreInterleaved2(even, odd, d, p);
  }
#endif
};

// The vector held in a register from here on: without it the compiler folds each use of a
// loaded value into its own memory operand, so a value used twice is loaded twice and the load
// ports, not memory, bound rows already in cache (docs/performance.md, "Performance decisions").
template <class V>
HWY_INLINE V in_register(V v) {
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// A pair of 16-bit values read as one u32 lane: the even element in the low half (x86, Arm
// and every target Highway supports are little-endian). Held in a register: its users take the
// vector twice (a shift and a mask, or two lane permutes).
using du32_t = hn::RebindToUnsigned<df32>;
HWY_INLINE hn::Vec<du32_t> load_u16_pairs(const std::uint16_t* p) {
  return in_register(hn::LoadU(du32_t(), reinterpret_cast<const std::uint32_t*>(p)));
}

struct f16_io {
  using storage = std::uint16_t;
  using plain = f16_io;
  static constexpr bool cheap_pairs = false;
  static constexpr bool dot_pairs = false;
  static float load1(const std::uint16_t* p) { return f16_bits_to_f32(*p); }
  static void store1(float v, std::uint16_t* p) { *p = f32_to_f16_bits(v); }
  // v rounded to f16 and widened back
  static vf32 round(df32 d, vf32 v) { return f16_to_f32(d, f32_to_f16(d, v)); }
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
  static void encode_halves(df32 d, vf32 a, vf32 b, hn::Vec<out_tag>& ea, hn::Vec<out_tag>& eb) {
    ea = encode(d, a);
    eb = encode(d, b);
  }
  static hn::Vec<du32_t> encode_pairs(df32 d, vf32 even, vf32 odd) {
#if HWY_TARGET <= HWY_AVX2
    // F16C for each half, then the two zero-extended into one u32 lane
    return hn::Or(hn::PromoteTo(du32_t(), encode(d, even)),
                  hn::ShiftLeft<16>(hn::PromoteTo(du32_t(), encode(d, odd))));
#else
    return hn::Or(f32_to_f16(d, even), hn::ShiftLeft<16>(f32_to_f16(d, odd)));
#endif
  }
  static void load_pairs(df32 d, const std::uint16_t* p, vf32& even, vf32& odd) {
#if HWY_TARGET <= HWY_AVX2
    // both halves widened by F16C in memory order, then split into even and odd lanes (two
    // permutes); narrowing each half to u16 lanes first measured slower in cache
    // (docs/performance.md, "Performance decisions")
    const vf32 lo = load(d, p), hi = load(d, p + hn::Lanes(d));
    even = hn::ConcatEven(d, hi, lo);
    odd = hn::ConcatOdd(d, hi, lo);
#else
    const auto u = load_u16_pairs(p);
    even = f16_to_f32(d, hn::And(u, hn::Set(du32_t(), 0xffffu)));
    odd = f16_to_f32(d, hn::ShiftRight<16>(u));
#endif
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, std::uint16_t* p) {
    hn::StoreU(encode_pairs(d, even, odd), du32_t(), reinterpret_cast<std::uint32_t*>(p));
  }
};

struct bf16_io {
  using storage = std::uint16_t;
  using plain = bf16_io;
  static float load1(const std::uint16_t* p) { return bf16_bits_to_f32(*p); }
  static void store1(float v, std::uint16_t* p) { *p = f32_to_bf16_bits(v); }
  static vf32 round(df32 d, vf32 v) { return hn::BitCast(d, hn::ShiftLeft<16>(f32_to_bf16(d, v))); }
  static vf32 load(df32 d, const std::uint16_t* p) {
    const hn::Rebind<std::uint16_t, df32> d16;
    const auto wide = hn::PromoteTo(hn::RebindToUnsigned<df32>(), hn::LoadU(d16, p));
    return hn::BitCast(d, hn::ShiftLeft<16>(wide));
  }
  using out_tag = hn::Rebind<std::uint16_t, df32>;
  using out_lane = std::uint16_t;
  static constexpr bool pairs_encode = true;
  // Without a native conversion the rounding is about a third of a bf16 row's work in cache:
  // vectors are tested for NaN once (two at a time where they come in pairs) and take the
  // rounding alone when none is; two vectors of pairs round together in u16 lanes
  // (round_bf16_halves).
  static hn::Vec<out_tag> narrow(hn::Vec<du32_t> bits) {
    return hn::DemoteTo(out_tag(), hn::BitCast(hn::RebindToSigned<df32>(), bits));
  }
  static hn::Vec<out_tag> encode(df32 d, vf32 v) {
    return narrow(hn::ShiftRight<16>(bf16_high(d, v, may_hold_nan(d, v))));
  }
  static void store(df32 d, vf32 v, std::uint16_t* p) { hn::StoreU(encode(d, v), out_tag(), p); }
  static void encode_halves(df32 d, vf32 a, vf32 b, hn::Vec<out_tag>& ea, hn::Vec<out_tag>& eb) {
    const bool nan = may_hold_nan(d, hn::Add(a, b));
    ea = narrow(hn::ShiftRight<16>(bf16_high(d, a, nan)));
    eb = narrow(hn::ShiftRight<16>(bf16_high(d, b, nan)));
  }
  static hn::Vec<du32_t> encode_pairs(df32 d, vf32 even, vf32 odd) {
    const bool nan = may_hold_nan(d, hn::Add(even, odd));
#if HWY_TARGET != HWY_SCALAR
    if (HWY_LIKELY(!nan)) {  // u16 lanes in output order: each pair's even value, then its odd
      const hn::Repartition<std::uint16_t, df32> d16;
      const auto e = hn::BitCast(du32_t(), even);
      const auto o = hn::BitCast(du32_t(), odd);
      const auto high = hn::OddEven(hn::BitCast(d16, o), hn::BitCast(d16, hn::ShiftRight<16>(e)));
      const auto low = hn::OddEven(hn::BitCast(d16, hn::ShiftLeft<16>(o)), hn::BitCast(d16, e));
      return hn::BitCast(du32_t(), round_bf16_halves(low, high));
    }
#endif
    return hn::Or(hn::ShiftRight<16>(bf16_high(d, even, nan)),
                  hn::And(bf16_high(d, odd, nan), hn::Set(du32_t(), 0xffff0000u)));
  }
  // a vector of pairs widens with one instruction per vector (a shift or a mask) from one
  // load, where load() takes a widening load and a shift per vector: sums whose order does
  // not matter take it (QK RMSNorm's sums of squares)
  static constexpr bool cheap_pairs = true;
  static constexpr bool dot_pairs = false;
  static void load_pairs(df32 d, const std::uint16_t* p, vf32& even, vf32& odd) {
    const auto u = load_u16_pairs(p);
    even = hn::BitCast(d, hn::ShiftLeft<16>(u));
    odd = hn::BitCast(d, hn::And(u, hn::Set(du32_t(), 0xffff0000u)));
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, std::uint16_t* p) {
    hn::StoreU(encode_pairs(d, even, odd), du32_t(), reinterpret_cast<std::uint32_t*>(p));
  }
};

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define TILEROPE_NATIVE_BF16 1
// bf16 on CPUs with AVX512-BF16 (Zen 4, Sapphire Rapids): vcvtneps2bf16 rounds to nearest
// even and quiets NaN as the integer path does, in one instruction instead of about ten, but
// it flushes subnormal inputs to zero: a vector holding one takes the integer path. Chosen at
// run time (native_bf16()); every fp32 bit pattern is checked through it by the kernel tests.
struct bf16_native_io : bf16_io {
  using plain = bf16_native_io;
  // acc + even^2 + odd^2 for the two bf16 of each u32 lane, 32 elements in one vdpbf16ps
  // (the products are exact, each sum rounded once, as with MulAdd). It flushes subnormal
  // inputs and results to zero: squares under 2^-126, which the caller lets it drop only
  // where eps makes them invisible.
  static constexpr bool dot_pairs = true;
  static vf32 add_squares(vf32 acc, hn::Vec<du32_t> u) {
    asm("vdpbf16ps %1, %1, %0" : "+v"(acc.raw) : "v"(u.raw));
    return acc;
  }
  static hn::Vec<out_tag> convert(vf32 v) {
    hn::Vec<out_tag> r;
    asm("vcvtneps2bf16 %1, %0" : "=v"(r.raw) : "v"(v.raw));
    return r;
  }
  // The integer path, out of line: its constants then take no registers in the callers' loops.
  static HWY_NOINLINE hn::Vec<out_tag> encode_subnormal(vf32 v) {
    return bf16_io::encode(df32(), v);
  }
  static HWY_NOINLINE void encode_halves_subnormal(vf32 a, vf32 b, hn::Vec<out_tag>* ea,
                                                   hn::Vec<out_tag>* eb) {
    *ea = bf16_io::encode(df32(), a);
    *eb = bf16_io::encode(df32(), b);
  }
  static hn::Vec<out_tag> encode(df32, vf32 v) {
    // vfpclassps category 0x20: denormal (one instruction; the kernels are memory-bound)
    if (HWY_UNLIKELY(_mm512_fpclass_ps_mask(v.raw, 0x20) != 0)) return encode_subnormal(v);
    return convert(v);
  }
  static void store(df32 d, vf32 v, std::uint16_t* p) { hn::StoreU(encode(d, v), out_tag(), p); }
  // two vectors, one test for a subnormal in either
  static void encode_halves(df32, vf32 a, vf32 b, hn::Vec<out_tag>& ea, hn::Vec<out_tag>& eb) {
    if (HWY_UNLIKELY((_mm512_fpclass_ps_mask(a.raw, 0x20) | _mm512_fpclass_ps_mask(b.raw, 0x20)) !=
                     0)) {
      encode_halves_subnormal(a, b, &ea, &eb);
      return;
    }
    ea = convert(a);
    eb = convert(b);
  }
  // u16 lane 2k takes the even value k (lane k), lane 2k + 1 the odd value k (lane 16 + k)
  static __m512i in_pair_order(__m512i both) {
    alignas(64) static constexpr std::uint16_t kPairs[32] = {
        0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_load_si512(kPairs), both);
  }
  // encode_pairs where a result is +-0: the integer path if an input is subnormal
  static HWY_NOINLINE hn::Vec<du32_t> encode_pairs_with_zero(vf32 even, vf32 odd, __m512i both) {
    if ((_mm512_fpclass_ps_mask(even.raw, 0x20) | _mm512_fpclass_ps_mask(odd.raw, 0x20)) != 0) {
      hn::Vec<out_tag> e, o;
      encode_halves_subnormal(even, odd, &e, &o);
      return hn::Or(hn::PromoteTo(du32_t(), e), hn::ShiftLeft<16>(hn::PromoteTo(du32_t(), o)));
    }
    return hn::Vec<du32_t>{in_pair_order(both)};
  }
  // adjacent pairs: both vectors converted by one vcvtne2ps2bf16 (the even values' 16 bf16,
  // then the odd values'), then put in element order by one vpermw. A bf16 result is +-0 only
  // where its input was +-0 or subnormal (bf16 has fp32's exponent range), so one vptestnmw of
  // the results against 0x7fff, its mask from memory (no register held in the callers' loops),
  // stands for the two inputs' class tests, which run only where a result is zero
  // (docs/performance.md, "Performance decisions").
  static hn::Vec<du32_t> encode_pairs(df32 d, vf32 even, vf32 odd) {
    (void)d;
    __m512i both;
    asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(both) : "v"(odd.raw), "v"(even.raw));
    alignas(64) static constexpr std::uint16_t kMagnitude[32] = {
        0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff,
        0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff,
        0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff, 0x7fff};
    __mmask32 zero;
    asm("vptestnmw %2, %1, %0" : "=k"(zero) : "v"(both), "m"(kMagnitude));
    if (HWY_UNLIKELY(zero != 0)) return encode_pairs_with_zero(even, odd, both);
    return hn::Vec<du32_t>{in_pair_order(both)};
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, std::uint16_t* p) {
    hn::StoreU(encode_pairs(d, even, odd), du32_t(), reinterpret_cast<std::uint32_t*>(p));
  }
};
#endif

// The same element type with non-temporal (streaming) stores, for large out-of-place calls:
// the output lines are written whole, so they need not be read for ownership first. Needs
// vector-aligned stores (the caller checks). f32 adjacent pairs stream where they are
// interleaved into whole vectors (AVX-512), else keep normal stores.
template <class IO>
struct streaming_io : IO {
  using plain = IO;  // the same type with normal stores
  static void store(df32 d, vf32 v, typename IO::storage* p) {
    hn::Stream(IO::encode(d, v), typename IO::out_tag(),
               reinterpret_cast<typename IO::out_lane*>(p));
  }
  static void store_halves(df32 d, vf32 a, vf32 b, typename IO::storage* pa,
                           typename IO::storage* pb) {
    hn::Vec<typename IO::out_tag> ea, eb;
    IO::encode_halves(d, a, b, ea, eb);
    hn::Stream(ea, typename IO::out_tag(), reinterpret_cast<typename IO::out_lane*>(pa));
    hn::Stream(eb, typename IO::out_tag(), reinterpret_cast<typename IO::out_lane*>(pb));
  }
  static void store_pairs(df32 d, vf32 even, vf32 odd, typename IO::storage* p) {
    if constexpr (IO::pairs_encode) {
      hn::Stream(IO::encode_pairs(d, even, odd), du32_t(), reinterpret_cast<std::uint32_t*>(p));
    } else if constexpr (IO::pairs_vectors) {
      vf32 lo, hi;
      IO::interleave_pairs(even, odd, lo, hi);
      hn::Stream(lo, d, p);
      hn::Stream(hi, d, p + hn::Lanes(d));
    } else {
      IO::store_pairs(d, even, odd, p);
    }
  }
};

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_SIMD_INL_H_
