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
#include "cpu/rope_plan.h"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// after highway.h
#include "cpu/sin_cos-inl.h"

#undef TILEROPE_NATIVE_BF16  // each target's pass decides anew
#undef TILEROPE_BF16_BLOCKS
#undef TILEROPE_LANE_PAIRS
#undef TILEROPE_NORM_SUMS_AHEAD
// A lambda a kernel's loop calls, inlined into it: GCC calls the larger ones out of line,
// through their closures (measured: the bf16 QK RMSNorm backward 0.83 against 0.52 ns per
// element in memory)
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
// loaded value into its own memory operand, so a value used twice is loaded twice (rotate_vectors
// issued seven vector loads per pair of vectors instead of four; the load ports, not memory,
// then bound rows already in cache).
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
    // permutes); narrowing each half to u16 lanes first measured slower (gptj f16 in cache,
    // one thread: 0.14-0.17 against 0.12-0.14 ns per element with AVX-512, 0.17 against 0.135
    // with AVX2)
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
  // Without a native conversion the rounding is about a third of a bf16 row's work in cache
  // (rope-neox with AVX2: 0.25 ns per element, 0.16 storing by truncation): vectors are tested
  // for NaN once (two at a time where they come in pairs) and take the rounding alone when
  // none is; two vectors of pairs round together in u16 lanes (round_bf16_halves).
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
  // The integer path, out of line: its constants then take no registers in the callers' loops
  // (Intel, one thread, in cache, min ns per element: rope-neox bf16 0.092-0.093 to
  // 0.085-0.086, QK RMSNorm 0.158-0.161 to 0.153, its backward 0.295 to 0.271-0.277).
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
  // stands for the two inputs' class tests, which run only where a result is zero (Intel,
  // alternated six rounds, bench --only qk-norm-rope, one / two threads: bf16 in place 0.716 /
  // 0.690 to 0.759 / 0.742 of the ceiling; rope-neox bf16 decode 508-522 to 485-486 ns).
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

// ---- software prefetch -----------------------------------------------------------------------
// Each row's loop asks for the lines `ahead` bytes beyond the row (rope_plan::prefetch_bytes),
// in the same buffer: the rows further on in a contiguous tensor, which the hardware prefetcher
// alone did not keep enough of in flight where a row's arithmetic is long against its bytes
// (16-bit rows). Asked for a row at a time, spread among the rows' loads; asked for a whole
// block of heads at once before its rows, the same distance measured slower (bf16 rope-neox in
// place, one thread, Intel: 0.22-0.23 ns per element, 0.18-0.19 a row at a time, 0.25-0.26
// without). A prefetch never faults: the lines past a buffer's end cost a request, nothing else.
//
// Rows of a multiple of 256 bytes ask for lines from 128 bytes into a 256-byte block of the
// address space: `ahead` plus 0 to 255 bytes, the same for every row of a tensor whose strides
// are multiples of 256 bytes, so that each line is still asked for once. On the Intel class,
// where in such a block the lines begin mattered more than how far ahead they are. Rope-neox
// bf16 in place, Qwen3-8B, one thread, 256 MiB flushed between runs, against a
// read-modify-write of the same bytes (medians): q and k starting 0, 16, 64, 80 and 2048 bytes
// into a page read 0.71, 0.72, 0.92, 0.91 and 0.70 of it at 2048 bytes ahead, and 1.05, 1.03,
// 1.04, 1.02 and 0.93 with the lines from 128 bytes into a block. A distance alone suits one
// start: 2048 + 64 bytes ahead read 0.88-0.94 for q and k at the start of a page and 1.06 for
// them 64 bytes in, 2048 + 128 bytes 1.04 and 0.91-0.93 (docs/performance.md).
template <class T>
HWY_INLINE void prefetch_row(const T* row, std::int64_t elements, std::int64_t ahead) {
  if (ahead == 0) return;
  const char* c = reinterpret_cast<const char*>(row) + ahead;
  const auto bytes = elements * static_cast<std::int64_t>(sizeof(T));
  if (bytes % 256 == 0) c += (128 - reinterpret_cast<std::uintptr_t>(c)) & 255;
  for (std::int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(c + b);
}

// ---- the rotations ---------------------------------------------------------------------------

// cos and sin per frequency i < r/2, for the first element of each pair (a) and the second (b):
//     y_a = x_a ca - x_b sa,     y_b = x_b cb + x_a sb
// Half-width tables give ca = cb, sa = sb (the same pointers).
struct token_angles {
  const float* ca;
  const float* sa;
  const float* cb;
  const float* sb;
  bool full = false;  // cb, sb differ from ca, sa: four angle vectors per step, not two
};

template <class IO, pairs P>
HWY_INLINE void load_pair(df32 d, const typename IO::storage* x, std::int64_t i, std::int64_t half,
                          vf32& a, vf32& b) {
  if constexpr (P == pairs::halves) {
    a = IO::load(d, x + i);
    b = IO::load(d, x + half + i);
  } else {
    IO::load_pairs(d, x + 2 * i, a, b);
  }
}

// Both vectors of a pair of halves encoded together (one subnormal test for the two with
// AVX512-BF16), then stored; streaming_io streams them.
template <class IO, class = void>
struct has_store_halves : std::false_type {};
template <class IO>
struct has_store_halves<IO, std::void_t<decltype(&IO::store_halves)>> : std::true_type {};

template <class IO, pairs P>
HWY_INLINE void store_pair(df32 d, vf32 a, vf32 b, typename IO::storage* y, std::int64_t i,
                           std::int64_t half) {
  if constexpr (P == pairs::halves) {
    if constexpr (has_store_halves<IO>::value) {
      IO::store_halves(d, a, b, y + i, y + half + i);
    } else {
      hn::Vec<typename IO::out_tag> ea, eb;
      IO::encode_halves(d, a, b, ea, eb);
      hn::StoreU(ea, typename IO::out_tag(), reinterpret_cast<typename IO::out_lane*>(y + i));
      hn::StoreU(eb, typename IO::out_tag(),
                 reinterpret_cast<typename IO::out_lane*>(y + half + i));
    }
  } else {
    IO::store_pairs(d, a, b, y + 2 * i);
  }
}

// One vector of pairs rotated: (xa, xb) -> (xa ca - xb sa, xb cb + xa sb) at frequency i.
// RoundEach rounds each product to the output dtype before the sum, as PyTorch evaluates
// x * cos + rotate_half(x) * sin in a 16-bit dtype.
// Full: the second element has its own cos/sin (full-width rows); otherwise cb = ca, sb = sa
// and only two angle vectors are loaded.
template <class Out, bool RoundEach, bool Full>
HWY_INLINE void rotate_vectors(df32 d, vf32 xa, vf32 xb, std::int64_t i, token_angles a, vf32& ya,
                               vf32& yb) {
  const vf32 ca = in_register(hn::LoadU(d, a.ca + i)), sa = in_register(hn::LoadU(d, a.sa + i));
  const vf32 cb = Full ? in_register(hn::LoadU(d, a.cb + i)) : ca;
  const vf32 sb = Full ? in_register(hn::LoadU(d, a.sb + i)) : sa;
  xa = in_register(xa);
  xb = in_register(xb);
  if constexpr (RoundEach) {
    ya = hn::Sub(Out::round(d, hn::Mul(xa, ca)), Out::round(d, hn::Mul(xb, sa)));
    yb = hn::Add(Out::round(d, hn::Mul(xb, cb)), Out::round(d, hn::Mul(xa, sb)));
  } else {
    ya = hn::MulSub(xa, ca, hn::Mul(xb, sa));
    yb = hn::MulAdd(xb, cb, hn::Mul(xa, sb));
  }
}

// `pre(v, second, i)` transforms each loaded vector before the rotation (the identity, QK
// RMSNorm's x r w, or its x r where the weights are folded into the angles); `second` tells
// the pair's second elements from its first.
struct no_pre {
  HWY_INLINE vf32 operator()(vf32 v, bool, std::int64_t) const { return v; }
};
// x r: QK RMSNorm's scaling when the weights are folded into the angles
struct scaled_by {
  vf32 r;
  HWY_INLINE vf32 operator()(vf32 v, bool, std::int64_t) const { return hn::Mul(v, r); }
};

// One vector of pairs at frequency i, read from x as `In` lays them out, transformed by `pre`
// and rotated into (ya, yb).
template <class In, class Out, pairs PIn, bool RoundEach, bool Full, class Pre>
HWY_INLINE void load_rotate(df32 d, const typename In::storage* x, std::int64_t i,
                            std::int64_t half, token_angles a, Pre pre, vf32& ya, vf32& yb) {
  vf32 xa, xb;
  load_pair<In, PIn>(d, x, i, half, xa, xb);
  rotate_vectors<Out, RoundEach, Full>(d, pre(xa, false, i), pre(xb, true, i), i, a, ya, yb);
}

// One vector of pairs, read from x as `In` lays them out and written to y as `Out` does.
template <class In, class Out, pairs PIn, pairs POut, bool RoundEach, bool Full = true>
HWY_INLINE void rotate_step(df32 d, const typename In::storage* x, typename Out::storage* y,
                            std::int64_t i, std::int64_t half, token_angles a) {
  vf32 ya, yb;
  load_rotate<In, Out, PIn, RoundEach, Full>(d, x, i, half, a, no_pre{}, ya, yb);
  store_pair<Out, POut>(d, ya, yb, y, i, half);
}

// The r/2 pairs of one row, whole vectors. When r/2 is not a multiple of the vector, the last
// vector is the one ending at r/2, overlapping the one before it: it is loaded and computed
// before any store (so in place reads only original values) and stored last, with plain
// stores (it is not aligned); overlapped pairs get the same value twice. Rows shorter than one
// vector go through zero-padded copies: nothing is read or written past the row.
template <class In, class Out, pairs PIn, pairs POut, bool RoundEach, bool Full, class Pre = no_pre>
HWY_INLINE void rotate_whole_vectors(df32 d, const typename In::storage* x,
                                     typename Out::storage* y, token_angles a, std::int64_t half,
                                     Pre pre = {}) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t last = half - n;
  const bool overlap = half % n != 0;
  vf32 ta = hn::Zero(d), tb = hn::Zero(d);
  if (overlap) load_rotate<In, Out, PIn, RoundEach, Full>(d, x, last, half, a, pre, ta, tb);
  for (std::int64_t i = 0; i + n <= half; i += n) {
    vf32 ya, yb;
    load_rotate<In, Out, PIn, RoundEach, Full>(d, x, i, half, a, pre, ya, yb);
    store_pair<Out, POut>(d, ya, yb, y, i, half);
  }
  if (overlap) store_pair<typename Out::plain, POut>(d, ta, tb, y, last, half);
}

template <class In, class Out, pairs PIn, pairs POut, bool RoundEach = false>
void rotate_row(df32 d, const typename In::storage* x, typename Out::storage* y, token_angles a,
                std::int64_t half) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  if (half >= n) {
    if (a.full) {
      rotate_whole_vectors<In, Out, PIn, POut, RoundEach, true>(d, x, y, a, half);
    } else {
      rotate_whole_vectors<In, Out, PIn, POut, RoundEach, false>(d, x, y, a, half);
    }
    return;
  }
  typename In::storage xt[2 * max_f32_lanes] = {};
  typename Out::storage yt[2 * max_f32_lanes];
  float at[4][max_f32_lanes] = {};
  auto first = [&](pairs p, std::int64_t k) { return p == pairs::halves ? k : 2 * k; };
  auto second = [&](pairs p, std::int64_t k) { return p == pairs::halves ? half + k : 2 * k + 1; };
  for (std::int64_t j = 0; j < half; ++j) {
    xt[j] = x[first(PIn, j)];
    xt[n + j] = x[second(PIn, j)];
    at[0][j] = a.ca[j];
    at[1][j] = a.sa[j];
    at[2][j] = a.cb[j];
    at[3][j] = a.sb[j];
  }
  const token_angles t{at[0], at[1], at[2], at[3], true};
  rotate_step<In, typename Out::plain, pairs::halves, pairs::halves, RoundEach>(d, xt, yt, 0, n, t);
  for (std::int64_t j = 0; j < half; ++j) {
    y[first(POut, j)] = yt[j];
    y[second(POut, j)] = yt[n + j];
  }
}

// ---- per-token angles ------------------------------------------------------------------------

// Position id number `at` (i32 or i64).
std::int64_t id_at(const rope_plan& p, std::int64_t at) {
  return p.ids_type == dtype::i32 ? static_cast<const std::int32_t*>(p.ids)[at]
                                  : static_cast<const std::int64_t*>(p.ids)[at];
}

std::int64_t position_of(const rope_plan& p, std::int64_t b, std::int64_t s) {
  if (p.ids == nullptr) return p.start + s;
  return id_at(p, b * p.ids_b + s * p.ids_s);
}

// Multi-axis positions (MRoPE, 2D vision): frequency i reads the position of its own axis.
std::int64_t axis_position_of(const rope_plan& p, std::int64_t i, std::int64_t s) {
  return id_at(p, p.axis_of_frequency[i] * p.ids_axis + s);
}

// The x dtype's rounding of an fp32 value (hf_compat keeps its tables in the x dtype).
float round_to(dtype t, float v) {
  if (t == dtype::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  if (t == dtype::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  return v;
}

float value_at(dtype t, const void* p, std::int64_t e) {
  switch (t) {
    case dtype::f16:
      return f16_bits_to_f32(static_cast<const std::uint16_t*>(p)[e]);
    case dtype::bf16:
      return bf16_bits_to_f32(static_cast<const std::uint16_t*>(p)[e]);
    default:
      return static_cast<const float*>(p)[e];
  }
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

// Whether a full-width row's two halves of cos (or sin) are the same bits (HF's
// cat(freqs, freqs)): the row then takes two angle vectors per step instead of four.
inline bool same_halves(const float* first, const float* second, std::int64_t half) {
  return std::memcmp(first, second, static_cast<std::size_t>(half) * sizeof(float)) == 0;
}

// The angle of frequency i at position `at`, and its cos and sin, one at a time (libm).
void computed_angle(const rope_plan& p, std::int64_t at, std::int64_t i, float& c, float& sn) {
  if (p.precision == angle_precision::accurate) {
    const double a = static_cast<double>(at) * p.inv_freq[i];
    c = static_cast<float>(std::cos(a) * p.attention_scaling);
    sn = static_cast<float>(std::sin(a) * p.attention_scaling);
  } else {
    const double a = static_cast<float>(at) * p.inv_freq_f32[i];
    const auto scale = static_cast<float>(p.attention_scaling);
    c = round_to(p.x_type, static_cast<float>(std::cos(a)) * scale);
    sn = round_to(p.x_type, static_cast<float>(std::sin(a)) * scale);
  }
}

// The cos and sin rows of token s (position `pos`, or each frequency's own axis), a vector of
// fp64 angles at a time (sin_cos), rounded as computed_angle rounds them: accurate, the fp64
// product p inv_freq, its cos and sin times the attention scaling, rounded once to fp32;
// hf_compat, the fp32 product (exact in fp64, rounded to fp32), cos and sin rounded to fp32,
// times the fp32 scaling, rounded to the x dtype. Vectors with an angle past
// max_reduced_angle or a position past 2^31 take computed_angle. Against computed_angle for
// every frequency (Intel, one thread, rope-neox bf16 in place, 32 + 8 heads of 128, T = 64 in
// cache, min ns per element): 0.165-0.175 to 0.097, where a table takes 0.071-0.081;
// hf_compat 0.224-0.230 to 0.105; with AVX2 0.211-0.217 to 0.152-0.154 (a table 0.121-0.124).
// In memory (T = 8192): 0.310-0.314 to 0.176-0.178, a table 0.167-0.170.
void computed_angles(const rope_plan& p, std::int64_t s, std::int64_t pos, float* ca, float* sa) {
  const std::int64_t half = p.rotary_dim / 2;
  const bool accurate = p.precision == angle_precision::accurate;
  auto position_at = [&](std::int64_t i) {  // of frequency i
    return p.axis_of_frequency ? axis_position_of(p, i, s) : pos;
  };
  std::int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR  // one lane: libm is as fast (1.00 against 1.06 ns per element)
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // as many fp32 lanes, half a vector
  const auto n = static_cast<std::int64_t>(hn::Lanes(dd));
  const auto position_limit = hn::Set(dd, 0x1p31);
  const auto angle_limit = hn::Set(dd, max_reduced_angle);
  alignas(64) double at[HWY_MAX_BYTES / sizeof(double)];
  for (; i + n <= half; i += n) {
    auto position = hn::Set(dd, static_cast<double>(pos));
    if (p.axis_of_frequency != nullptr) {
      for (std::int64_t k = 0; k < n; ++k) at[k] = static_cast<double>(position_at(i + k));
      position = hn::Load(dd, at);
    }
    auto a = accurate ? hn::Mul(position, hn::LoadU(dd, p.inv_freq + i))
                      : hn::PromoteTo(dd, hn::Mul(hn::DemoteTo(df, position),
                                                  hn::LoadU(df, p.inv_freq_f32 + i)));
    if (HWY_UNLIKELY(!hn::AllTrue(dd, hn::And(hn::Lt(hn::Abs(position), position_limit),
                                              hn::Lt(hn::Abs(a), angle_limit))))) {
      for (std::int64_t k = i; k < i + n; ++k) computed_angle(p, position_at(k), k, ca[k], sa[k]);
      continue;
    }
    hn::Vec<decltype(dd)> sin_a, cos_a;
    sin_cos(dd, a, sin_a, cos_a);
    if (accurate) {
      const auto scale = hn::Set(dd, p.attention_scaling);
      hn::StoreU(hn::DemoteTo(df, hn::Mul(cos_a, scale)), df, ca + i);
      hn::StoreU(hn::DemoteTo(df, hn::Mul(sin_a, scale)), df, sa + i);
    } else {
      const auto scale = hn::Set(df, static_cast<float>(p.attention_scaling));
      hn::StoreU(hn::Mul(hn::DemoteTo(df, cos_a), scale), df, ca + i);
      hn::StoreU(hn::Mul(hn::DemoteTo(df, sin_a), scale), df, sa + i);
    }
  }
#endif
  for (; i < half; ++i) computed_angle(p, position_at(i), i, ca[i], sa[i]);
  if (accurate || p.x_type == dtype::f32) return;
  // hf_compat keeps its angles in the x dtype (the libm lanes are rounded already: rounding
  // again leaves them as they are)
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  for (float* row : {ca, sa}) {
    std::int64_t j = 0;
    for (; j + lanes <= half; j += lanes) {
      const vf32 v = hn::LoadU(d, row + j);
      hn::StoreU(p.x_type == dtype::f16 ? f16_io::round(d, v) : bf16_io::round(d, v), d, row + j);
    }
    for (; j < half; ++j) row[j] = round_to(p.x_type, row[j]);
  }
}

// The angles of token (b, s): straight out of an fp32 table or row when no conversion, plane
// gather or sign change is needed, else through `scratch` (4 * r/2 floats). Backward takes
// the transpose of the forward: ca, cb kept, (sa, sb) -> (-sb, -sa).
token_angles angles_for(const rope_plan& p, std::int64_t b, std::int64_t s, float* scratch) {
  const df32 d;
  const std::int64_t half = p.rotary_dim / 2;
  float* ca = scratch;
  float* sa = scratch + half;
  float* cb = scratch + 2 * half;
  float* sb = scratch + 3 * half;
  bool full = false;  // cb, sb differ from ca, sa
  if (p.rows_cos != nullptr) {
    full = p.rows_width != half;
    const std::int64_t base = b * p.rows_b + s * p.rows_s;
    if (p.rows_type == dtype::f32 && p.axis_of_frequency == nullptr && !p.backward &&
        (!full || p.table_pairs == pairs::halves)) {
      const float* c = static_cast<const float*>(p.rows_cos) + base;
      const float* sn = static_cast<const float*>(p.rows_sin) + base;
      if (full && (!same_halves(c, c + half, half) || !same_halves(sn, sn + half, half))) {
        return token_angles{c, sn, c + half, sn + half, true};
      }
      return token_angles{c, sn, c, sn};
    }
    for (std::int64_t i = 0; i < half; ++i) {
      const std::int64_t plane = p.axis_of_frequency ? p.axis_of_frequency[i] : 0;
      const std::int64_t row = plane * p.rows_plane + base;
      if (!full) {
        ca[i] = value_at(p.rows_type, p.rows_cos, row + i);
        sa[i] = value_at(p.rows_type, p.rows_sin, row + i);
      } else {
        const bool halves = p.table_pairs == pairs::halves;
        const std::int64_t ja = halves ? i : 2 * i, jb = halves ? half + i : 2 * i + 1;
        ca[i] = value_at(p.rows_type, p.rows_cos, row + ja);
        sa[i] = value_at(p.rows_type, p.rows_sin, row + ja);
        cb[i] = value_at(p.rows_type, p.rows_cos, row + jb);
        sb[i] = value_at(p.rows_type, p.rows_sin, row + jb);
      }
    }
  } else if (p.cos != nullptr && p.axis_of_frequency != nullptr) {
    if (p.table_type == dtype::f32 && p.num_axes <= 4) {
      // the token's table row of each axis, then column i from the row of its axis
      const float* crow[4];
      const float* srow[4];
      for (std::int64_t ax = 0; ax < p.num_axes; ++ax) {
        const std::int64_t row = id_at(p, ax * p.ids_axis + s) * p.table_row;
        crow[ax] = static_cast<const float*>(p.cos) + row;
        srow[ax] = static_cast<const float*>(p.sin) + row;
      }
      // whole vectors of frequencies: the row of axis 0, then each other axis where it owns i
      const hn::RebindToSigned<df32> di;
      const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
      std::int64_t i = 0;
      for (; i + lanes <= half; i += lanes) {
        const auto axis = hn::LoadU(di, p.axis_of_frequency + i);
        vf32 c = hn::LoadU(d, crow[0] + i), sn = hn::LoadU(d, srow[0] + i);
        for (std::int64_t ax = 1; ax < p.num_axes; ++ax) {
          const auto mine = hn::RebindMask(d, hn::Eq(axis, hn::Set(di, static_cast<int>(ax))));
          c = hn::IfThenElse(mine, hn::LoadU(d, crow[ax] + i), c);
          sn = hn::IfThenElse(mine, hn::LoadU(d, srow[ax] + i), sn);
        }
        hn::StoreU(c, d, ca + i);
        hn::StoreU(sn, d, sa + i);
      }
      for (; i < half; ++i) {
        ca[i] = crow[p.axis_of_frequency[i]][i];
        sa[i] = srow[p.axis_of_frequency[i]][i];
      }
    } else {
      for (std::int64_t i = 0; i < half; ++i) {
        const std::int64_t e = axis_position_of(p, i, s) * p.table_row + i;
        ca[i] = value_at(p.table_type, p.cos, e);
        sa[i] = value_at(p.table_type, p.sin, e);
      }
    }
  } else if (p.cos != nullptr) {
    const std::int64_t row = position_of(p, b, s) * p.table_row;
    if (p.table_type == dtype::f32) {
      const float* c = static_cast<const float*>(p.cos) + row;
      const float* sn = static_cast<const float*>(p.sin) + row;
      if (!p.backward) return token_angles{c, sn, c, sn};
      std::memcpy(ca, c, static_cast<std::size_t>(half) * sizeof(float));
      std::memcpy(sa, sn, static_cast<std::size_t>(half) * sizeof(float));
    } else {
      const auto* c16 = static_cast<const std::uint16_t*>(p.cos) + row;
      const auto* s16 = static_cast<const std::uint16_t*>(p.sin) + row;
      if (p.table_type == dtype::f16) {
        widen_row<f16_io>(d, c16, ca, half, f16_bits_to_f32);
        widen_row<f16_io>(d, s16, sa, half, f16_bits_to_f32);
      } else {
        widen_row<bf16_io>(d, c16, ca, half, bf16_bits_to_f32);
        widen_row<bf16_io>(d, s16, sa, half, bf16_bits_to_f32);
      }
    }
  } else {
    computed_angles(p, s, p.axis_of_frequency ? 0 : position_of(p, b, s), ca, sa);
  }
  if (full && same_halves(ca, cb, half) && same_halves(sa, sb, half)) full = false;
  if (!full) {
    if (p.backward) {
      for (std::int64_t i = 0; i < half; ++i) sa[i] = -sa[i];
    }
    return token_angles{ca, sa, ca, sa};
  }
  if (p.backward) {
    for (std::int64_t i = 0; i < half; ++i) {
      const float first = sa[i];
      sa[i] = -sb[i];
      sb[i] = -first;
    }
  }
  return token_angles{ca, sa, cb, sb, true};
}

// Per-thread scratch: 4 * r/2 angles, then two rows of head_dim fp32.
float* thread_scratch(const rope_plan& p) {
  thread_local std::vector<float> scratch;
  return line_aligned(scratch, static_cast<std::size_t>(2 * p.rotary_dim + 2 * p.head_dim + 8));
}

// Per-thread rows (2 r floats) for a token's angles rearranged: in block order for bf16 halves
// (QK RMSNorm's weights folded in), or expanded for adjacent pairs in output order.
float* angle_rows_scratch(const rope_plan& p) {
  thread_local std::vector<float> rows;
  return line_aligned(rows, static_cast<std::size_t>(2 * p.rotary_dim));
}

// In place with a changed layout (split-half and its backward), a row is read whole before it
// is written: x is then the row's copy in `row_copy`.
template <pairs PIn, pairs POut, class T>
HWY_INLINE const T* readable_row(const T* x, const T* y, T* row_copy, std::int64_t rotary) {
  if constexpr (PIn != POut) {
    if (x == y) {
      std::memcpy(row_copy, x, static_cast<std::size_t>(rotary) * sizeof(T));
      return row_copy;
    }
  }
  return x;
}

// The angles of a row's NV vectors of pairs, as a row of whole vectors takes them: ca(v),
// sa(v) for the first element of each pair and, when `full`, cb(v), sb(v) for the second.
// Read from memory at each use (memory_angles), or held in registers across a block's heads
// (held_angles, folded_angles).
template <bool Full>
struct memory_angles {
  static constexpr bool full = Full;
  df32 d;
  token_angles a;
  std::int64_t n;
  HWY_INLINE vf32 ca(int v) const { return in_register(hn::LoadU(d, a.ca + v * n)); }
  HWY_INLINE vf32 sa(int v) const { return in_register(hn::LoadU(d, a.sa + v * n)); }
  HWY_INLINE vf32 cb(int v) const { return in_register(hn::LoadU(d, a.cb + v * n)); }
  HWY_INLINE vf32 sb(int v) const { return in_register(hn::LoadU(d, a.sb + v * n)); }
};

// A row of NV whole vectors of pairs, each transformed by `pre(v, second, i)` (no_pre, or QK
// RMSNorm's x r: scaled_by), rotated through `f` and stored. The whole row is loaded
// before any of it is stored when it is in place with a changed layout (so that no copy of the
// row is needed) and when x is 16-bit; an f32 row loads each vector of pairs as it is rotated.
// Measured in memory (one thread, 32 + 8 heads of 128, T = 8192, ns per element), 16-bit out
// of place gains most: rope-neox bf16 0.162 to 0.134, f16 0.153 to 0.116, rope-gptj bf16 0.294
// to 0.126, f16 0.239 to 0.161, backward bf16 0.169 to 0.130; in place bf16 0.089 to 0.085
// (QK RMSNorm: norm_rotate_row_vectors). For f32 the whole row first was slower: rope-gptj out
// of place 0.241 to 0.365, interleave out of place 0.39 against 0.29 loaded as rotated.
template <class IO, pairs PIn, pairs POut, int NV, class Angles, class Pre>
HWY_INLINE void rotate_row_vectors(df32 d, const typename IO::storage* x, typename IO::storage* y,
                                   const Angles& f, std::int64_t half, Pre pre) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  auto rotate = [&](int v, vf32 xa, vf32 xb) TILEROPE_INLINE_LAMBDA {
    const vf32 first = pre(in_register(xa), false, v * n);
    const vf32 second = pre(in_register(xb), true, v * n);
    const vf32 ca = f.ca(v), sa = f.sa(v);
    const vf32 cb = Angles::full ? f.cb(v) : ca, sb = Angles::full ? f.sb(v) : sa;
    const vf32 ya = hn::MulSub(first, ca, hn::Mul(second, sa));
    const vf32 yb = hn::MulAdd(second, cb, hn::Mul(first, sb));
    store_pair<IO, POut>(d, ya, yb, y, v * n, half);
  };
  if ((PIn != POut && x == y) || sizeof(typename IO::storage) == 2) {  // the whole row first
    vf32 xa[NV], xb[NV];
    for (int v = 0; v < NV; ++v) load_pair<IO, PIn>(d, x, v * n, half, xa[v], xb[v]);
    for (int v = 0; v < NV; ++v) rotate(v, xa[v], xb[v]);
  } else {
    for (int v = 0; v < NV; ++v) {
      vf32 xa, xb;
      load_pair<IO, PIn>(d, x, v * n, half, xa, xb);
      rotate(v, xa, xb);
    }
  }
}

// A row of NV whole vectors of pairs rotated in place with its layout changed, half of it held
// in registers where the whole row would not fit (NV = 8 with fewer than 16 lanes). Pairs in,
// halves out: vector v reads y[2vn, 2(v+1)n) and stores y[vn, (v+1)n) and y[r/2 + vn, ...);
// the first stores reach only vectors already read, the second only the row's later half, read
// before any store. Halves in, pairs out: vector v stores y[2vn, 2(v+1)n), reaching the first
// half (read before any store) or second-half vectors up to v, already read. Without it the
// row was copied first (readable_row).
template <class IO, pairs PIn, pairs POut, int NV, class Angles>
HWY_INLINE void rotate_row_in_place_half_held(df32 d, typename IO::storage* y, const Angles& f,
                                              std::int64_t half) {
  static_assert(PIn != POut && NV % 2 == 0);
  constexpr int H = PIn == pairs::adjacent ? NV / 2 : NV;  // vectors held
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  vf32 ha[H], hb[PIn == pairs::adjacent ? H : 1];
  for (int v = 0; v < H; ++v) {
    if constexpr (PIn == pairs::adjacent) {
      load_pair<IO, PIn>(d, y, (NV / 2 + v) * n, half, ha[v], hb[v]);  // the later half
    } else {
      ha[v] = IO::load(d, y + v * n);  // the first half
    }
  }
  HWY_UNROLL(8)  // not unrolled, GCC kept the held vectors on the stack (objdump)
  for (int v = 0; v < NV; ++v) {
    vf32 first, second;
    if constexpr (PIn == pairs::adjacent) {
      if (v < NV / 2) {
        load_pair<IO, PIn>(d, y, v * n, half, first, second);
      } else {
        first = ha[v - NV / 2];
        second = hb[v - NV / 2];
      }
    } else {
      first = ha[v];
      second = IO::load(d, y + half + v * n);
    }
    first = in_register(first);
    second = in_register(second);
    const vf32 ca = f.ca(v), sa = f.sa(v);
    const vf32 cb = Angles::full ? f.cb(v) : ca, sb = Angles::full ? f.sb(v) : sa;
    const vf32 ya = hn::MulSub(first, ca, hn::Mul(second, sa));
    const vf32 yb = hn::MulAdd(second, cb, hn::Mul(first, sb));
    store_pair<IO, POut>(d, ya, yb, y, v * n, half);
  }
}

// bf16 pairs in (the interleaved layout's forward) does not take it: its eight held vectors
// were kept on the stack (objdump), and bench --only interleave read it slower in memory (0.45
// / 0.51 against 0.52 / 0.61 of the ceiling, one / two threads, three alternations); with
// AVX2 and SSE4 it takes rotate_row_bf16_pairs_in_place.
template <class IO, pairs PIn>
constexpr bool takes_half_held() {
  return !(std::is_same_v<typename IO::plain, bf16_io> && PIn == pairs::adjacent);
}

// How many whole vectors of pairs a row has, when rotate_row_vectors takes it (else 0).
inline int held_vectors(std::int64_t half, std::int64_t lanes) {
  if (half % lanes != 0) return 0;
  const std::int64_t nv = half / lanes;
  return nv == 1 || nv == 2 || nv == 4 ? static_cast<int>(nv) : 0;
}

// ---- bf16 halves in lane-pair order (AVX512-BF16) -------------------------------------------
// A half of a bf16 row taken as u32 lanes widens in one instruction per fp32 vector: the even
// elements by a shift, the odd ones by a mask (bf16_io::load_pairs), where a widening load
// takes two (vpmovzxwd and a shift); and the two vectors round back together by one
// vcvtne2ps2bf16 and one vpermw (bf16_native_io::encode_pairs) where each took a vcvtneps2bf16
// of two uops. In between, a step of 2n pairs holds the even elements of its 2n first (and
// second) elements in one fp32 vector and the odd ones in the next: the lane-pair order. The
// angles and weights are put in that order once per block of heads (lane_pair_ordered).
#ifdef TILEROPE_NATIVE_BF16
#define TILEROPE_LANE_PAIRS 1

// Rows in lane-pair order: bf16 halves with AVX512-BF16.
template <class IO, pairs PIn, pairs POut>
constexpr bool takes_lane_pairs() {
  return std::is_same_v<typename IO::plain, bf16_native_io> && PIn == pairs::halves &&
         POut == pairs::halves;
}

// One step's 2n floats, lo then hi in element order, put in lane-pair order: the even elements
// in lo, the odd ones in hi
HWY_INLINE void to_lane_pairs(df32 d, vf32& lo, vf32& hi) {
  const vf32 even = hn::ConcatEven(d, hi, lo), odd = hn::ConcatOdd(d, hi, lo);
  lo = even;
  hi = odd;
}

// 2n floats of each step in lane-pair order: for each 2n from `from`, its even elements, then
// its odd ones (half a multiple of 2n)
HWY_INLINE void lane_pair_ordered(df32 d, const float* from, std::int64_t half, float* to) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t i = 0; i < half; i += 2 * n) {
    vf32 lo = hn::LoadU(d, from + i), hi = hn::LoadU(d, from + i + n);
    to_lane_pairs(d, lo, hi);
    hn::StoreU(lo, d, to + i);
    hn::StoreU(hi, d, to + i + n);
  }
}

// The token's angles in lane-pair order, in `rows` (4 r/2 floats; 2 r/2 unless full)
HWY_INLINE token_angles lane_pair_angles(df32 d, const token_angles& a, std::int64_t half,
                                         float* rows) {
  lane_pair_ordered(d, a.ca, half, rows);
  lane_pair_ordered(d, a.sa, half, rows + half);
  if (!a.full) return token_angles{rows, rows + half, rows, rows + half};
  lane_pair_ordered(d, a.cb, half, rows + 2 * half);
  lane_pair_ordered(d, a.sb, half, rows + 3 * half);
  return token_angles{rows, rows + half, rows + 2 * half, rows + 3 * half, true};
}
#endif

// S vectors of pairs from pair index i: one (as `P` lays them out), or with LanePairs two, each
// half's 2n values from one load, or with Wide two in element order (halves; f16 with AVX-512),
// stored as one vector of 2n 16-bit values per half: a whole line where a streamed store can
// take one
template <class IO, pairs P, bool LanePairs, bool Wide = false>
HWY_INLINE void load_pairs_step(df32 d, const typename IO::storage* x, std::int64_t i,
                                std::int64_t half, vf32* a, vf32* b) {
  if constexpr (Wide) {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    load_pair<IO, P>(d, x, i, half, a[0], b[0]);
    load_pair<IO, P>(d, x, i + n, half, a[1], b[1]);
  } else if constexpr (LanePairs) {
    IO::load_pairs(d, x + i, a[0], a[1]);
    IO::load_pairs(d, x + half + i, b[0], b[1]);
  } else {
    load_pair<IO, P>(d, x, i, half, a[0], b[0]);
  }
}

#if HWY_TARGET != HWY_SCALAR
// 2n 16-bit values (one full vector) to p: stored, or streamed whole where p is aligned to them,
// else as two halves (can_stream checks n)
template <class IO>
HWY_INLINE void store_2n(hn::Vec<hn::Repartition<std::uint16_t, df32>> v, typename IO::storage* p) {
  const hn::Repartition<std::uint16_t, df32> d16;
  const hn::Half<decltype(d16)> dn;
  if constexpr (std::is_same_v<IO, typename IO::plain>) {
    hn::StoreU(v, d16, p);
  } else if (reinterpret_cast<std::uintptr_t>(p) % (hn::Lanes(d16) * sizeof(*p)) == 0) {
    hn::Stream(v, d16, p);  // whole lines
  } else {
    hn::Stream(hn::LowerHalf(dn, v), dn, p);
    hn::Stream(hn::UpperHalf(dn, v), dn, p + hn::Lanes(dn));
  }
}
#endif

template <class IO, pairs P, bool LanePairs, bool Wide = false>
HWY_INLINE void store_pairs_step(df32 d, const vf32* a, const vf32* b, typename IO::storage* y,
                                 std::int64_t i, std::int64_t half) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (Wide || LanePairs) {
    const hn::Repartition<std::uint16_t, df32> d16;
    hn::Vec<decltype(d16)> wa, wb;
    if constexpr (Wide) {
      hn::Vec<typename IO::out_tag> ea0, ea1, eb0, eb1;
      IO::encode_halves(d, a[0], b[0], ea0, eb0);
      IO::encode_halves(d, a[1], b[1], ea1, eb1);
      wa = hn::Combine(d16, ea1, ea0);
      wb = hn::Combine(d16, eb1, eb0);
    } else {
      wa = hn::BitCast(d16, IO::encode_pairs(d, a[0], a[1]));
      wb = hn::BitCast(d16, IO::encode_pairs(d, b[0], b[1]));
    }
    store_2n<IO>(wa, y + i);
    store_2n<IO>(wb, y + half + i);
    return;
  }
#endif
  store_pair<IO, P>(d, a[0], b[0], y, i, half);
}

// A row of NV whole vectors of pairs of halves (NV even) in lane-pair order, loaded whole before
// any of it is stored, through angles in that order. `pre` (QK RMSNorm: x r) is given each
// vector's first pair index in element order, which its lanes no longer follow: it may not
// read per-element values by it.
template <class IO, int NV, class Angles, class Pre = no_pre>
HWY_INLINE void rotate_row_lane_pairs(df32 d, const typename IO::storage* x,
                                      typename IO::storage* y, const Angles& f, std::int64_t half,
                                      Pre pre = {}) {
  static_assert(NV % 2 == 0);
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  constexpr pairs H = pairs::halves;
  vf32 xa[NV], xb[NV];
  for (int v = 0; v < NV; v += 2) load_pairs_step<IO, H, true>(d, x, v * n, half, xa + v, xb + v);
  for (int v = 0; v < NV; v += 2) {
    vf32 ya[2], yb[2];
    for (int k = 0; k < 2; ++k) {
      const vf32 ca = f.ca(v + k), sa = f.sa(v + k);
      const vf32 cb = Angles::full ? f.cb(v + k) : ca, sb = Angles::full ? f.sb(v + k) : sa;
      const vf32 first = pre(xa[v + k], false, (v + k) * n);
      const vf32 second = pre(xb[v + k], true, (v + k) * n);
      ya[k] = hn::MulSub(first, ca, hn::Mul(second, sa));
      yb[k] = hn::MulAdd(second, cb, hn::Mul(first, sb));
    }
    store_pairs_step<IO, H, true>(d, ya, yb, y, v * n, half);
  }
}

// A token's angles held in registers across a block's heads: NV vectors of pairs (r/2 = NV
// lanes), two vectors each, or four for full-width rows.
template <bool Full, int NV>
struct held_angles {
  static constexpr bool full = Full;
  vf32 c[NV], s[NV], c2[Full ? NV : 1], s2[Full ? NV : 1];
  HWY_INLINE held_angles(df32 d, const token_angles& a) {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    for (int v = 0; v < NV; ++v) {
      c[v] = hn::LoadU(d, a.ca + v * n);
      s[v] = hn::LoadU(d, a.sa + v * n);
      if constexpr (Full) {
        c2[v] = hn::LoadU(d, a.cb + v * n);
        s2[v] = hn::LoadU(d, a.sb + v * n);
      }
    }
  }
  HWY_INLINE vf32 ca(int v) const { return c[v]; }
  HWY_INLINE vf32 sa(int v) const { return s[v]; }
  HWY_INLINE vf32 cb(int v) const { return c2[Full ? v : 0]; }
  HWY_INLINE vf32 sb(int v) const { return s2[Full ? v : 0]; }
};

// The heads of one block through held_angles: a row's only loads are its own.
// LanePairs (bf16 halves with AVX512-BF16, NV even): the rows in lane-pair order, `a` already
// in it.
template <class IO, pairs PIn, pairs POut, bool Full, int NV, bool LanePairs = false>
HWY_NOINLINE void rotate_block_held(df32 d, const rope_plan& p, const head_block& blk,
                                    const typename IO::storage* in, typename IO::storage* out,
                                    const token_angles& a) {
  using T = typename IO::storage;
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim;
  const std::int64_t pass = p.head_dim - rotary;
  const held_angles<Full, NV> f(d, a);
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    const T* x = in + h * blk.in_h;
    T* y = out + h * blk.out_h;
    prefetch_row(x, p.head_dim, p.prefetch_bytes);
    if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
    if constexpr (LanePairs) {
      rotate_row_lane_pairs<IO, NV>(d, x, y, f, half);
    } else {
      rotate_row_vectors<IO, PIn, POut, NV>(d, x, y, f, half, no_pre{});
    }
  }
}

#ifdef TILEROPE_LANE_PAIRS
// bf16 halves of r/2 = 2n + n/2 pairs (head dim 80, the vision towers of Qwen2-VL and
// Qwen2.5-VL) in lane-pair order: the first 2n pairs as one lane-pair step, the last n/2 of
// both halves joined in one vector [x_a | x_b] (from two loads of n/2), rotated with its halves
// swapped for partners, y = x C + partner S with C = [c_a | c_b], S = [-s_a | s_b] (the pair
// path's products, bit for bit), and stored as two n/2. The pair path took three overlapping
// vectors of pairs, each widened by a widening load and a shift and narrowed by a
// vcvtneps2bf16 of two uops. Intel, 16 + 16 heads of 80 in place, one thread, in cache (T =
// 64): 0.163-0.166 to 0.119 ns per element (min); bench --only vision, six alternations,
// bf16 in place: 0.794 to 0.880 of the ceiling at one thread, 0.804 to 0.898 at two. Output
// order (rotate_block_output_order) measured as fast in cache (0.113-0.119) but not in the
// bench (0.775 at both thread counts, against 0.846 and 0.851 in five alternations).
inline bool takes_lane_pairs_tail(std::int64_t half, std::int64_t lanes) {
  return half == 2 * lanes + lanes / 2;
}

template <class IO, bool Full>
HWY_NOINLINE void rotate_block_lane_pairs_tail(df32 d, const rope_plan& p, const head_block& blk,
                                               const std::uint16_t* in, std::uint16_t* out,
                                               const token_angles& a) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim;
  const std::int64_t pass = p.head_dim - rotary;
  // the lane-pair step's angles (rows of 2n), held in registers
  const held_angles<Full, 2> f(d, lane_pair_angles(d, a, 2 * n, angle_rows_scratch(p)));
  // the tail's [c_a | c_b] and [-s_a | s_b] (frequencies 2n .. r/2)
  const hn::Half<df32> dq;                             // n/2 fp32
  const hn::Rebind<std::uint16_t, decltype(dq)> dq16;  // n/2 bf16
  const hn::Rebind<std::uint16_t, df32> d16;           // n bf16
  const vf32 tc = hn::Combine(d, hn::LoadU(dq, a.cb + 2 * n), hn::LoadU(dq, a.ca + 2 * n));
  const vf32 ts = hn::Combine(d, hn::LoadU(dq, a.sb + 2 * n), hn::Neg(hn::LoadU(dq, a.sa + 2 * n)));
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    const std::uint16_t* x = in + h * blk.in_h;
    std::uint16_t* y = out + h * blk.out_h;
    prefetch_row(x, p.head_dim, p.prefetch_bytes);
    if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(*x));
    // the tail's pairs, which the lane-pair step neither reads nor writes
    const auto tail16 =
        hn::Combine(d16, hn::LoadU(dq16, x + half + 2 * n), hn::LoadU(dq16, x + 2 * n));
    const vf32 t = hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32_t(), tail16)));
    rotate_row_lane_pairs<IO, 2>(d, x, y, f, half);
    const vf32 yt = hn::MulAdd(t, tc, hn::Mul(hn::ConcatLowerUpper(d, t, t), ts));
    const auto et = IO::encode(d, yt);
    hn::StoreU(hn::LowerHalf(dq16, et), dq16, y + 2 * n);
    hn::StoreU(hn::UpperHalf(dq16, et), dq16, y + half + 2 * n);
  }
}
#endif

// ---- bf16 halves a vector of bf16 at a time (x86 without AVX-512) ---------------------------
// Without a native conversion, widening and narrowing bf16 one fp32 vector at a time costs a
// widening load and a shift per vector in, and a pack and a cross-block permute per vector out.
// Taken as whole vectors of 2n bf16 (n fp32 lanes), a half widens by interleaving zeros below
// its elements within each 128-bit block (two instructions for 2n elements), and the results
// narrow by one signed pack within each block, which restores that order. In between the two
// fp32 vectors hold the 2n elements in block order: the first the even 128-bit blocks' four
// each, the second the odd blocks'. The token's angle rows are put in that order once per
// block of heads (block_ordered). One NaN test covers a step's four results. Rope-neox bf16
// with AVX2, one thread: in cache 0.29 to 0.20 ns per element in place, 0.25 to 0.20 out of
// place; bench --only rope-neox, Qwen3-8B, two alternations: 0.47 to 0.61 of the ceiling in
// place, 0.52 to 0.61 out of place (two threads 0.57 to 0.76, 0.48 to 0.73). Head dim 80
// (r/2 = 2n + n with AVX2) ends each row with one fp32 vector of pairs: bench --only vision,
// three alternations, bf16 0.41 to 0.47 in place, 0.43 to 0.45 out of place (two threads
// 0.47 and 0.46, 0.48 to 0.65).
// The narrowing splits each result's u32 lanes into low and high u16 halves by one byte
// shuffle and one 64-bit unpack per vector and rounds 2n at a time in u16 lanes: 18
// instructions a step of 32 elements where the rounding per fp32 vector and the pack took 22;
// rope-neox bf16 in cache 0.162 to 0.147 ns per element in place, 0.165 to 0.151 out of place.
// Rows of adjacent bf16 pairs stored as halves (the interleaved layout's forward) take it too:
// two u32 vectors of pairs put in block order, each pair widened by a shift and a mask; in
// cache 0.200 to 0.174 ns per element out of place, 0.213 to 0.197 in place after a copy of
// the row, 0.183 without it (rotate_row_bf16_pairs_in_place).
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4)
#define TILEROPE_BF16_BLOCKS 1
using du16_t = hn::Repartition<std::uint16_t, df32>;  // 2n lanes

// [2n] bf16 -> two [n] fp32 in block order. v is held in a register: GCC otherwise loaded it
// again for each unpack, and QK RMSNorm's forward step (a row rotated, the next one summed)
// issued 17 loads for 32 elements instead of 12, one of them a constant of the rounding
// spilled to the stack. With load_u16_pairs held too (Intel, AVX2 forced, one thread, 32 + 8
// heads of 128, bf16 in place, min ns per element, three alternations): the forward in cache
// 0.186-0.191 to 0.166-0.174 and in memory 0.242-0.247 to 0.230-0.234, the backward 0.335-0.346
// to 0.287-0.304 and 0.412-0.432 to 0.379-0.407.
HWY_INLINE void widen_bf16_blocks(df32 d, hn::Vec<du16_t> v, vf32& first, vf32& second) {
  const du16_t d16;
  v = in_register(v);
  first = hn::BitCast(d, hn::InterleaveLower(d16, hn::Zero(d16), v));
  second = hn::BitCast(d, hn::InterleaveUpper(d16, hn::Zero(d16), v));
}

// Two [n] fp32 in block order -> [2n] bf16, rounded to nearest even; `nan`: some lane may be
// NaN (then quieted, through f32_to_bf16).
HWY_INLINE hn::Vec<du16_t> narrow_bf16_blocks(df32 d, vf32 first, vf32 second, bool nan) {
  const du16_t d16;
  if (HWY_UNLIKELY(nan)) {
    const hn::RebindToSigned<df32> di;
    // the bf16 bits sign-extended in i32 lanes, so that the signed pack keeps them
    auto bits = [&](vf32 v) { return hn::ShiftRight<16>(hn::BitCast(di, bf16_high(d, v, true))); };
    return hn::BitCast(d16, hn::ReorderDemote2To(hn::Repartition<std::int16_t, df32>(), bits(first),
                                                 bits(second)));
  }
  // Each block's four u32 lanes split into their low halves, then their high halves (one byte
  // shuffle), and the two vectors' blocks joined in the pack's order: `high` is the truncated
  // bf16, `low` the bits rounded away, 2n of each in u16 lanes.
  const hn::Repartition<std::uint8_t, df32> d8;
  const hn::Repartition<std::uint64_t, df32> d64;
  alignas(16) static constexpr std::uint8_t kLowsThenHighs[16] = {0, 1, 4, 5, 8,  9,  12, 13,
                                                                  2, 3, 6, 7, 10, 11, 14, 15};
  const auto split = hn::LoadDup128(d8, kLowsThenHighs);
  const auto f = hn::BitCast(d64, hn::TableLookupBytes(hn::BitCast(d8, first), split));
  const auto s = hn::BitCast(d64, hn::TableLookupBytes(hn::BitCast(d8, second), split));
  const auto low = hn::BitCast(d16, hn::InterleaveLower(d64, f, s));
  const auto high = hn::BitCast(d16, hn::InterleaveUpper(d64, f, s));
  return round_bf16_halves(low, high);
}

// 2n fp32 in element order -> block order
HWY_INLINE void to_block_order(df32 d, vf32 v0, vf32 v1, vf32& first, vf32& second) {
  if constexpr (hn::MaxLanes(d) == 8) {  // two blocks each
    first = hn::ConcatLowerLower(d, v1, v0);
    second = hn::ConcatUpperUpper(d, v1, v0);
  } else {  // one block each: already in block order
    first = v0;
    second = v1;
  }
}

// 2n adjacent bf16 pairs (x[0, 4n)) -> their first and second elements as fp32, in block order:
// the two u32 vectors of pairs put in block order (for AVX2 two vperm2i128), then each pair's
// halves widened by a shift and a mask.
HWY_INLINE void widen_bf16_pairs_blocks(df32 d, hn::Vec<du32_t> p0, hn::Vec<du32_t> p1, vf32& a0,
                                        vf32& b0, vf32& a1, vf32& b1) {
  const du32_t du;
  auto q0 = p0, q1 = p1;
  if constexpr (hn::MaxLanes(d) == 8) {  // two blocks each
    q0 = hn::ConcatLowerLower(du, p1, p0);
    q1 = hn::ConcatUpperUpper(du, p1, p0);
  }
  const auto high = hn::Set(du, 0xffff0000u);
  a0 = hn::BitCast(d, hn::ShiftLeft<16>(q0));
  b0 = hn::BitCast(d, hn::And(q0, high));
  a1 = hn::BitCast(d, hn::ShiftLeft<16>(q1));
  b1 = hn::BitCast(d, hn::And(q1, high));
}

// Whether a row takes it: bf16 halves out, from halves or adjacent pairs (the interleaved
// layout's forward), r/2 a multiple of n and at least 2n; with QK RMSNorm (fp32_once, forward)
// halves in and every dim rotated.
template <class IO>
inline bool takes_bf16_blocks(const rope_plan& p, std::int64_t lanes) {
  if (p.qk_norm &&
      (p.backward || p.hf_rounding || p.rotary_dim != p.head_dim || p.in_pairs != pairs::halves)) {
    return false;
  }
  return std::is_same_v<typename IO::plain, bf16_io> && p.out_pairs == pairs::halves &&
         p.rotary_dim / 2 % lanes == 0 && p.rotary_dim / 2 >= 2 * lanes;
}

// The token's angles in block order, in `rows` (4 * r/2 floats); where r/2 = (2k + 1) n, the
// last n in element order.
HWY_INLINE token_angles block_ordered(df32 d, const token_angles& a, std::int64_t half,
                                      float* rows) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  auto put = [&](const float* from, float* to) {
    std::int64_t i = 0;
    for (; i + 2 * n <= half; i += 2 * n) {
      vf32 first, second;
      to_block_order(d, hn::LoadU(d, from + i), hn::LoadU(d, from + i + n), first, second);
      hn::StoreU(first, d, to + i);
      hn::StoreU(second, d, to + i + n);
    }
    if (i < half) hn::StoreU(hn::LoadU(d, from + i), d, to + i);  // the last n in element order
  };
  put(a.ca, rows);
  put(a.sa, rows + half);
  if (!a.full) return token_angles{rows, rows + half, rows, rows + half};
  put(a.cb, rows + 2 * half);
  put(a.sb, rows + 3 * half);
  return token_angles{rows, rows + half, rows + 2 * half, rows + 3 * half, true};
}

// Called with each step's first pair index: nothing, or QK RMSNorm's sums of another row.
struct no_step_hook {
  HWY_INLINE void operator()(std::int64_t) const {}
};

// One row to bf16 halves, from halves or adjacent pairs (PIn), through angles in block order, 2n
// pairs a step, each loaded vector transformed by `pre` (no_pre, or QK RMSNorm's x r:
// scaled_by), `hook(i)` called once per step of 2n pairs (not for a last n). NaNFree: the
// caller knows no result is NaN, and the steps skip their NaN test.
template <class IO, bool Full, pairs PIn = pairs::halves, bool NaNFree = false, class Pre = no_pre,
          class Hook = no_step_hook>
HWY_INLINE void rotate_row_bf16_blocks(df32 d, const std::uint16_t* x, std::uint16_t* y,
                                       const token_angles& a, std::int64_t half, Pre pre = {},
                                       Hook hook = {}) {
  const du16_t d16;
  const hn::Half<du16_t> dh;  // n lanes
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  // streamed whole where both halves' vectors of 2n are aligned to them, else n at a time
  // (can_stream checks n)
  [[maybe_unused]] const bool whole =
      (reinterpret_cast<std::uintptr_t>(y) | static_cast<std::uintptr_t>(half * 2)) % (4 * n) == 0;
  std::int64_t i = 0;
  for (; i + 2 * n <= half; i += 2 * n) {
    vf32 a0, a1, b0, b1;  // [n] each: pairs [i, i + 2n) in block order
    if constexpr (PIn == pairs::halves) {
      widen_bf16_blocks(d, hn::LoadU(d16, x + i), a0, a1);
      widen_bf16_blocks(d, hn::LoadU(d16, x + half + i), b0, b1);
    } else {
      widen_bf16_pairs_blocks(d, load_u16_pairs(x + 2 * i), load_u16_pairs(x + 2 * i + 2 * n), a0,
                              b0, a1, b1);
    }
    hook(i);
    vf32 ya0, yb0, ya1, yb1;
    rotate_vectors<IO, false, Full>(d, pre(a0, false, i), pre(b0, true, i), i, a, ya0, yb0);
    rotate_vectors<IO, false, Full>(d, pre(a1, false, i + n), pre(b1, true, i + n), i + n, a, ya1,
                                    yb1);
    const bool nan = !NaNFree && may_hold_nan(d, hn::Add(hn::Add(ya0, ya1), hn::Add(yb0, yb1)));
    const auto ea = narrow_bf16_blocks(d, ya0, ya1, nan);
    const auto eb = narrow_bf16_blocks(d, yb0, yb1, nan);
    if constexpr (std::is_same_v<IO, typename IO::plain>) {
      hn::StoreU(ea, d16, y + i);
      hn::StoreU(eb, d16, y + half + i);
    } else if (whole) {  // streaming_io
      hn::Stream(ea, d16, y + i);
      hn::Stream(eb, d16, y + half + i);
    } else {
      hn::Stream(hn::LowerHalf(dh, ea), dh, y + i);
      hn::Stream(hn::UpperHalf(dh, ea), dh, y + i + n);
      hn::Stream(hn::LowerHalf(dh, eb), dh, y + half + i);
      hn::Stream(hn::UpperHalf(dh, eb), dh, y + half + i + n);
    }
  }
  if (i < half) {  // r/2 = (2k + 1) n: the last n pairs one fp32 vector at a time
    vf32 ya, yb;
    load_rotate<IO, IO, PIn, false, Full>(d, x, i, half, a, pre, ya, yb);
    store_pair<IO, pairs::halves>(d, ya, yb, y, i, half);
  }
}

// bf16 pairs in, halves out, in place, r/2 = 2n S (S = 2 or 4 steps of 2n pairs): step s
// reads y[4ns, 4n(s+1)) and stores y[2ns, 2n(s+1)), read by step s/2 <= s, and y[r/2 + 2ns,
// ...), read by step S/2 + s/2; so the later half's S/2 steps are read first (S u32 vectors of
// raw pairs, held), and no copy of the row is needed.
template <class IO, bool Full, int S>
HWY_INLINE void rotate_row_bf16_pairs_in_place(df32 d, std::uint16_t* y, const token_angles& a,
                                               std::int64_t half) {
  const du16_t d16;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  hn::Vec<du32_t> held[S];
  for (int k = 0; k < S; ++k) held[k] = load_u16_pairs(y + 2 * n * (S + k));
  HWY_UNROLL(4)  // not unrolled, GCC kept `held` on the stack (objdump)
  for (int s = 0; s < S; ++s) {
    const std::int64_t i = 2 * n * s;
    vf32 a0, a1, b0, b1;
    if (s < S / 2) {
      widen_bf16_pairs_blocks(d, load_u16_pairs(y + 2 * i), load_u16_pairs(y + 2 * i + 2 * n), a0,
                              b0, a1, b1);
    } else {
      widen_bf16_pairs_blocks(d, held[2 * s - S], held[2 * s - S + 1], a0, b0, a1, b1);
    }
    vf32 ya0, yb0, ya1, yb1;
    rotate_vectors<IO, false, Full>(d, a0, b0, i, a, ya0, yb0);
    rotate_vectors<IO, false, Full>(d, a1, b1, i + n, a, ya1, yb1);
    const bool nan = may_hold_nan(d, hn::Add(hn::Add(ya0, ya1), hn::Add(yb0, yb1)));
    hn::StoreU(narrow_bf16_blocks(d, ya0, ya1, nan), d16, y + i);
    hn::StoreU(narrow_bf16_blocks(d, yb0, yb1, nan), d16, y + half + i);
  }
}

#else
template <class IO>
inline bool takes_bf16_blocks(const rope_plan&, std::int64_t) {
  return false;
}
#endif

// ---- rows of whole vectors whose pairs are not whole vectors ---------------------------------
// When r/2 is not a multiple of the vector but the row is (AVX-512 at head dims 48, 80, 112),
// the pair-at-a-time path ends each row with an overlapped vector and cannot stream. Taken in
// output order instead, every vector stored is one of the row's own:
//     y_j = x_j C_j + x_partner(j) S_j
// partner(j) = j + r/2 or j - r/2 for halves (the middle vector, which holds r/2, takes its
// partners from the last vector's upper half and the first vector's lower half), j ^ 1 for
// adjacent pairs (a swap within the vector); C_j is the cos of j's element of its pair, S_j
// the sin negated for a pair's first element. The products are y_a = x_a ca - x_b sa and
// y_b = x_b cb + x_a sb, bit for bit.
#if HWY_TARGET != HWY_SCALAR
// How many vectors such a row has (else 0): every dim rotated, the layout kept, r/2 at least
// one vector but not a multiple of it, the row an odd number of vectors up to 7. f32 halves
// (one-thread loop, head dim 80 in cache: 0.125 to 0.079 ns per element) and adjacent pairs of
// every dtype (f16 0.137 to 0.091, bf16 0.119 to 0.106) gain. 16-bit halves take it only when
// the output streams: widening each vector and joining its partner put three shuffles on every
// vector (Zen 4: bf16 0.101 against 0.111 in cache; f16 even), but streamed, the output skips
// its reads for ownership (bench --only vision, out of place, ten alternations: bf16 0.49 to
// 0.59 of the ceiling at one thread, 0.56 to 0.69 at two; f16 0.56 to 0.62 and 0.58 to 0.69).
// Not streamed, bf16 with AVX512-BF16 takes rotate_block_lane_pairs_tail.
inline int output_order_vectors(const rope_plan& p, std::int64_t lanes, bool streaming) {
  const std::int64_t half = p.rotary_dim / 2, D = p.head_dim;
  if (p.qk_norm || p.rotary_dim != D || p.in_pairs != p.out_pairs) return 0;
  if (p.in_pairs == pairs::halves && p.x_type != dtype::f32 && !streaming) return 0;
  if (half < lanes || half % lanes == 0 || D % lanes != 0) return 0;
  const std::int64_t vectors = D / lanes;
  return vectors <= 7 ? static_cast<int>(vectors) : 0;
}

// A token's C and S rows (above) of NV vectors, held in registers across a block's heads.
template <pairs P, int NV>
struct output_angles {
  vf32 c[NV], s[NV];
  HWY_INLINE output_angles(df32 d, const token_angles& a, std::int64_t half) {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    HWY_ALIGN float rows[2 * NV * max_f32_lanes];
    float* C = rows;
    float* S = rows + NV * n;
    for (std::int64_t i = 0;; i += n) {
      i = std::min(i, half - n);  // the last vector of frequencies overlaps the one before
      const vf32 ca = hn::LoadU(d, a.ca + i), sa = hn::Neg(hn::LoadU(d, a.sa + i));
      const vf32 cb = hn::LoadU(d, a.cb + i), sb = hn::LoadU(d, a.sb + i);
      if constexpr (P == pairs::halves) {
        hn::StoreU(ca, d, C + i);
        hn::StoreU(cb, d, C + half + i);
        hn::StoreU(sa, d, S + i);
        hn::StoreU(sb, d, S + half + i);
      } else {
        hn::StoreInterleaved2(ca, cb, d, C + 2 * i);
        hn::StoreInterleaved2(sa, sb, d, S + 2 * i);
      }
      if (i == half - n) break;
    }
    for (int v = 0; v < NV; ++v) {
      c[v] = hn::Load(d, C + v * n);
      s[v] = hn::Load(d, S + v * n);
    }
  }
};

// One row [NV vectors] in output order: read whole before any of it is stored (in place reads
// only original values), each partner vector joined from two of the row's vectors (r/2 is
// m + 1/2 vectors, m = NV / 2), then stored as whole vectors (streamed by streaming_io).
template <class IO, pairs P, int NV>
HWY_INLINE void rotate_row_output_order(df32 d, const typename IO::storage* x,
                                        typename IO::storage* y, const output_angles<P, NV>& f) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  constexpr int middle = NV / 2;  // the vector holding r/2 (halves)
  vf32 xs[NV], ys[NV];
  for (int v = 0; v < NV; ++v) xs[v] = IO::load(d, x + v * n);
  for (int v = 0; v < NV; ++v) {
    vf32 partner;
    if constexpr (P == pairs::adjacent) {
      partner = hn::Reverse2(d, xs[v]);
    } else if (v < middle) {  // x[v n + half, + n): the upper half of v + m, the lower of v + m + 1
      partner = hn::ConcatLowerUpper(d, xs[v + middle + 1], xs[v + middle]);
    } else if (v > middle) {
      partner = hn::ConcatLowerUpper(d, xs[v - middle], xs[v - middle - 1]);
    } else {
      partner = hn::ConcatLowerUpper(d, xs[0], xs[NV - 1]);
    }
    ys[v] = hn::MulAdd(xs[v], f.c[v], hn::Mul(partner, f.s[v]));
  }
  // stored two vectors at a time (one subnormal test for both with AVX512-BF16)
  for (int v = 0; v + 1 < NV; v += 2)
    store_pair<IO, pairs::halves>(d, ys[v], ys[v + 1], y, v * n, n);
  IO::store(d, ys[NV - 1], y + (NV - 1) * n);
}

template <class IO, pairs P, int NV>
HWY_NOINLINE void rotate_block_output_order(df32 d, const rope_plan& p, const head_block& blk,
                                            const typename IO::storage* in,
                                            typename IO::storage* out, const token_angles& a) {
  const output_angles<P, NV> f(d, a, p.rotary_dim / 2);
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    prefetch_row(in + h * blk.in_h, p.head_dim, p.prefetch_bytes);
    rotate_row_output_order<IO, P, NV>(d, in + h * blk.in_h, out + h * blk.out_h, f);
  }
}
#else
inline int output_order_vectors(const rope_plan&, std::int64_t, bool) { return 0; }
#endif

// ---- adjacent pairs in output order, angle rows in L1 -----------------------------------------
// Without the held path (fewer than 16 lanes), adjacent pairs taken a vector of pairs at a time
// are split into even and odd lanes on load and joined again on store: with AVX2, f32 takes
// eight shuffles per two vectors. In output order (above) a vector's partners are its own
// lanes swapped, one in-block shuffle per vector:
//     y_j = x_j C_j + x_(j^1) S_j
// with the token's C and S rows (r floats each) expanded into L1 once per token, and every
// store a whole vector of the row's own (so out-of-place f32 streams). With AVX2 (one thread,
// 32 + 8 heads of 128, T = 16, in place, min ns per element) f32 takes 0.100 against 0.150 and
// f16 0.115 against 0.207; bf16 without a native conversion measured 0.23 against 0.150 (a
// widening load and a shift per vector in, the pack's rounding out, where the split takes one
// shift or mask each way) and keeps the split. With SSE4, f32 measured even (0.179 against
// 0.185) and takes it, for its streamed stores; f16, converted in software there either way,
// measured 1.29 against 1.15 and keeps the split.
#if HWY_TARGET != HWY_SCALAR
template <class IO>
inline bool takes_adjacent_rows(const rope_plan& p, std::int64_t lanes) {
  using plain = typename IO::plain;
  constexpr bool f16c = HWY_TARGET <= HWY_AVX2;
  if (std::is_same_v<plain, bf16_io> || (std::is_same_v<plain, f16_io> && !f16c)) return false;
  return lanes < 16 && !p.qk_norm && p.in_pairs == pairs::adjacent &&
         p.out_pairs == pairs::adjacent && p.rotary_dim % lanes == 0;
}

// C and S of a token: C_2i = ca_i, C_2i+1 = cb_i, S_2i = -sa_i, S_2i+1 = sb_i.
HWY_INLINE void expand_adjacent_angles(df32 d, const token_angles& a, std::int64_t half, float* C,
                                       float* S) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + n <= half; i += n) {
    hn::StoreInterleaved2(hn::LoadU(d, a.ca + i), hn::LoadU(d, a.cb + i), d, C + 2 * i);
    hn::StoreInterleaved2(hn::Neg(hn::LoadU(d, a.sa + i)), hn::LoadU(d, a.sb + i), d, S + 2 * i);
  }
  for (; i < half; ++i) {
    C[2 * i] = a.ca[i];
    C[2 * i + 1] = a.cb[i];
    S[2 * i] = -a.sa[i];
    S[2 * i + 1] = a.sb[i];
  }
}

template <class IO>
HWY_NOINLINE void rotate_block_adjacent(df32 d, const rope_plan& p, const head_block& blk,
                                        const typename IO::storage* in, typename IO::storage* out,
                                        const float* C, const float* S) {
  using T = typename IO::storage;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t rotary = p.rotary_dim, pass = p.head_dim - rotary;
  auto rotated = [&](vf32 x, std::int64_t j) {
    x = in_register(x);
    return hn::MulAdd(x, hn::LoadU(d, C + j), hn::Mul(hn::Reverse2(d, x), hn::LoadU(d, S + j)));
  };
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    const T* x = in + h * blk.in_h;
    T* y = out + h * blk.out_h;
    prefetch_row(x, p.head_dim, p.prefetch_bytes);
    if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
    for (std::int64_t j = 0; j < rotary; j += n)
      IO::store(d, rotated(IO::load(d, x + j), j), y + j);
  }
}

#else
template <class IO>
inline bool takes_adjacent_rows(const rope_plan&, std::int64_t) {
  return false;
}
#endif

// The heads of one block (q or k) of one token. Full (four angle vectors or two) is decided
// once per token.
template <class IO, pairs PIn, pairs POut, bool Full>
HWY_INLINE void rotate_block_rows(df32 d, const rope_plan& p, const head_block& blk,
                                  const typename IO::storage* in, typename IO::storage* out,
                                  const token_angles& a, typename IO::storage* row_copy) {
  using T = typename IO::storage;
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim;
  const std::int64_t pass = p.head_dim - rotary;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const bool whole = half >= lanes;
  const int held = held_vectors(half, lanes);
  if (lanes >= 16 && held != 0) {
#ifdef TILEROPE_LANE_PAIRS
    if constexpr (takes_lane_pairs<IO, PIn, POut>()) {
      if (held != 1) {
        const token_angles la = lane_pair_angles(d, a, half, angle_rows_scratch(p));
        if (held == 4) {
          return rotate_block_held<IO, PIn, POut, Full, 4, true>(d, p, blk, in, out, la);
        }
        return rotate_block_held<IO, PIn, POut, Full, 2, true>(d, p, blk, in, out, la);
      }
    }
#endif
    if (held == 4) return rotate_block_held<IO, PIn, POut, Full, 4>(d, p, blk, in, out, a);
    if (held == 2) return rotate_block_held<IO, PIn, POut, Full, 2>(d, p, blk, in, out, a);
    return rotate_block_held<IO, PIn, POut, Full, 1>(d, p, blk, in, out, a);
  }
#ifdef TILEROPE_LANE_PAIRS
  if constexpr (takes_lane_pairs<IO, PIn, POut>() && std::is_same_v<IO, typename IO::plain>) {
    if (takes_lane_pairs_tail(half, lanes)) {
      return rotate_block_lane_pairs_tail<IO, Full>(d, p, blk, in, out, a);
    }
  }
#endif
#ifdef TILEROPE_BF16_BLOCKS
  if constexpr (std::is_same_v<T, std::uint16_t> && POut == pairs::halves) {
    if (takes_bf16_blocks<IO>(p, lanes)) {
      const token_angles b = block_ordered(d, a, half, angle_rows_scratch(p));
      for (std::int64_t h = 0; h < blk.heads; ++h) {
        const T* x = in + h * blk.in_h;
        T* y = out + h * blk.out_h;
        prefetch_row(x, p.head_dim, p.prefetch_bytes);
        if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
        if constexpr (PIn == pairs::adjacent && std::is_same_v<IO, typename IO::plain>) {
          if (x == y && (half == 4 * lanes || half == 8 * lanes)) {
            if (half == 4 * lanes) rotate_row_bf16_pairs_in_place<IO, Full, 2>(d, y, b, half);
            if (half == 8 * lanes) rotate_row_bf16_pairs_in_place<IO, Full, 4>(d, y, b, half);
            continue;
          }
        }
        x = readable_row<PIn, POut>(x, y, row_copy, rotary);  // pairs in place: a copy
        rotate_row_bf16_blocks<IO, Full, PIn>(d, x, y, b, half);
      }
      return;
    }
  }
#endif
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    const T* x = in + h * blk.in_h;
    T* y = out + h * blk.out_h;
    prefetch_row(x, p.head_dim, p.prefetch_bytes);
    if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
    if constexpr (PIn != POut) {
      if (x == y && held != 0) {  // fewer than 16 lanes
        const memory_angles<Full> f{d, a, lanes};
        if (held == 1) rotate_row_vectors<IO, PIn, POut, 1>(d, y, y, f, half, no_pre{});
        if (held == 2) rotate_row_vectors<IO, PIn, POut, 2>(d, y, y, f, half, no_pre{});
        if (held == 4) rotate_row_vectors<IO, PIn, POut, 4>(d, y, y, f, half, no_pre{});
        continue;
      }
      if (x == y && half == 8 * lanes && takes_half_held<IO, PIn>()) {
        rotate_row_in_place_half_held<IO, PIn, POut, 8>(d, y, memory_angles<Full>{d, a, lanes},
                                                        half);
        continue;
      }
    }
    x = readable_row<PIn, POut>(x, y, row_copy, rotary);
    if (whole) {
      rotate_whole_vectors<IO, IO, PIn, POut, false, Full>(d, x, y, a, half);
    } else {
      rotate_row<IO, IO, PIn, POut>(d, x, y, a, half);
    }
  }
}

// Multi-axis (MRoPE) angles gathered from a table, the rows of several positions per token:
// gathered for a run of tokens before those tokens' rows are rotated. Gathered token by token,
// between the rows, MRoPE in memory ran 30-60% slower than RoPE, though only 11% in cache (the
// more distinct table rows a token's axes read, the slower); in runs of 64 tokens it measured
// (one thread, 32 + 8 heads of 128, T = 8192, ns per element) f32 0.25 to 0.20 in place and
// 0.37 to 0.29 out of place, bf16 0.150 to 0.119 and 0.175 to 0.136, f16 0.135 to 0.111 and
// 0.193 to 0.147. Runs of 256 measured no better.
constexpr int angle_run = 64;

inline bool gathers_angles_in_runs(const rope_plan& p) {
  return p.cos != nullptr && p.axis_of_frequency != nullptr;
}

// Per-thread scratch for a run's angles: angle_run slots of 4 * r/2 floats.
float* run_scratch(const rope_plan& p) {
  thread_local std::vector<float> scratch;
  return line_aligned(scratch, static_cast<std::size_t>(angle_run * 2 * p.rotary_dim));
}

// fn on one block's rows of token (b, s): its first head row in and out.
template <class T, class Fn>
HWY_INLINE void call_on_block(const head_block& blk, std::int64_t b, std::int64_t s,
                              const token_angles& a, Fn& fn) {
  fn(b, s, a, blk, static_cast<const T*>(blk.in) + b * blk.in_b + s * blk.in_s,
     static_cast<T*>(blk.out) + b * blk.out_b + s * blk.out_s);
}

// Tokens [first, last): the angles once per token (into `angle_scratch` when they need it;
// MRoPE's for a run of tokens at a time, above), then fn(b, s, angles, block, in, out) for q's
// and k's heads of the token, in and out pointing at its first head row. Tokens taken one at a
// time set up no array of runs (its 64 entries were 7% of the samples of a call of one token
// of 1 + 1 heads). No software prefetch: the hardware prefetchers follow these streams, and
// prefetching the rows two tokens ahead measured slower (docs/performance.md), as did
// prefetching MRoPE's table rows.
template <class T, class Fn>
HWY_INLINE void for_each_block(const rope_plan& p, std::int64_t first, std::int64_t last,
                               float* angle_scratch, Fn&& fn) {
  auto blocks_of = [&](std::int64_t token, const token_angles& a) {
    const std::int64_t b = token / p.seq, s = token % p.seq;
    for (int k = 0; k < p.num_blocks; ++k) call_on_block<T>(p.blocks[k], b, s, a, fn);
  };
  if (!gathers_angles_in_runs(p) || last - first == 1) {
    for (std::int64_t t = first; t < last; ++t) {
      blocks_of(t, angles_for(p, t / p.seq, t % p.seq, angle_scratch));
    }
    return;
  }
  float* slots = run_scratch(p);
  token_angles run[angle_run];
  for (std::int64_t t0 = first; t0 < last; t0 += angle_run) {
    const int n = static_cast<int>(std::min<std::int64_t>(angle_run, last - t0));
    for (int j = 0; j < n; ++j) {
      run[j] = angles_for(p, (t0 + j) / p.seq, (t0 + j) % p.seq, slots + j * 2 * p.rotary_dim);
    }
    for (int j = 0; j < n; ++j) blocks_of(t0 + j, run[j]);
  }
}

// Tokens [first, last) as for_each_block, but in runs of `block_run` tokens taken a block at a
// time: q's heads of every token of the run, then k's, so that a thread reads one tensor's rows
// at a time (the angles taken again for each block). For QK RMSNorm's backward, whose three
// streams (g, x, dx) are each split over q and k: Intel, bench --only qk-norm-rope-bwd, four
// alternations, two threads, medians of the fraction: bf16 0.765 to 0.778 in place and 0.778
// to 0.807 out of place, f16 0.761 to 0.794 and 0.754 to 0.779, f32 0.864 to 0.880 and 0.858
// to 0.876; one thread within the spread (-0.015 to +0.018). The forward kernels measured slower
// so (bench --quick, two alternations: rope-neox bf16 in place 0.93 to 0.85, qk-norm-rope bf16
// 0.83 to 0.77) and keep the token order. MRoPE, which gathers its angles in runs already, keeps
// it too.
constexpr std::int64_t block_run = 16;

template <class T, class Fn>
HWY_INLINE void for_each_block_in_runs(const rope_plan& p, std::int64_t first, std::int64_t last,
                                       float* angle_scratch, Fn&& fn) {
  if (gathers_angles_in_runs(p)) return for_each_block<T>(p, first, last, angle_scratch, fn);
  for (std::int64_t t0 = first; t0 < last; t0 += block_run) {
    const std::int64_t t1 = std::min(last, t0 + block_run);
    for (int k = 0; k < p.num_blocks; ++k) {
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t b = t / p.seq, s = t % p.seq;
        call_on_block<T>(p.blocks[k], b, s, angles_for(p, b, s, angle_scratch), fn);
      }
    }
  }
}

// Rows in output order (output_order_vectors, decided once per call) or through
// rotate_block_rows.
template <class IO, pairs PIn, pairs POut>
void rope_tokens_loop(const rope_plan& p, std::int64_t first, std::int64_t last) {
  using T = typename IO::storage;
  const df32 d;
  float* scratch = thread_scratch(p);
  T* row_copy = reinterpret_cast<T*>(scratch + 2 * p.rotary_dim);
  [[maybe_unused]] const std::int64_t half = p.rotary_dim / 2;
  constexpr bool streams = !std::is_same_v<IO, typename IO::plain>;  // a streaming_io
  [[maybe_unused]] const int ordered =
      output_order_vectors(p, static_cast<std::int64_t>(hn::Lanes(d)), streams);
  [[maybe_unused]] const bool adjacent_rows =
      ordered == 0 && takes_adjacent_rows<IO>(p, static_cast<std::int64_t>(hn::Lanes(d)));
  [[maybe_unused]] float* C = adjacent_rows ? angle_rows_scratch(p) : nullptr;  // then S
  [[maybe_unused]] std::int64_t expanded = -1;  // the token whose C and S rows are expanded
  for_each_block<T>(p, first, last, scratch,
                    [&]([[maybe_unused]] std::int64_t b, [[maybe_unused]] std::int64_t s,
                        const token_angles& a, const head_block& blk, const T* in, T* out) {
#if HWY_TARGET != HWY_SCALAR
                      if constexpr (PIn == POut) {
                        switch (ordered) {
                          case 3:
                            return rotate_block_output_order<IO, PIn, 3>(d, p, blk, in, out, a);
                          case 5:
                            return rotate_block_output_order<IO, PIn, 5>(d, p, blk, in, out, a);
                          case 7:
                            return rotate_block_output_order<IO, PIn, 7>(d, p, blk, in, out, a);
                          default:
                            break;
                        }
                        if (adjacent_rows) {
                          float* S = C + p.rotary_dim;
                          if (b * p.seq + s != expanded) {  // q's block, or the token's first
                            expand_adjacent_angles(d, a, half, C, S);
                            expanded = b * p.seq + s;
                          }
                          return rotate_block_adjacent<IO>(d, p, blk, in, out, C, S);
                        }
                      }
#endif
                      if (a.full) {
                        rotate_block_rows<IO, PIn, POut, true>(d, p, blk, in, out, a, row_copy);
                      } else {
                        rotate_block_rows<IO, PIn, POut, false>(d, p, blk, in, out, a, row_copy);
                      }
                    });
}

// Sum of x^2 over the first j elements of x (j returned: n rounded down to whole vectors), in
// fp32 as a vector whose lanes add up to it; two accumulators halve the dependent chain.
// `dot`: through IO::add_squares where the IO has it.
template <class IO>
HWY_INLINE vf32 squares_vector(df32 d, const typename IO::storage* x, std::int64_t n, bool dot,
                               std::int64_t& j) {
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  vf32 acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  j = 0;
  if constexpr (IO::dot_pairs) {
    if (dot) {
      for (; j + 4 * lanes <= n; j += 4 * lanes) {
        acc0 = IO::add_squares(acc0, load_u16_pairs(x + j));
        acc1 = IO::add_squares(acc1, load_u16_pairs(x + j + 2 * lanes));
      }
      if (j + 2 * lanes <= n) {
        acc0 = IO::add_squares(acc0, load_u16_pairs(x + j));
        j += 2 * lanes;
      }
    }
  }
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    vf32 v0, v1;
    if constexpr (IO::cheap_pairs) {
      IO::load_pairs(d, x + j, v0, v1);  // even and odd elements
    } else {
      v0 = IO::load(d, x + j);
      v1 = IO::load(d, x + j + lanes);
    }
    acc0 = hn::MulAdd(v0, v0, acc0);
    acc1 = hn::MulAdd(v1, v1, acc1);
  }
  if (j + lanes <= n) {
    const vf32 v = IO::load(d, x + j);
    acc0 = hn::MulAdd(v, v, acc0);
    j += lanes;
  }
  return hn::Add(acc0, acc1);
}

// Sum of x^2 over n elements, in fp32.
template <class IO>
HWY_INLINE float sum_of_squares(df32 d, const typename IO::storage* x, std::int64_t n,
                                bool dot = false) {
  std::int64_t j;
  float sum = hn::GetLane(hn::SumOfLanes(d, squares_vector<IO>(d, x, n, dot, j)));
  for (; j < n; ++j) {
    const float v = IO::load1(x + j);
    sum += v * v;
  }
  return sum;
}

// x r w for one vector of pair elements (w: the weights of those elements, in pair order).
template <class IO, bool HfRound>
HWY_INLINE vf32 normalised(df32 d, vf32 x, vf32 r, const float* w, std::int64_t i) {
  vf32 n = hn::Mul(x, r);
  if constexpr (HfRound) n = IO::round(d, n);
  vf32 hw = hn::Mul(n, hn::LoadU(d, w + i));
  if constexpr (HfRound) hw = IO::round(d, hw);
  return hw;
}

// One row of QK RMSNorm + RoPE with r/2 >= one vector: each vector of pairs is normalised in
// registers and rotated.
template <class IO, pairs PIn, pairs POut, bool HfRound, bool Full>
HWY_INLINE void norm_rotate_row(df32 d, const typename IO::storage* x, typename IO::storage* y,
                                const token_angles& a, std::int64_t half, float r, const float* wa,
                                const float* wb) {
  const vf32 rv = hn::Set(d, r);
  rotate_whole_vectors<IO, IO, PIn, POut, HfRound, Full>(
      d, x, y, a, half, [&](vf32 v, bool second, std::int64_t i) {
        return normalised<IO, HfRound>(d, v, rv, second ? wb : wa, i);
      });
}

// One 16-bit row of QK RMSNorm + RoPE whose r/2 is NV whole vectors: loaded whole before any
// of it is stored (rotate_row_vectors), each vector of pairs scaled by r and rotated through
// the angles with the block's weights folded in (fold_weights, once per token and block):
//     y_a = (x_a r) (wa ca) - (x_b r) (wb sa),   y_b = (x_b r) (wb cb) + (x_a r) (wa sb)
// as the f32 rows' folded_angles, two multiplies fewer per vector of pairs than x r w (in
// cache, one thread, 32 + 8 heads of 128, T = 32, minimum of five or eight alternated runs:
// f16 0.165 to 0.147 ns per element in place, 0.163 to 0.150 out of place; bf16 even, 0.153
// to 0.157 either way).
// Measured in memory against the pair-at-a-time row (one thread, 32 + 8 heads of 128,
// T = 8192, ns per element, the two alternated): out of place with streaming stores, bf16
// 0.229 to 0.203 with x and y at the same offset in their pages, 0.279 to 0.239 with x 16
// bytes off a cache line (f16 0.298 to 0.231); with plain stores (y off a line) 0.244 and
// 0.242; in place 0.204 and 0.204.
template <class IO, pairs PIn, pairs POut, int NV>
HWY_INLINE void norm_rotate_row_vectors(df32 d, const typename IO::storage* x,
                                        typename IO::storage* y, const token_angles& folded,
                                        std::int64_t half, float r) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  rotate_row_vectors<IO, PIn, POut, NV>(d, x, y, memory_angles<true>{d, folded, n}, half,
                                        scaled_by{hn::Set(d, r)});
}

// A token's angles at frequency i with one block's RMSNorm weights folded in: wa ca, wb sa,
// wb cb, wa sb (the weight of the element each angle multiplies).
HWY_INLINE void folded_at(df32 d, const token_angles& a, const float* wa, const float* wb,
                          std::int64_t i, vf32& ca, vf32& sa, vf32& cb, vf32& sb) {
  const vf32 va = hn::LoadU(d, wa + i), vb = hn::LoadU(d, wb + i);
  ca = hn::Mul(va, hn::LoadU(d, a.ca + i));
  sa = hn::Mul(vb, hn::LoadU(d, a.sa + i));
  cb = hn::Mul(vb, hn::LoadU(d, a.cb + i));
  sb = hn::Mul(va, hn::LoadU(d, a.sb + i));
}

// The folded angles of a token's r/2 frequencies written to `rows` (4 r/2 floats).
HWY_INLINE token_angles fold_weights(df32 d, const token_angles& a, const float* wa,
                                     const float* wb, std::int64_t half, float* rows) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  float* ca = rows;
  float* sa = rows + half;
  float* cb = rows + 2 * half;
  float* sb = rows + 3 * half;
  for (std::int64_t i = 0; i < half; i += n) {
    vf32 c, s, c2, s2;
    folded_at(d, a, wa, wb, i, c, s, c2, s2);
    hn::StoreU(c, d, ca + i);
    hn::StoreU(s, d, sa + i);
    hn::StoreU(c2, d, cb + i);
    hn::StoreU(s2, d, sb + i);
  }
  return token_angles{ca, sa, cb, sb, true};
}

#ifdef TILEROPE_BF16_BLOCKS
// fold_weights and block_ordered in one pass (r/2 a multiple of 2n), and whether every folded
// angle is at most `bound` in magnitude, NaN not: the largest of their bits with the sign
// shifted out, as u32 (that order is the order of magnitudes, NaN above all), against the
// bound's. Three passes over the rows before (the bound checked by Le and Abs over the stored
// rows): AVX2 on Intel, one thread, bf16 in place in cache, medians of three alternations,
// gemma3-4b's heads (T = 5) 0.226-0.237 to 0.204-0.222 ns per element, Qwen3-8B's (T = 8)
// 0.203-0.209 to 0.191-0.201.
HWY_INLINE token_angles folded_in_block_order(df32 d, const token_angles& a, const float* wa,
                                              const float* wb, std::int64_t half, float* rows,
                                              float bound, bool& within) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const hn::RebindToUnsigned<df32> du;
  auto most = hn::Zero(du);
  float* const to[4] = {rows, rows + half, rows + 2 * half, rows + 3 * half};
  for (std::int64_t i = 0; i < half; i += 2 * n) {
    vf32 v0[4], v1[4];
    folded_at(d, a, wa, wb, i, v0[0], v0[1], v0[2], v0[3]);
    folded_at(d, a, wa, wb, i + n, v1[0], v1[1], v1[2], v1[3]);
    for (int r = 0; r < 4; ++r) {
      vf32 first, second;
      to_block_order(d, v0[r], v1[r], first, second);
      hn::StoreU(first, d, to[r] + i);
      hn::StoreU(second, d, to[r] + i + n);
      most = hn::Max(most, hn::Max(hn::ShiftLeft<1>(hn::BitCast(du, v0[r])),
                                   hn::ShiftLeft<1>(hn::BitCast(du, v1[r]))));
    }
  }
  std::uint32_t bound_bits;
  std::memcpy(&bound_bits, &bound, sizeof bound_bits);
  within = hn::GetLane(hn::MaxOfLanes(du, most)) <= bound_bits << 1;
  return token_angles{to[0], to[1], to[2], to[3], true};
}
#endif

// Heads of a block whose RMSNorm sums are found together, forward and backward (4 to 8
// measured best).
constexpr std::int64_t norm_group = 4;

// r = 1 / sqrt(mean(x^2) + eps) of the block's heads [h0, h0 + norm_group) (fewer at its end)
// into r: independent sums, so that their latency overlaps. bf16 squares by vdpbf16ps where
// eps >= 2^-100, as in group_inverse_rms_vector (Intel, decode of qk-norm-rope bf16, ns per
// call: 893-969 to 876-896).
template <class IO>
HWY_INLINE void group_inverse_rms(df32 d, const rope_plan& p, const head_block& blk,
                                  const typename IO::storage* in, std::int64_t h0, float* r) {
  const float inv_d = 1.0f / static_cast<float>(p.head_dim);
  for (std::int64_t g = h0; g < std::min(h0 + norm_group, blk.heads); ++g) {
    const float mean =
        sum_of_squares<IO>(d, in + g * blk.in_h, p.head_dim, p.eps >= 0x1p-100f) * inv_d;
    r[g - h0] = 1.0f / std::sqrt(mean + p.eps);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR  // fixed-width vectors of 4, 8 or 16 lanes
// The lane sums of four vectors as one 128-bit vector [sum(a), sum(b), sum(c), sum(e)]: lanes
// paired within each 128-bit block, then the blocks added.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<float>> add_blocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(d) > 4) {
    const hn::Half<D> dh;
    return add_blocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}
HWY_INLINE hn::Vec<hn::Full128<float>> lane_sums4(df32 d, vf32 a, vf32 b, vf32 c, vf32 e) {
  const vf32 ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const vf32 ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  const hn::Repartition<double, df32> d64;
  const auto ab64 = hn::BitCast(d64, ab), ce64 = hn::BitCast(d64, ce);
  return add_blocks(d, hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, ab64, ce64)),
                               hn::BitCast(d, hn::InterleaveUpper(d64, ab64, ce64))));
}

// r = 1 / sqrt(mean(x^2) + eps) of four heads from their vectors of squares, into r[0, 4).
HWY_INLINE void store_inverse_rms4(df32 d, const rope_plan& p, const vf32* acc, float* r) {
  const hn::Full128<float> d4;
  const auto mean = hn::Mul(lane_sums4(d, acc[0], acc[1], acc[2], acc[3]),
                            hn::Set(d4, 1.0f / static_cast<float>(p.head_dim)));
  hn::StoreU(hn::Div(hn::Set(d4, 1.0f), hn::Sqrt(hn::Add(mean, hn::Set(d4, p.eps)))), d4, r);
}
#endif

// group_inverse_rms for rows of whole vectors (x86, head_dim a multiple of the lanes): the
// four sums reduced together and one vector square root and division for the four heads, and
// with AVX512-BF16 the bf16 squares summed by vdpbf16ps where eps >= 2^-100: the squares it
// flushes (each under 2^-126) then change mean + eps by less than half its ulp. Else
// group_inverse_rms.
template <class IO>
HWY_INLINE void group_inverse_rms_vector(df32 d, const rope_plan& p, const head_block& blk,
                                         const typename IO::storage* in, std::int64_t h0,
                                         float* r) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  if (lanes >= 4 && p.head_dim % lanes == 0) {
    const bool dot = p.eps >= 0x1p-100f;
    const std::int64_t heads = std::min(norm_group, blk.heads - h0);
    vf32 acc[norm_group];
    for (std::int64_t g = 0; g < norm_group; ++g) {
      std::int64_t j;
      acc[g] = g < heads ? squares_vector<IO>(d, in + (h0 + g) * blk.in_h, p.head_dim, dot, j)
                         : hn::Zero(d);
    }
    static_assert(norm_group == 4);
    store_inverse_rms4(d, p, acc, r);
    return;
  }
#endif
  group_inverse_rms<IO>(d, p, blk, in, h0, r);
}

// A token's angles with one block's RMSNorm weights folded in (fp32_once), held in registers
// across the block's heads: NV vectors of pairs (r/2 = NV lanes, NV = 1, 2, 4; with 32 vector
// registers the 4 NV of them leave room for the row), so that a row's only loads are its own
//     y_a = (x_a r) (wa ca) - (x_b r) (wb sa),   y_b = (x_b r) (wb cb) + (x_a r) (wa sb)
// two multiplies fewer per vector of pairs than x r w, and no angle or weight loads.
template <int NV>
struct folded_angles {
  static constexpr bool full = true;
  vf32 c[NV], s[NV], c2[NV], s2[NV];
  HWY_INLINE folded_angles(df32 d, const token_angles& a, const float* wa, const float* wb) {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    for (int v = 0; v < NV; ++v) folded_at(d, a, wa, wb, v * n, c[v], s[v], c2[v], s2[v]);
  }
  HWY_INLINE vf32 ca(int v) const { return c[v]; }
  HWY_INLINE vf32 sa(int v) const { return s[v]; }
  HWY_INLINE vf32 cb(int v) const { return c2[v]; }
  HWY_INLINE vf32 sb(int v) const { return s2[v]; }
};

// folded_angles in lane-pair order (bf16 halves with AVX512-BF16, NV even): each two vectors
// of a step put as their even lanes, then their odd ones, in registers
template <int NV>
struct folded_lane_pairs : folded_angles<NV> {
  HWY_INLINE folded_lane_pairs(df32 d, const token_angles& a, const float* wa, const float* wb)
      : folded_angles<NV>(d, a, wa, wb) {
#ifdef TILEROPE_LANE_PAIRS
    for (int v = 0; v < NV; v += 2) {
      for (vf32* x : {this->c, this->s, this->c2, this->s2}) to_lane_pairs(d, x[v], x[v + 1]);
    }
#endif
  }
};

// QK RMSNorm + RoPE (fp32_once) of one block of one token whose rows are NV whole vectors of
// pairs, through folded_angles held in registers; the sums in groups of four heads, each
// reduced on its own (reduced together as in norm_rotate_block, the held angles were spilled:
// f32 in cache 0.130 to 0.153 ns per element; bf16 decode 864-897 to 883-910 ns per call).
// Out of line: inlined there, its registers were spilled for 16-bit x. LanePairs: the rows in
// lane-pair order (bf16 halves with AVX512-BF16, NV even), as rope's held rows (Intel, decode:
// one thread, T = 1, 32 + 8 heads of 128, in place, median ns per call, five alternations:
// 831-876 to 802-815). Taking the next group's sums before this group's rotations measured
// even (826-831 against 829-862).
template <class IO, pairs PIn, pairs POut, int NV, bool LanePairs = false>
HWY_NOINLINE void norm_rotate_block_held(df32 d, const rope_plan& p, const head_block& blk,
                                         const typename IO::storage* in, typename IO::storage* out,
                                         const token_angles& a) {
  const std::int64_t half = p.rotary_dim / 2;
  using Folded = std::conditional_t<LanePairs, folded_lane_pairs<NV>, folded_angles<NV>>;
  const Folded f(d, a, blk.weight_a, blk.weight_b);
  float inv_rms[norm_group];
  for (std::int64_t hd = 0; hd < blk.heads; ++hd) {
    prefetch_row(in + hd * blk.in_h, p.head_dim, p.prefetch_bytes);
    if (hd % norm_group == 0) group_inverse_rms<IO>(d, p, blk, in, hd, inv_rms);
    const scaled_by r{hn::Set(d, inv_rms[hd % norm_group])};
    if constexpr (LanePairs) {
      rotate_row_lane_pairs<IO, NV>(d, in + hd * blk.in_h, out + hd * blk.out_h, f, half, r);
    } else {
      rotate_row_vectors<IO, PIn, POut, NV>(d, in + hd * blk.in_h, out + hd * blk.out_h, f, half,
                                            r);
    }
  }
}

// Where one block's QK RMSNorm sums ahead leave off for the next (norm_rotate_block_ahead):
// the block being taken (token, index in rope_plan::blocks) and the end of this
// thread's tokens, set by the caller; the block whose first groups' r are in inv_rms, and the
// ring slot of its first group, set by norm_rotate_block_ahead.
struct norm_stream {
  static constexpr std::int64_t ring = 3 * norm_group;
  std::int64_t token = 0, last = 0;
  int block = 0;
  std::int64_t ready_token = -1;
  int ready_block = -1;
  std::int64_t ready_slot = 0;
  HWY_ALIGN float inv_rms[ring];
};

#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
#define TILEROPE_NORM_SUMS_AHEAD 1
// QK RMSNorm's sums taken inside the rotation's loop: the rotation of row h also
// sums the squares of the row two groups on (its `ahead` row: h + 2 * norm_group in the block,
// past it the blocks that follow), a step at a time, so that the sums need no loop of their
// own and their latency has two groups of rows to hide in. A thread's first two groups' sums
// are taken first, in the same order, so that a row's r does not depend on where it is summed.
// Against norm_rotate_block's own loop of sums, one group ahead
// (AVX2, one thread, 32 + 8 heads of 128, in place, minimum ns per element over three
// alternations): in cache (T = 16) f32 0.216 to 0.183, bf16 0.281 to 0.252, f16 0.221 to
// 0.194; in memory (T = 8192) bf16 0.325 to 0.292-0.315. Taken one group ahead, bf16 in cache was
// 0.264; two rows rotated together (their angle and weight loads shared), or the four rows of
// a group summed in one loop, measured slower in memory (f32 0.43 against 0.36, and 0.48
// against 0.39): this machine streams one row at a time best.
// With AVX-512 the rows not held in registers take it too (16-bit and f32 rows of neither 1, 2
// nor 4 vectors of pairs: head dim 256), where they took norm_rotate_block's own loop, whose
// next group's sums read four rows in a burst at each group's start. Intel, bench --only
// qk-norm-rope, gemma3-4b, three alternations, medians, one / two threads: in place bf16 0.73 /
// 0.72 to 0.75 / 0.76 of the ceiling, f16 0.77 / 0.81 to 0.80 / 0.81, f32 0.86 / 0.92 to 0.92
// / 0.91; out of place bf16 0.88 / 0.86 to 0.96 / 0.91, f16 0.93 / 0.94 to 0.98 / 0.96, f32
// 1.04 / 1.15 to 1.09 / 1.10. Folding the weights into the angles once per block (as the bf16
// rows without AVX-512 do) measured even with AVX-512 (a loop calling the library, in memory)
// and slower with AVX2 for f16 at head dim 256 (bench, in place 0.81 / 0.82 to 0.75 / 0.77): a
// block of 4 or 8 heads of 256 folds 512 angles for few rows.
constexpr std::int64_t norm_groups_ahead = 2;

// `rows.rotate(x, y, r, ahead, s)` rotates one row with its r and, where `ahead` is not null,
// adds the squares of that row into s[0] and s[1]; `rows.squares(x, s)` adds a row's squares
// in the same order.
//
// The rows summed ahead run on past the block: the rotation of a block's last two groups sums
// the first groups of the blocks that follow it in this thread's tokens (q then k of each
// token, up to st.last), and their r wait in st.inv_rms for those blocks, which then take no
// sums of their own first. Taken per block, the first two groups' sums (8 rows) went alone and
// the last two groups' rotations without sums: Qwen3-8B's k block (8 heads) was all one and
// then all the other, and gemma3-4b's blocks (8 and 4 heads of 256) had no row summed ahead.
// AVX2 on Intel, bench --only qk-norm-rope, three alternations, one / two threads: gemma3-4b
// bf16 0.57 / 0.56 to 0.63 / 0.63 of the ceiling in place, 0.65 / 0.64 to 0.77 / 0.71 out of
// place; f16 0.66 / 0.66 to 0.76 / 0.74 and 0.76 / 0.76 to 0.85 / 0.84; f32 in place even
// (0.88 / 0.90 against 0.86 / 0.89), out of place 0.94 / 0.88 to 0.98 / 1.02; Qwen3-8B's rows
// within 0.02 either way.
template <class T, class Rows>
HWY_INLINE void norm_rotate_block_ahead(df32 d, const rope_plan& p, const head_block& blk,
                                        const T* in, T* out, const Rows& rows, norm_stream& st) {
  constexpr std::int64_t group = norm_group, ahead = norm_groups_ahead, slots = ahead + 1;
  static_assert(group == 4);  // store_inverse_rms4
  static_assert(slots * group <= norm_stream::ring);
  const std::int64_t heads = blk.heads, groups = (heads + group - 1) / group;
  // The rows of group g counted from this block's first (g >= groups: of the blocks after it
  // in the stream), `count` of them `stride` elements apart; null past the thread's tokens.
  auto group_rows = [&](std::int64_t g, std::int64_t& count, std::int64_t& stride) -> const T* {
    std::int64_t t = st.token;
    int k = st.block;
    const head_block* b = &blk;
    std::int64_t bg = groups;
    while (g >= bg) {
      g -= bg;
      if (++k == p.num_blocks) {
        k = 0;
        if (++t >= st.last) return nullptr;
      }
      b = &p.blocks[k];
      bg = (b->heads + group - 1) / group;
    }
    count = std::min(group, b->heads - g * group);
    stride = b->in_h;
    const T* first = b == &blk && t == st.token
                         ? in
                         : static_cast<const T*>(b->in) + t / p.seq * b->in_b + t % p.seq * b->in_s;
    return first + g * group * b->in_h;
  };
  // r of the stream's groups in a ring of `slots` groups; `base`: this block's first group's
  // slot
  const bool carried = st.ready_token == st.token && st.ready_block == st.block;
  const std::int64_t base = carried ? st.ready_slot : 0;
  auto slot = [&](std::int64_t g) { return (base + g) % slots * group; };
  vf32 sums[group];
  auto inverse_rms = [&](std::int64_t g) {  // group g's r from sums
    store_inverse_rms4(d, p, sums, st.inv_rms + slot(g));
  };
  if (!carried) {  // the first groups' sums, alone
    for (std::int64_t g = 0; g < ahead; ++g) {
      std::int64_t count = 0, stride = 0;
      const T* x = group_rows(g, count, stride);
      if (x == nullptr) break;
      for (std::int64_t k = 0; k < group; ++k) {
        vf32 s[2] = {hn::Zero(d), hn::Zero(d)};
        if (k < count) rows.squares(x + k * stride, s);
        sums[k] = hn::Add(s[0], s[1]);
      }
      inverse_rms(g);
    }
  }
  for (std::int64_t g = 0; g < groups; ++g) {
    std::int64_t count = 0, stride = 0;
    const T* later = group_rows(g + ahead, count, stride);  // the rows first read here
    for (std::int64_t k = 0; k < group; ++k) {
      const std::int64_t hd = g * group + k;
      const T* x_later = later != nullptr && k < count ? later + k * stride : nullptr;
      vf32 s[2] = {hn::Zero(d), hn::Zero(d)};
      if (hd < heads) {
        // Prefetched beyond row hd + 2 group (past the block's end, the next token's rows: the
        // same buffer's stream). Beyond row hd, 2048 bytes are the 2 * group rows already read
        // for bf16 and fewer for f32 (AVX2 on Intel, bench --only qk-norm-rope, Qwen3-8B in
        // place, one thread: bf16 0.58 to 0.69 of the ceiling, f32 0.68 to 0.89).
        prefetch_row(in + (hd + ahead * group) * blk.in_h, p.head_dim, p.prefetch_bytes);
        rows.rotate(in + hd * blk.in_h, out + hd * blk.out_h, st.inv_rms[slot(g) + k], x_later, s);
      } else if (x_later != nullptr) {  // a last group of fewer rows
        rows.squares(x_later, s);
      }
      sums[k] = hn::Add(s[0], s[1]);
    }
    if (later != nullptr) inverse_rms(g + ahead);
  }
  // the next block's first groups' r are in the ring (where it is among this thread's tokens)
  st.ready_token = st.block + 1 == p.num_blocks ? st.token + 1 : st.token;
  st.ready_block = st.block + 1 == p.num_blocks ? 0 : st.block + 1;
  st.ready_slot = (base + groups) % slots;
}

// x r w of each loaded vector of halves (as norm_rotate_row), and where `ahead` is set the
// squares of the same positions of that row added into s[0] (first halves) and s[1].
template <class IO>
struct normalised_summing_ahead {
  df32 d;
  vf32 r;
  const float* wa;
  const float* wb;
  const typename IO::storage* ahead;
  std::int64_t half;
  vf32* s;
  HWY_INLINE vf32 operator()(vf32 v, bool second, std::int64_t i) const {
    if (ahead != nullptr) {
      const vf32 a = IO::load(d, ahead + (second ? half + i : i));
      s[second] = hn::MulAdd(a, a, s[second]);
    }
    return normalised<IO, false>(d, v, r, second ? wb : wa, i);
  }
};

// Rows of halves that norm_rotate_row takes (f32; f16 rows of neither 1, 2 nor 4 vectors of
// pairs, and with AVX-512 such bf16 rows too), r/2 a multiple of the lanes: its loop with the
// sums ahead.
template <class IO, bool Full>
struct rows_ahead {
  using T = typename IO::storage;
  df32 d;
  const token_angles& a;
  const float* wa;
  const float* wb;
  std::int64_t half;
  HWY_INLINE void squares(const T* x, vf32* s) const {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    for (std::int64_t i = 0; i < half; i += n) {
      const vf32 xa = IO::load(d, x + i), xb = IO::load(d, x + half + i);
      s[0] = hn::MulAdd(xa, xa, s[0]);
      s[1] = hn::MulAdd(xb, xb, s[1]);
    }
  }
  HWY_INLINE void rotate(const T* x, T* y, float r, const T* ahead, vf32* s) const {
    vf32 t[2] = {s[0], s[1]};
    rotate_whole_vectors<IO, IO, pairs::halves, pairs::halves, false, Full>(
        d, x, y, a, half, normalised_summing_ahead<IO>{d, hn::Set(d, r), wa, wb, ahead, half, t});
    s[0] = t[0];
    s[1] = t[1];
  }
};

#ifdef TILEROPE_BF16_BLOCKS
// One step of a bf16 row of halves (pairs [i, i + 2n) of both halves), squared into s[0] and
// s[1] in block order.
HWY_INLINE void add_bf16_block_squares(df32 d, const std::uint16_t* x, std::int64_t i,
                                       std::int64_t half, vf32& s0, vf32& s1) {
  const du16_t d16;
  vf32 a0, a1, b0, b1;
  widen_bf16_blocks(d, hn::LoadU(d16, x + i), a0, a1);
  widen_bf16_blocks(d, hn::LoadU(d16, x + half + i), b0, b1);
  s0 = hn::MulAdd(b0, b0, hn::MulAdd(a0, a0, s0));
  s1 = hn::MulAdd(b1, b1, hn::MulAdd(a1, a1, s1));
}

// bf16 rows of halves through the folded angles in block order (rotate_row_bf16_blocks), r/2 a
// multiple of 2n: the sums ahead taken once per step. Where every folded angle is at most 2^100
// in magnitude (`bounded`) and a row's r is finite and positive, its steps skip their NaN test:
// x is then finite and |x_j r| is about sqrt(D) at most (x_j^2 is one term of the sum r is
// from), so no product or sum of the rotation is NaN or infinite (AVX2 on Intel, one thread,
// 32 + 8 heads of 128, bf16 in place, min ns per element, seven alternations: in cache
// 0.191-0.198 to 0.186-0.194, in memory 0.222-0.236 to 0.213-0.228).
template <class IO>
struct bf16_rows_ahead {
  df32 d;
  const token_angles& folded;
  std::int64_t half;
  bool bounded;
  HWY_INLINE void squares(const std::uint16_t* x, vf32* s) const {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    for (std::int64_t i = 0; i < half; i += 2 * n)
      add_bf16_block_squares(d, x, i, half, s[0], s[1]);
  }
  HWY_INLINE void rotate(const std::uint16_t* x, std::uint16_t* y, float r,
                         const std::uint16_t* ahead, vf32* s) const {
    if (bounded && r > 0.0f && r <= std::numeric_limits<float>::max()) {
      rotate_with<true>(x, y, r, ahead, s);
    } else {
      rotate_with<false>(x, y, r, ahead, s);
    }
  }
  template <bool NaNFree>
  HWY_INLINE void rotate_with(const std::uint16_t* x, std::uint16_t* y, float r,
                              const std::uint16_t* ahead, vf32* s) const {
    if (ahead == nullptr) {
      rotate_row_bf16_blocks<IO, true, pairs::halves, NaNFree>(d, x, y, folded, half,
                                                               scaled_by{hn::Set(d, r)});
      return;
    }
    vf32 s0 = s[0], s1 = s[1];
    rotate_row_bf16_blocks<IO, true, pairs::halves, NaNFree>(
        d, x, y, folded, half, scaled_by{hn::Set(d, r)},
        [&](std::int64_t i) { add_bf16_block_squares(d, ahead, i, half, s0, s1); });
    s[0] = s0;
    s[1] = s1;
  }
};
#endif  // TILEROPE_BF16_BLOCKS
#endif

// QK RMSNorm + RoPE of one block (q or k) of one token, in groups of four heads: first
// r = 1 / sqrt(mean(x^2) + eps) of each head of the group (independent sums, so their latency
// overlaps; one row at a time waited on each sum, then on the square root), then normalise
// and rotate each row in one pass over it. The next group's r are found before this group is
// rotated, so the rotations need not wait on a square root; with group_inverse_rms_vector
// (the four sums reduced together, bf16 squares by vdpbf16ps) that took bf16 in cache from
// 0.18 to 0.16 ns per element, f16 from 0.17 to 0.16 (one thread, 32 + 8 heads of 128). A
// group's rows are still in L1 when they are read again; taking the sums of a whole block
// (32 heads) first measured slower for f32 in memory (0.31 against 0.23 ns per element). Rows
// shorter than a vector of pairs go through h = x r w in fp32 scratch `h`. With fp32_once,
// rows of 1, 2 or 4 whole vectors of pairs and 32 vector registers take norm_rotate_block_held
// when x is f32 (in cache 0.18 to 0.135 ns per element), norm_rotate_row_vectors when x is
// 16-bit (any lane count). The other fp32_once rows of halves (every dim rotated, r/2 a multiple
// of the lanes) take their sums two groups ahead inside the rotation's loop instead
// (norm_rotate_block_ahead).
template <class IO, pairs PIn, pairs POut, bool HfRound>
HWY_INLINE void norm_rotate_block(df32 d, const rope_plan& p, const head_block& blk,
                                  const typename IO::storage* in, typename IO::storage* out,
                                  const token_angles& a, float* h, typename IO::storage* row_copy,
                                  [[maybe_unused]] norm_stream& st) {
  using T = typename IO::storage;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim, D = p.head_dim;
  constexpr std::int64_t group = norm_group;
  float inv_rms[2 * group];  // two groups' r: this one's and the next one's
  if constexpr (!HfRound) {
    // 16-bit x where the plan says (rope_plan::held_16bit_norm_rows: on Intel); on Zen 4 with
    // 16-bit x in place it measured slower (bf16 in cache 0.177 to 0.216 ns per element),
    // though faster out of place
    const bool held_x = sizeof(T) == 4 || p.held_16bit_norm_rows;
    const int held = held_x && lanes >= 16 && rotary == D ? held_vectors(half, lanes) : 0;
#ifdef TILEROPE_LANE_PAIRS
    if constexpr (takes_lane_pairs<IO, PIn, POut>()) {
      if (held == 4) return norm_rotate_block_held<IO, PIn, POut, 4, true>(d, p, blk, in, out, a);
      if (held == 2) return norm_rotate_block_held<IO, PIn, POut, 2, true>(d, p, blk, in, out, a);
    }
#endif
    if (held == 4) return norm_rotate_block_held<IO, PIn, POut, 4>(d, p, blk, in, out, a);
    if (held == 2) return norm_rotate_block_held<IO, PIn, POut, 2>(d, p, blk, in, out, a);
    if (held == 1) return norm_rotate_block_held<IO, PIn, POut, 1>(d, p, blk, in, out, a);
  }
  // 16-bit rows of whole vectors: the weights folded into the angles once per token and block
  [[maybe_unused]] HWY_ALIGN float folded_rows[4 * 4 * max_f32_lanes];
  [[maybe_unused]] token_angles folded = a;
  [[maybe_unused]] int held16 = 0;
  if constexpr (!HfRound && sizeof(T) == 2) {
    held16 = rotary == D ? held_vectors(half, lanes) : 0;
    if (held16 != 0) folded = fold_weights(d, a, blk.weight_a, blk.weight_b, half, folded_rows);
  }
  // bf16 halves without AVX-512: the folded angles in block order, a vector of bf16 at a time
  // (AVX2, one thread, in cache: 0.53 to 0.28 ns per element in place, 0.39 to 0.29 out of
  // place; bench --only qk-norm-rope, Qwen3-8B, two alternations: 0.29 to 0.39 of the ceiling
  // in place, 0.30 to 0.39 out of place, two threads 0.35 to 0.43 and 0.34 to 0.49)
  [[maybe_unused]] bool blocks16 = false;
#ifdef TILEROPE_BF16_BLOCKS
  if constexpr (!HfRound && PIn == pairs::halves && POut == pairs::halves) {
    blocks16 = held16 == 0 && takes_bf16_blocks<IO>(p, lanes);
    if (blocks16) {
      float* rows = angle_rows_scratch(p);
#ifdef TILEROPE_NORM_SUMS_AHEAD
      if constexpr (sizeof(T) == 2) {
        if (half % (2 * lanes) == 0) {
          bool bounded = false;
          folded = folded_in_block_order(d, a, blk.weight_a, blk.weight_b, half, rows, 0x1p100f,
                                         bounded);
          return norm_rotate_block_ahead(d, p, blk, in, out,
                                         bf16_rows_ahead<IO>{d, folded, half, bounded}, st);
        }
      }
#endif
      folded =
          block_ordered(d, fold_weights(d, a, blk.weight_a, blk.weight_b, half, rows), half, rows);
    }
  }
#endif
#ifdef TILEROPE_NORM_SUMS_AHEAD
  if constexpr (!HfRound && PIn == pairs::halves && POut == pairs::halves) {
    if (!blocks16 && held16 == 0 && rotary == D && half % lanes == 0) {
      if (a.full) {
        return norm_rotate_block_ahead(
            d, p, blk, in, out, rows_ahead<IO, true>{d, a, blk.weight_a, blk.weight_b, half}, st);
      }
      return norm_rotate_block_ahead(
          d, p, blk, in, out, rows_ahead<IO, false>{d, a, blk.weight_a, blk.weight_b, half}, st);
    }
  }
#endif
  for (std::int64_t hd = 0; hd < blk.heads; ++hd) {
    if (hd % group == 0) {  // this group's r found one group ahead, the next group's now
      if (hd == 0) group_inverse_rms_vector<IO>(d, p, blk, in, 0, inv_rms);
      if (hd + group < blk.heads) {
        group_inverse_rms_vector<IO>(d, p, blk, in, hd + group,
                                     inv_rms + (hd / group + 1) % 2 * group);
      }
    }
    const T* x = in + hd * blk.in_h;
    T* y = out + hd * blk.out_h;
    // The rows first read at a group's start are the next group's: prefetched beyond the
    // last of them, 2 group - 1 rows on (beyond row hd, 2048 bytes reached only rows already
    // read where a row is 512 bytes or more)
    prefetch_row(x + (2 * group - 1) * blk.in_h, D, p.prefetch_bytes);
    const float r = inv_rms[hd / group % 2 * group + hd % group];
    auto normalised1 = [&](std::int64_t j) {  // x r w of element j, scalar
      float n = IO::load1(x + j) * r;
      if constexpr (HfRound) n = round_to(p.x_type, n);
      const float hw = n * blk.weight[j];
      return HfRound ? round_to(p.x_type, hw) : hw;
    };
    for (std::int64_t j = rotary; j < D; ++j) IO::store1(normalised1(j), y + j);  // pass dims
    if (half < lanes) {
      for (std::int64_t j = 0; j < rotary; ++j) h[j] = normalised1(j);
      rotate_row<f32_io, IO, PIn, POut, HfRound>(d, h, y, a, half);
      continue;
    }
#ifdef TILEROPE_BF16_BLOCKS
    if constexpr (!HfRound && sizeof(T) == 2 && PIn == pairs::halves && POut == pairs::halves) {
      if (blocks16) {
        rotate_row_bf16_blocks<IO, true>(d, x, y, folded, half, scaled_by{hn::Set(d, r)});
        continue;
      }
    }
#endif
    if constexpr (!HfRound && sizeof(T) == 2) {
      switch (held16) {
        case 1:
          norm_rotate_row_vectors<IO, PIn, POut, 1>(d, x, y, folded, half, r);
          continue;
        case 2:
          norm_rotate_row_vectors<IO, PIn, POut, 2>(d, x, y, folded, half, r);
          continue;
        case 4:
          norm_rotate_row_vectors<IO, PIn, POut, 4>(d, x, y, folded, half, r);
          continue;
        default:
          break;
      }
    }
    x = readable_row<PIn, POut>(x, y, row_copy, rotary);
    if (a.full) {
      norm_rotate_row<IO, PIn, POut, HfRound, true>(d, x, y, a, half, r, blk.weight_a,
                                                    blk.weight_b);
    } else {
      norm_rotate_row<IO, PIn, POut, HfRound, false>(d, x, y, a, half, r, blk.weight_a,
                                                     blk.weight_b);
    }
  }
}

template <class IO, pairs PIn, pairs POut, bool HfRound>
void qk_norm_tokens_loop(const rope_plan& p, std::int64_t first, std::int64_t last) {
  using T = typename IO::storage;
  const df32 d;
  float* scratch = thread_scratch(p);
  float* h = scratch + 2 * p.rotary_dim;
  T* row_copy = reinterpret_cast<T*>(h + p.head_dim);
  norm_stream st;
  st.last = last;
  for_each_block<T>(p, first, last, scratch,
                    [&](std::int64_t b, std::int64_t s, const token_angles& a,
                        const head_block& blk, const T* in, T* out) {
                      st.token = b * p.seq + s;
                      st.block = static_cast<int>(&blk - p.blocks);
                      norm_rotate_block<IO, PIn, POut, HfRound>(d, p, blk, in, out, a, h, row_copy,
                                                                st);
                    });
}

// dw[j] += t[j] over n elements, fp32 terms into the fp64 weight gradient; Scaled: each term
// times scale[j] in fp64. Where n is a constant of whole vectors (the held backward), GCC 12
// warns of the scalar tail that never runs (-Waggressive-loop-optimizations); the tail written
// from n - n % lanes instead gives no warning, but the held backward's code changed with it
// (a lea per vector of dw) and bf16 in place read slower in every alternation measured (bench
// --only qk-norm-rope-bwd, two threads, medians: 0.799 against 0.756, 0.793 against 0.779),
// so the warning is silenced here instead.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"
template <bool Scaled = false>
HWY_INLINE void add_into_f64(const float* t, double* dw, std::int64_t n,
                             const double* scale = nullptr) {
  std::int64_t j = 0;
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(dd));
  for (; j + lanes <= n; j += lanes) {
    auto term = hn::PromoteTo(dd, hn::LoadU(dh, t + j));
    if constexpr (Scaled) term = hn::Mul(term, hn::LoadU(dd, scale + j));
    hn::StoreU(hn::Add(hn::LoadU(dd, dw + j), term), dd, dw + j);
  }
#endif
  for (; j < n; ++j) dw[j] += static_cast<double>(t[j]) * (Scaled ? scale[j] : 1.0);
}
#pragma GCC diagnostic pop

// The token's angles with the block's weights folded in, for the backward's held rows: the
// rows wa ca, wa sa (the first element of each pair), wb cb, wb sb (the second), r/2 floats
// each, one after another in `rows`, in whatever order `a`, wa and wb are in.
HWY_INLINE token_angles weighted_angles(df32 d, const token_angles& a, const float* wa,
                                        const float* wb, std::int64_t half, float* rows) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t i = 0; i < half; i += n) {
    const vf32 va = hn::LoadU(d, wa + i), vb = hn::LoadU(d, wb + i);
    hn::StoreU(hn::Mul(va, hn::LoadU(d, a.ca + i)), d, rows + i);
    hn::StoreU(hn::Mul(va, hn::LoadU(d, a.sa + i)), d, rows + half + i);
    hn::StoreU(hn::Mul(vb, hn::LoadU(d, a.cb + i)), d, rows + 2 * half + i);
    hn::StoreU(hn::Mul(vb, hn::LoadU(d, a.sb + i)), d, rows + 3 * half + i);
  }
  return token_angles{rows, rows + half, rows + 2 * half, rows + 3 * half, true};
}

// A block's rows of tokens [first, last) in order, token by token, as the backward's kernels
// over runs take them: next(on_token) gives the next row's g, x and dx, calling on_token(b, s)
// first where the row is its token's first.
template <class T>
struct run_rows {
  struct row {
    const T* g;
    const T* x;
    T* dx;
  };
  const rope_plan& p;
  const head_block& blk;
  std::int64_t t, h = 0;  // the next row's token and head
  const T *g = nullptr, *x = nullptr;
  T* dx = nullptr;  // token t's first rows
  template <class OnToken>
  HWY_INLINE row next(OnToken&& on_token) {
    if (h == 0) {
      const std::int64_t b = t / p.seq, s = t % p.seq;
      g = static_cast<const T*>(blk.in) + b * blk.in_b + s * blk.in_s;
      x = static_cast<const T*>(blk.x) + b * blk.x_b + s * blk.x_s;
      dx = static_cast<T*>(blk.out) + b * blk.out_b + s * blk.out_s;
      on_token(b, s);
    }
    const row r{g + h * blk.in_h, x + h * blk.x_h, dx + h * blk.out_h};
    if (++h == blk.heads) h = 0, ++t;
    return r;
  }
};

// Scratch of the backward's held rows (norm_backward_run_held), per thread.
struct held_scratch {
  float* token;     // angles_for's scratch
  float* ordered;   // [4 r/2] the token's angles in lane-pair order
  const float* wa;  // the block's weights of the pairs' first elements (r/2) and
  const float* wb;  //   of their second, in the rows' order
  float* angles;    // [4 r/2] the token's weighted angles (weighted_angles)
  float* staged;    // [3 D] q of the rows in flight
  float* tdw;       // [D] the run's dw terms
};

// Token (b, s)'s angles (`given`, else angles_for's) with the block's weights folded in, into
// sc.angles (weighted_angles), in lane-pair order with LanePairs: out of line, one copy for
// every held kernel.
template <bool LanePairs>
HWY_NOINLINE void weigh_token_angles(df32 d, const rope_plan& p, std::int64_t b, std::int64_t s,
                                     const token_angles* given, const held_scratch& sc) {
  token_angles a = given != nullptr ? *given : angles_for(p, b, s, sc.token);
#ifdef TILEROPE_LANE_PAIRS
  if constexpr (LanePairs) a = lane_pair_angles(d, a, p.rotary_dim / 2, sc.ordered);
#endif
  weighted_angles(d, a, sc.wa, sc.wb, p.rotary_dim / 2, sc.angles);
}

// Backward of QK RMSNorm + RoPE for one block of a run of tokens [first, last) whose rows are NV
// whole vectors of pairs, every dim rotated (32 vector registers: AVX-512 at head dims 32, 64, 128
// and 256), in two passes over each row with the row's r and coef between them. The weights are
// folded into the angles (w cos and w sin: weighted_angles), so a row's rotation gives q = w dh = w
// rope_backward(g) directly:
//     sums:   q (staged in fp32, in L1),  r = 1 / sqrt(x.x / D + eps),  coef = r^3 q.x / D
//     apply:  x read again (from L1),  dx = r q - coef x,  dw' += (r q) x
// and the block's dw' over the run's rows becomes dw = dw' / w in fp64
// (blk.inverse_weight, set where every weight folds: see head_block). A vector of pairs takes
// 14 vector operations where there were 18 (the dot one FMA a half instead of a multiply and
// an FMA; the apply three a half: r q, dw', and dx as one FNMA on r q), and 4 angle loads
// where there were 2 (4 with full rows) and 4 weight loads. Intel, one thread, 32 + 8 heads of
// 128 in place in L2 (T = 8), min ns per element, four processes each: bf16 0.274-0.300 to
// 0.254-0.273, f16 0.254-0.263 to 0.239-0.240, f32 0.269-0.277 to 0.249-0.255; bench --only
// qk-norm-rope-bwd, four alternations, in place, one / two threads: bf16 0.806 / 0.723 to
// 0.821 / 0.738 of the ceiling, f16 0.818 / 0.742 to 0.854 / 0.767, f32 0.875 / 0.797 to
// 0.904 / 0.843.
// The sums run `ahead` = 2 rows before the apply, in the same pass over the heads: row h's sums
// are taken just before row h - 2 is applied, so the chain from a row's loads to its r and coef
// (two sums, their lane reductions, a square root and a division) overlaps other rows' work. Each
// row applied as soon as its own sums were done (its dh and x held in registers), the work waiting
// on that chain filled the scheduler and rows barely overlapped. The dw terms stay in registers
// across the run's rows. Intel, one thread, 32 + 8 heads of 128, in place, min ns per element:
// bf16 in L2 (T = 8) 0.274-0.288 to 0.221-0.224 (with LanePairs; f32 and f16 even); bench --only
// qk-norm-rope-bwd, Qwen3-8B, two alternations, bf16 0.74 / 0.68 to 0.79 / 0.75 of the ceiling at
// one / two threads in place, 0.70 / 0.66 to 0.80 / 0.76 out of place, f32 and f16 within the
// spread.
// The rows are those of a run of tokens (block_run, q's and then k's, as
// for_each_block_in_runs takes them), token by token, and the sums run on across the tokens: a
// token's first two rows are summed while the token before it ends (its weighted angles found
// as its first row is summed: weigh_token_angles), and the dw terms go into fp64 once a run.
// Taken one token at a time, a block's first two rows were summed alone and its last two
// applied alone, and each token added its terms into fp64: a quarter to a third of the rows of
// gemma3-4b's blocks (8 and 4 heads of 256) went without the overlap. Intel, one thread,
// 8 + 4 heads of 256, in place, min ns per element: in memory (T = 8192) bf16 0.387-0.409 to
// 0.341-0.350, f16 0.372-0.377 to 0.327-0.331, f32 0.618-0.637 to 0.603-0.614; in cache (T =
// 16) bf16 0.328-0.329 to 0.270-0.288, f16 0.249-0.264 to 0.216-0.234. bench --only
// qk-norm-rope-bwd, four alternations, medians, one / two threads: gemma3-4b in place bf16
// 0.712 / 0.652 to 0.774 / 0.748 of the ceiling, f16 0.711 / 0.701 to 0.793 / 0.798, f32
// 0.873 / 0.832 to 0.895 / 0.891; out of place bf16 0.689 / 0.653 to 0.785 / 0.761, f16 0.701
// / 0.686 to 0.803 / 0.814, f32 0.821 / 0.809 to 0.914 / 0.910; Qwen3-8B within -0.016 (f32 in
// place) to +0.035 (bf16 in place, two threads). Runs of 4 and of 64 tokens measured no better.
// LanePairs (bf16 halves with AVX512-BF16, NV even): the rows, and the angles, in lane-pair
// order.
template <class IO, pairs PIn, pairs POut, int NV, bool LanePairs = false>
HWY_NOINLINE void norm_backward_run_held(df32 d, const rope_plan& p, const head_block& blk,
                                         std::int64_t first, std::int64_t last,
                                         const token_angles* given, const held_scratch& sc,
                                         int chunk) {
  using T = typename IO::storage;
  // f16 halves two vectors a step, stored a line at a time (bench --only qk-norm-rope-bwd, two
  // alternations: out of place 0.76 / 0.70 to 0.79 / 0.76 of the ceiling, in place even)
  constexpr bool Wide = !LanePairs && std::is_same_v<typename IO::plain, f16_io> &&
                        PIn == pairs::halves && POut == pairs::halves && NV % 2 == 0;
  constexpr int S = LanePairs || Wide ? 2 : 1;  // vectors of pairs a load step takes
  static_assert(NV % S == 0);
  constexpr std::int64_t ahead = 2;  // rows whose sums run before the row applied
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  // r/2 = NV n and D = r (constants where the lanes are: one pointer and fixed offsets reach
  // the four angle rows, the staged rows and a row's second half)
  const std::int64_t half = NV * n, D = 2 * half, heads = blk.heads;
  const float inv_d = 1.0f / static_cast<float>(D);
  const float* angles = sc.angles;
  // angle row k (w_a cos, w_a sin, w_b cos, w_b sin) at vector v
  auto angle = [&](int k, int v) { return in_register(hn::LoadU(d, angles + k * half + v * n)); };
  // the rows in the order the sums reach them; a token's weighted angles found as its first is
  run_rows<T> cursor{p, blk, first};
  // q and x of one step of a row (S vectors of pairs from vector v0)
  auto load_step = [&](const T* g, const T* x, int v0, vf32* qa, vf32* qb, vf32* xa, vf32* xb)
                       TILEROPE_INLINE_LAMBDA {
                         vf32 ga[S], gb[S];
                         load_pairs_step<IO, PIn, LanePairs, Wide>(d, g, v0 * n, half, ga, gb);
                         load_pairs_step<IO, POut, LanePairs, Wide>(d, x, v0 * n, half, xa, xb);
                         for (int k = 0; k < S; ++k) {
                           const int v = v0 + k;
                           qa[k] = hn::MulSub(ga[k], angle(0, v), hn::Mul(gb[k], angle(1, v)));
                           qb[k] = hn::MulAdd(gb[k], angle(2, v), hn::Mul(ga[k], angle(3, v)));
                         }
                       };
  const hn::CappedTag<float, 1> d1;
  // of the rows in flight, by slot (row number mod ahead + 1): r, coef, x and dx
  float r_of[ahead + 1], coef_of[ahead + 1];
  const T* x_of[ahead + 1];
  T* dx_of[ahead + 1];
  // q of the rows in flight, in fp32 (first elements, then second), by slot
  auto q_of = [&](int slot) { return sc.staged + slot * D; };
  auto sums = [&](int slot) TILEROPE_INLINE_LAMBDA {
    const auto row = cursor.next([&](std::int64_t b, std::int64_t s) {
      weigh_token_angles<LanePairs>(d, p, b, s, given, sc);
    });
    const T *g = row.g, *x = row.x;
    x_of[slot] = x;
    dx_of[slot] = row.dx;
    float* q = q_of(slot);
    prefetch_row(g, D, p.prefetch_bytes);
    prefetch_row(x, D, p.prefetch_bytes);
    // two accumulators each (the pairs' first and second elements): a shorter chain
    vf32 sqa = hn::Zero(d), sqb = hn::Zero(d), dota = hn::Zero(d), dotb = hn::Zero(d);
    for (int v0 = 0; v0 < NV; v0 += S) {
      vf32 qa[S], qb[S], xa[S], xb[S];
      load_step(g, x, v0, qa, qb, xa, xb);
      for (int k = 0; k < S; ++k) {
        const int v = v0 + k;
        hn::StoreU(qa[k], d, q + v * n);
        hn::StoreU(qb[k], d, q + half + v * n);
        sqa = hn::MulAdd(xa[k], xa[k], sqa);
        sqb = hn::MulAdd(xb[k], xb[k], sqb);
        dota = hn::MulAdd(qa[k], xa[k], dota);
        dotb = hn::MulAdd(qb[k], xb[k], dotb);
      }
    }
    const auto mean_sq =
        hn::Mul(hn::Set(d1, hn::GetLane(hn::SumOfLanes(d, hn::Add(sqa, sqb)))), hn::Set(d1, inv_d));
    const float r =
        hn::GetLane(hn::Div(hn::Set(d1, 1.0f), hn::Sqrt(hn::Add(mean_sq, hn::Set(d1, p.eps)))));
    const float dot_d = hn::GetLane(hn::SumOfLanes(d, hn::Add(dota, dotb))) * inv_d;
    r_of[slot] = r;
    coef_of[slot] = (r * r) * (r * dot_d);
  };
  vf32 dwa[NV], dwb[NV];  // dw' (w dw) of the pairs' first and second elements
  for (int v = 0; v < NV; ++v) dwa[v] = dwb[v] = hn::Zero(d);
  const std::int64_t rows = (last - first) * heads;
  for (std::int64_t m = 0; m < std::min(ahead, rows); ++m) sums(static_cast<int>(m));
  int slot = 0, slot_ahead = static_cast<int>(ahead);  // of rows m and m + ahead
  for (std::int64_t m = 0; m < rows; ++m) {
    if (m + ahead < rows) sums(slot_ahead);
    const vf32 rv = hn::Set(d, r_of[slot]), cv = hn::Set(d, coef_of[slot]);
    const T* x = x_of[slot];
    const float* q = q_of(slot);
    T* dx = dx_of[slot];
    slot = slot == ahead ? 0 : slot + 1;
    slot_ahead = slot_ahead == ahead ? 0 : slot_ahead + 1;
    for (int v0 = 0; v0 < NV; v0 += S) {
      vf32 xa[S], xb[S], ya[S], yb[S];
      load_pairs_step<IO, POut, LanePairs, Wide>(d, x, v0 * n, half, xa, xb);
      for (int k = 0; k < S; ++k) {
        const int v = v0 + k;
        // r q once: dw' += (r q) x,  dx = r q - coef x
        const vf32 qra = hn::Mul(hn::LoadU(d, q + v * n), rv);
        const vf32 qrb = hn::Mul(hn::LoadU(d, q + half + v * n), rv);
        dwa[v] = hn::MulAdd(qra, xa[k], dwa[v]);
        dwb[v] = hn::MulAdd(qrb, xb[k], dwb[v]);
        ya[k] = hn::NegMulAdd(cv, xa[k], qra);
        yb[k] = hn::NegMulAdd(cv, xb[k], qrb);
      }
      store_pairs_step<IO, POut, LanePairs, Wide>(d, ya, yb, dx, v0 * n, half);
    }
  }
  // the run's rows, summed, in the weight's element order, divided by w
  float* tdw = sc.tdw;
  for (int v = 0; v < NV; v += S) {
    if constexpr (LanePairs) {
      hn::StoreInterleaved2(dwa[v], dwa[v + 1], d, tdw + v * n);
      hn::StoreInterleaved2(dwb[v], dwb[v + 1], d, tdw + half + v * n);
    } else {
      for (int k = 0; k < S; ++k) {
        store_pair<f32_io, POut>(d, dwa[v + k], dwb[v + k], tdw, (v + k) * n, half);
      }
    }
  }
  add_into_f64<true>(tdw, blk.weight_grad + chunk * D, D, blk.inverse_weight);
}

// r = 1 / sqrt(sum(sq) / D + eps) and coef = r^3 sum(dot) / D of four heads from their vectors
// of sums, into r[0, 4) and coef[0, 4): one vector square root and division on x86.
HWY_INLINE void inverse_rms_and_coef4(df32 d, const rope_plan& p, const vf32* sq, const vf32* dot,
                                      float* r, float* coef) {
  const float inv_d = 1.0f / static_cast<float>(p.head_dim);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
  static_assert(norm_group == 4);
  const hn::Full128<float> d4;
  store_inverse_rms4(d, p, sq, r);
  const auto rv = hn::Load(d4, r);
  const auto dots = lane_sums4(d, dot[0], dot[1], dot[2], dot[3]);
  hn::Store(hn::Mul(hn::Mul(hn::Mul(rv, rv), rv), hn::Mul(dots, hn::Set(d4, inv_d))), d4, coef);
#else
  for (std::int64_t k = 0; k < norm_group; ++k) {
    r[k] = 1.0f / std::sqrt(hn::GetLane(hn::SumOfLanes(d, sq[k])) * inv_d + p.eps);
    coef[k] = r[k] * r[k] * r[k] * inv_d * hn::GetLane(hn::SumOfLanes(d, dot[k]));
  }
#endif
}

// The angles the backward's sums take for token (b, s) (`given`, else angles_for's): with
// Weighted the block's weights wa, wb folded in, with Blocks in block order, into `ordered`
// (4 r/2) where either; out of line, one copy for every kernel of rows summed ahead.
template <bool Blocks, bool Weighted>
HWY_NOINLINE token_angles ahead_token_angles(df32 d, const rope_plan& p, std::int64_t b,
                                             std::int64_t s, const token_angles* given,
                                             float* token_scratch, const float* wa, const float* wb,
                                             float* ordered) {
  const std::int64_t half = p.rotary_dim / 2;
  token_angles a = given != nullptr ? *given : angles_for(p, b, s, token_scratch);
  if constexpr (Weighted) a = weighted_angles(d, a, wa, wb, half, ordered);
#if TILEROPE_BF16_BLOCKS
  if constexpr (Blocks) a = block_ordered(d, a, half, ordered);  // Weighted: in place
#endif
  return a;
}

// Backward of QK RMSNorm + RoPE for one block of a run of tokens [first, last) whose rows are
// whole vectors of pairs, every dim rotated, where a row does not fit in the registers (16 vector
// registers, or r/2 over 4 vectors). In groups of four heads, a row takes two passes:
//     sums:  dh = rope_backward(g) (staged in fp32, in pair order), x.x, (w dh).x
//     apply: dx = r w dh - coef x (x read again, from cache),  dw += r dh x (in pair order)
// and the sums of the next group's row go in the same loop as each row's apply, so that the
// loads from memory overlap the arithmetic of the row before (the run's first group's sums go
// alone). The two accumulators each, and one vector square root and division per group, replace the
// staged path's single accumulators, whose latency bound its loop. With AVX2, one thread,
// 32 + 8 heads of 128, in place, ns per element: in L2 (T = 8) f32 0.52 to 0.35, f16 0.50 to
// 0.34; in memory (T = 8192) f32 0.69 to 0.60, bf16 0.65 to 0.52, f16 0.50 to 0.38 (out of
// place f32 0.84 to 0.77, bf16 0.67 to 0.56). The two passes without the overlap took 0.66 for
// f32 in memory: the sums alone 0.49 (two streams read at 16 GB/s) and the apply alone 0.55.
// Blocks (bf16 halves with AVX2 and SSE4): 2n pairs a step, a vector of bf16 at a time in block
// order (widen_bf16_blocks, narrow_bf16_blocks: one NaN test and the u16 rounding for two
// vectors), the angles put in block order once per token, the weights once per run, and the
// dw terms put back at the run's end; bf16 in memory 0.53 to 0.47, in L2 0.49-0.62 to 0.43-0.48.
// Weighted (the block's weights fold: blk.inverse_weight), as the held rows: the rotation takes
// the weights folded into the angles (weighted_angles), so it gives q = w dh, the dot is one FMA
// a vector, the apply takes r q once (dx = r q - coef x, dw' += (r q) x) and the block's dw' is
// divided by w in fp64: 14 vector operations a vector of pairs where there were 20, and no
// weight loads. Intel with AVX2 (TILEROPE_CPU_TARGET=avx2), one thread, 32 + 8 heads of 128, min
// ns per element of each alternation (three for bf16 in L2, two for the rest): in L2 (T = 32, in
// place) bf16 0.330-0.332 to 0.310-0.311, f16 0.270-0.271 to 0.230-0.231, f32 0.297-0.300 to
// 0.274-0.288; in memory (T = 8192) bf16 in place 0.419-0.434 to 0.393-0.403, out of place
// 0.526-0.527 to 0.512-0.516. bench --only qk-norm-rope-bwd there, five alternations, one / two
// threads: in place bf16 0.546 / 0.524 to 0.578 / 0.541, f16 0.611 / 0.598 to 0.656 / 0.612, f32
// 0.732 / 0.721 to 0.767 / 0.751; out of place within 0.01.
// The rows are those of a run of tokens, as for the held rows (norm_backward_run_held): the
// groups of four are the run's rows four at a time, across its tokens, a token's angles found
// as the sums reach its first row (ahead_token_angles), and the dw terms go into fp64 once a
// run. Taken a token at a time, each block's first group was summed alone and its last applied
// alone: half the rows of Qwen3-8B's k block (8 heads), all of gemma3-4b's k block (4 heads).
// Intel with AVX2, one thread, in place, T = 8192, min ns per element of two alternations:
// gemma3-4b (8 + 4 heads of 256) bf16 0.474-0.504 to 0.461-0.464, f16 0.435-0.447 to
// 0.374-0.381, f32 0.747-0.754 to 0.663-0.687; Qwen3-8B bf16 0.444-0.449 to 0.422-0.434, f16
// 0.371-0.373 to 0.344-0.347, f32 0.597-0.605 to 0.580-0.598. bench --only qk-norm-rope-bwd
// there, three alternations, medians, one / two threads: Qwen3-8B in place bf16 0.621 / 0.611
// to 0.656 / 0.665 of the ceiling, f16 0.738 / 0.722 to 0.788 / 0.789, f32 0.834 / 0.825 to
// 0.872 / 0.888; out of place bf16 0.592 / 0.597 to 0.665 / 0.667, f16 0.682 / 0.662 to 0.736 /
// 0.738, f32 0.801 / 0.789 to 0.847 / 0.859; gemma3-4b 0.06 to 0.12 higher in every row.
template <class IO, pairs PIn, pairs POut, bool Full, bool Blocks = false, bool Weighted = false>
HWY_NOINLINE void norm_backward_run_ahead(df32 d, const rope_plan& p, const head_block& blk,
                                          std::int64_t first, std::int64_t last,
                                          const token_angles* given, float* token_scratch,
                                          float* rows, int chunk) {
  static_assert(!Weighted || Full);  // the folded angles are four rows
  using T = typename IO::storage;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t half = p.rotary_dim / 2, D = p.head_dim, heads = blk.heads;
  constexpr std::int64_t group = norm_group;
  float* tdw = rows + 2 * group * D;  // [D]: dw of the pairs' first, then second elements
  float* tdw_out = tdw + D;           // [D]: dw in the weight's element order
  std::fill(tdw, tdw + D, 0.0f);
  // pointers held in registers (the vector stores may alias the structs that hold them); with
  // Blocks the angles and weights in block order, after tdw_out
  const float *wa = blk.weight_a, *wb = blk.weight_b;
  token_angles angles;           // of the token whose rows are summed
  float* ordered = tdw_out + D;  // [4 r/2] angles (Weighted: w cos, w sin), [2 r/2] weights
#if TILEROPE_BF16_BLOCKS
  if constexpr (Blocks && !Weighted) {
    const token_angles w = block_ordered(d, token_angles{wa, wb, wa, wb}, half, ordered + 2 * D);
    wa = w.ca;
    wb = w.sa;
  }
#endif
  // the rows in the order the sums reach them; a token's angles found as its first is
  run_rows<T> cursor{p, blk, first};
  // of the rows in flight (this group's and the next one's), by slot (row number mod 2 group)
  const T* g_of[2 * group];
  const T* x_of[2 * group];
  T* dx_of[2 * group];
  // the next row the sums reach, into `slot`
  auto next_row = [&](std::int64_t slot) TILEROPE_INLINE_LAMBDA {
    const auto row = cursor.next([&](std::int64_t b, std::int64_t s) {
      angles = ahead_token_angles<Blocks, Weighted>(d, p, b, s, given, token_scratch, blk.weight_a,
                                                    blk.weight_b, ordered);
    });
    g_of[slot] = row.g;
    x_of[slot] = row.x;
    dx_of[slot] = row.dx;
  };
  // dh of the row in `slot` in rows[slot D, ...)
  auto dh_of = [&](std::int64_t slot) { return rows + slot * D; };
  vf32 sq_of[group], dot_of[group];               // the sums' vectors of the group ahead
  alignas(16) float r_of[group], coef_of[group];  // r and coef of the group applied
  struct sums {                                   // one row's sums as they go
    vf32 sqa, sqb, dota, dotb;
  };
  // one vector of pairs at frequency i, loaded: dh staged and the sums
  auto sum_vectors = [&](vf32 ga, vf32 gb, vf32 xa, vf32 xb, float* dh, std::int64_t i, sums& s)
                         TILEROPE_INLINE_LAMBDA {
                           vf32 dha, dhb;  // Weighted: q = w dh
                           rotate_vectors<f32_io, false, Full>(d, ga, gb, i, angles, dha, dhb);
                           hn::StoreU(dha, d, dh + i);
                           hn::StoreU(dhb, d, dh + half + i);
                           s.sqa = hn::MulAdd(xa, xa, s.sqa);
                           s.sqb = hn::MulAdd(xb, xb, s.sqb);
                           if constexpr (Weighted) {
                             s.dota = hn::MulAdd(dha, xa, s.dota);
                             s.dotb = hn::MulAdd(dhb, xb, s.dotb);
                           } else {
                             s.dota = hn::MulAdd(hn::Mul(hn::LoadU(d, wa + i), dha), xa, s.dota);
                             s.dotb = hn::MulAdd(hn::Mul(hn::LoadU(d, wb + i), dhb), xb, s.dotb);
                           }
                         };
  // dx of one vector of pairs at frequency i into (ya, yb), and its dw terms
  auto apply_vectors = [&](vf32 xa, vf32 xb, const float* dh, vf32 rv, vf32 cv, std::int64_t i,
                           vf32& ya, vf32& yb) TILEROPE_INLINE_LAMBDA {
    const vf32 dha = hn::LoadU(d, dh + i), dhb = hn::LoadU(d, dh + half + i);
    if constexpr (Weighted) {  // r q once: dw' += (r q) x,  dx = r q - coef x
      const vf32 qra = hn::Mul(dha, rv), qrb = hn::Mul(dhb, rv);
      ya = hn::NegMulAdd(cv, xa, qra);
      yb = hn::NegMulAdd(cv, xb, qrb);
      hn::StoreU(hn::MulAdd(qra, xa, hn::LoadU(d, tdw + i)), d, tdw + i);
      hn::StoreU(hn::MulAdd(qrb, xb, hn::LoadU(d, tdw + half + i)), d, tdw + half + i);
      return;
    }
    ya = hn::MulSub(rv, hn::Mul(hn::LoadU(d, wa + i), dha), hn::Mul(cv, xa));
    yb = hn::MulSub(rv, hn::Mul(hn::LoadU(d, wb + i), dhb), hn::Mul(cv, xb));
    hn::StoreU(hn::MulAdd(hn::Mul(dha, xa), rv, hn::LoadU(d, tdw + i)), d, tdw + i);
    hn::StoreU(hn::MulAdd(hn::Mul(dhb, xb), rv, hn::LoadU(d, tdw + half + i)), d, tdw + half + i);
  };
#if TILEROPE_BF16_BLOCKS
  const du16_t d16;
  const hn::Half<du16_t> dh16;  // n lanes
  // a step of 2n pairs of bf16 halves, in block order
  auto widen = [&](const auto* x, std::int64_t i, vf32& a0, vf32& a1, vf32& b0, vf32& b1)
                   TILEROPE_INLINE_LAMBDA {
                     widen_bf16_blocks(d, hn::LoadU(d16, x + i), a0, a1);
                     widen_bf16_blocks(d, hn::LoadU(d16, x + half + i), b0, b1);
                   };
#endif
  auto sum_step = [&](const T* g, const T* x, float* dh, std::int64_t i, sums& s)
                      TILEROPE_INLINE_LAMBDA {
#if TILEROPE_BF16_BLOCKS
                        if constexpr (Blocks) {
                          vf32 ga0, ga1, gb0, gb1, xa0, xa1, xb0, xb1;
                          widen(g, i, ga0, ga1, gb0, gb1);
                          widen(x, i, xa0, xa1, xb0, xb1);
                          sum_vectors(ga0, gb0, xa0, xb0, dh, i, s);
                          sum_vectors(ga1, gb1, xa1, xb1, dh, i + n, s);
                          return;
                        }
#endif
                        vf32 ga, gb, xa, xb;
                        load_pair<IO, PIn>(d, g, i, half, ga, gb);
                        load_pair<IO, POut>(d, x, i, half, xa, xb);
                        sum_vectors(ga, gb, xa, xb, dh, i, s);
                      };
  auto apply_step = [&](const T* x, T* dx, const float* dh, vf32 rv, vf32 cv,
                        std::int64_t i) TILEROPE_INLINE_LAMBDA {
#if TILEROPE_BF16_BLOCKS
    if constexpr (Blocks) {
      vf32 xa0, xa1, xb0, xb1, ya0, ya1, yb0, yb1;
      widen(x, i, xa0, xa1, xb0, xb1);
      apply_vectors(xa0, xb0, dh, rv, cv, i, ya0, yb0);
      apply_vectors(xa1, xb1, dh, rv, cv, i + n, ya1, yb1);
      const bool nan = may_hold_nan(d, hn::Add(hn::Add(ya0, ya1), hn::Add(yb0, yb1)));
      const auto ea = narrow_bf16_blocks(d, ya0, ya1, nan);
      const auto eb = narrow_bf16_blocks(d, yb0, yb1, nan);
      if constexpr (std::is_same_v<IO, typename IO::plain>) {
        hn::StoreU(ea, d16, dx + i);
        hn::StoreU(eb, d16, dx + half + i);
      } else {  // streaming_io: n at a time (can_stream checks n)
        hn::Stream(hn::LowerHalf(dh16, ea), dh16, dx + i);
        hn::Stream(hn::UpperHalf(dh16, ea), dh16, dx + i + n);
        hn::Stream(hn::LowerHalf(dh16, eb), dh16, dx + half + i);
        hn::Stream(hn::UpperHalf(dh16, eb), dh16, dx + half + i + n);
      }
      return;
    }
#endif
    vf32 xa, xb, ya, yb;
    load_pair<IO, POut>(d, x, i, half, xa, xb);
    apply_vectors(xa, xb, dh, rv, cv, i, ya, yb);
    store_pair<IO, POut>(d, ya, yb, dx, i, half);
  };
  const std::int64_t step = Blocks ? 2 * n : n;
  const std::int64_t rows_n = (last - first) * heads;
  // the first group's sums
  for (std::int64_t k = 0; k < group; ++k) {
    sums s{hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d)};
    if (k < rows_n) {
      next_row(k);
      for (std::int64_t i = 0; i < half; i += step) sum_step(g_of[k], x_of[k], dh_of(k), i, s);
    }
    sq_of[k] = hn::Add(s.sqa, s.sqb);
    dot_of[k] = hn::Add(s.dota, s.dotb);
  }
  for (std::int64_t m0 = 0; m0 < rows_n; m0 += group) {
    inverse_rms_and_coef4(d, p, sq_of, dot_of, r_of, coef_of);
    const std::int64_t slot0 = m0 % (2 * group), slot0_ahead = (m0 + group) % (2 * group);
    for (std::int64_t k = 0; k < group; ++k) {
      const std::int64_t m = m0 + k, slot = slot0 + k, slot_ahead = slot0_ahead + k;
      const vf32 rv = hn::Set(d, r_of[k]), cv = hn::Set(d, coef_of[k]);
      sums s{hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d)};
      if (m + group < rows_n) {
        next_row(slot_ahead);
        const T *g = g_of[slot_ahead], *xh = x_of[slot_ahead];
        prefetch_row(g, D, p.prefetch_bytes);
        prefetch_row(xh, D, p.prefetch_bytes);
        const T* x = x_of[slot];
        T* dx = dx_of[slot];
        float *dh_ahead = dh_of(slot_ahead), *dh = dh_of(slot);
        for (std::int64_t i = 0; i < half; i += step) {
          sum_step(g, xh, dh_ahead, i, s);
          apply_step(x, dx, dh, rv, cv, i);
        }
      } else if (m < rows_n) {
        // Past the run's last rows too: the rows a group on from this one in the same buffer,
        // plus the distance. Asked only for rows summed, a block of 8 heads of 256 bytes
        // (Qwen3-8B's k, bf16) taken a token at a time prefetched none of its first four rows
        // (AVX2 on Intel, bench --only qk-norm-rope-bwd, Qwen3-8B, two alternations, one / two
        // threads, in place: bf16 0.62 / 0.58 to 0.67 / 0.63 of the ceiling, f16 0.67 / 0.64
        // to 0.75 / 0.70, f32 0.77 / 0.76 to 0.85 / 0.84; out of place bf16 0.61 / 0.60 to
        // 0.63 / 0.62, f16 0.52 / 0.51 to 0.56 / 0.54, f32 0.75 / 0.74 to 0.82 / 0.81).
        prefetch_row(g_of[slot] + group * blk.in_h, D, p.prefetch_bytes);
        prefetch_row(x_of[slot] + group * blk.x_h, D, p.prefetch_bytes);
        const T* x = x_of[slot];
        T* dx = dx_of[slot];
        const float* dh = dh_of(slot);
        for (std::int64_t i = 0; i < half; i += step) apply_step(x, dx, dh, rv, cv, i);
      }
      sq_of[k] = hn::Add(s.sqa, s.sqb);
      dot_of[k] = hn::Add(s.dota, s.dotb);
    }
  }
  // the run's rows, summed, in the weight's element order
#if TILEROPE_BF16_BLOCKS
  if constexpr (Blocks) {  // block order is its own inverse
    for (std::int64_t i = 0; i < D; i += 2 * n) {
      vf32 lo, hi;
      to_block_order(d, hn::LoadU(d, tdw + i), hn::LoadU(d, tdw + i + n), lo, hi);
      hn::StoreU(lo, d, tdw + i);
      hn::StoreU(hi, d, tdw + i + n);
    }
  }
#endif
  for (std::int64_t i = 0; i < half; i += n) {
    store_pair<f32_io, POut>(d, hn::LoadU(d, tdw + i), hn::LoadU(d, tdw + half + i), tdw_out, i,
                             half);
  }
  // Weighted: the sums are of w dw, divided by w in fp64
  add_into_f64<Weighted>(tdw_out, blk.weight_grad + chunk * D, D, blk.inverse_weight);
}

// Backward of QK RMSNorm + RoPE (PIn, POut are the backward rotation's layouts), per token
// and block in groups of four heads: first, for each head of the group, dh = rope_backward(g)
// and the row's two sums (x.x and w dh.x), then through the normalisation. As in the forward,
// the sums of a group overlap instead of each row waiting on its own. Weight-gradient terms
// are summed in fp32 over the heads of one token, then added into the fp64 accumulator.
// `rows` holds dh and x in fp32 for each head of a group, then the token's weight-gradient
// terms. Rows of whole vectors of pairs with every dim rotated take the held path (32 vector
// registers, r/2 of 1, 2, 4 or 8 vectors: norm_backward_held) or, with fewer registers,
// norm_backward_ahead, both called by the tokens loop; the rest (partial rotary, r/2 not a
// multiple of the lanes, AVX-512 rows of other numbers of vectors) come here.

// How many whole vectors of pairs a backward row held in registers has (norm_backward_run_held:
// 32 vector registers, every dim rotated, every block's weights folded into the angles), else 0.
// Rows of 8 vectors (head dim 256) too, which the forward does not hold (its folded angles take 4
// NV registers): here the angles are loaded and the block's dw terms take the 2 NV = 16
// registers (objdump: nothing spilled). Against the rows staged in norm_backward_block's own
// loop, Intel, one thread, 8 + 4 heads of 256, min ns per element of three alternations: in
// memory (T = 8192, in place) bf16 0.315-0.347 to 0.277-0.330, f16 0.303-0.324 to 0.256-0.259,
// f32 0.598-0.623 to 0.592-0.609; in cache (T = 16, out of place) bf16 0.308-0.328 to
// 0.272-0.300, f16 0.291-0.295 to 0.238-0.241, f32 0.318-0.335 to 0.284-0.293.
// Whether every block's weights fold into the angles (head_block::inverse_weight).
inline bool every_weight_folds(const rope_plan& p) {
  for (int k = 0; k < p.num_blocks; ++k) {
    if (p.blocks[k].inverse_weight == nullptr) return false;
  }
  return true;
}

inline int norm_backward_held_vectors(const rope_plan& p, std::int64_t lanes) {
  if (!every_weight_folds(p)) return 0;
  if (lanes < 16 || p.rotary_dim != p.head_dim) return 0;
  if (p.rotary_dim / 2 == 8 * lanes) return 8;
  return held_vectors(p.rotary_dim / 2, lanes);
}

// The backward's held rows of tokens [first, last) of one block, `held` whole vectors of pairs
// (norm_backward_held_vectors), through norm_backward_run_held. `given`: the angles of a run of
// one token, else null (each token's are found). `rows`: qk_norm_backward_tokens_loop's.
template <class IO, pairs PIn, pairs POut>
HWY_INLINE void norm_backward_held(df32 d, const rope_plan& p, const head_block& blk, int held,
                                   std::int64_t first, std::int64_t last, const token_angles* given,
                                   float* token_scratch, float* rows, int chunk) {
  const std::int64_t half = p.rotary_dim / 2, D = p.head_dim;
  // rows: [0, 2D) the weighted angles, [2D, 4D) the lane-pair angles, [4D, 5D) the lane-pair
  // weights, [5D, 8D) q staged, [8D, 9D) the dw terms
  held_scratch sc;
  sc.token = token_scratch;
  sc.ordered = rows + 4 * half;
  sc.wa = blk.weight_a;
  sc.wb = blk.weight_b;
  sc.angles = rows;
  sc.staged = rows + 5 * D;
  sc.tdw = rows + 2 * norm_group * D;
  auto run = [&](auto lane_pairs) TILEROPE_INLINE_LAMBDA {
    constexpr bool LP = decltype(lane_pairs)::value;
    switch (held) {
      case 8:
        return norm_backward_run_held<IO, PIn, POut, 8, LP>(d, p, blk, first, last, given, sc,
                                                            chunk);
      case 4:
        return norm_backward_run_held<IO, PIn, POut, 4, LP>(d, p, blk, first, last, given, sc,
                                                            chunk);
      case 2:
        return norm_backward_run_held<IO, PIn, POut, 2, LP>(d, p, blk, first, last, given, sc,
                                                            chunk);
      default:  // 1: never in lane-pair order
        if constexpr (!LP) {
          return norm_backward_run_held<IO, PIn, POut, 1>(d, p, blk, first, last, given, sc, chunk);
        }
    }
  };
#ifdef TILEROPE_LANE_PAIRS
  if constexpr (takes_lane_pairs<IO, PIn, POut>()) {
    if (held != 1) {            // the block's weights in lane-pair order (the angles: per token)
      float* w = rows + 4 * D;  // [2 r/2]
      lane_pair_ordered(d, blk.weight_a, half, w);
      lane_pair_ordered(d, blk.weight_b, half, w + half);
      sc.wa = w;
      sc.wb = w + half;
      return run(std::true_type{});
    }
  }
#endif
  return run(std::false_type{});
}

// Whether the backward's rows are summed ahead (norm_backward_run_ahead): whole vectors of
// pairs, every dim rotated, and no row held (fewer than 16 lanes; AVX-512 keeps the staged
// path for rows of 3, 5 to 7, or more than 8 vectors of pairs).
inline bool norm_backward_sums_ahead(const rope_plan& p, std::int64_t lanes) {
  return lanes < 16 && p.rotary_dim == p.head_dim && p.rotary_dim / 2 % lanes == 0;
}

// The backward's rows of tokens [first, last) of one block through norm_backward_run_ahead.
// `given`: the angles of a run of one token, else null (each token's are found, and none is a
// full-width row unless the block's weights fold: see qk_norm_backward_tokens_loop).
template <class IO, pairs PIn, pairs POut>
HWY_INLINE void norm_backward_ahead(df32 d, const rope_plan& p, const head_block& blk,
                                    std::int64_t first, std::int64_t last,
                                    const token_angles* given, float* token_scratch, float* rows,
                                    int chunk) {
  const bool folds = blk.inverse_weight != nullptr, full = given != nullptr && given->full;
#if TILEROPE_BF16_BLOCKS
  if constexpr (std::is_same_v<typename IO::plain, bf16_io> && PIn == pairs::halves &&
                POut == pairs::halves) {
    const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
    if (p.rotary_dim / 2 % (2 * lanes) == 0) {  // bf16 halves a vector of bf16 at a time
      if (folds) {
        return norm_backward_run_ahead<IO, PIn, POut, true, true, true>(
            d, p, blk, first, last, given, token_scratch, rows, chunk);
      }
      if (full) {
        return norm_backward_run_ahead<IO, PIn, POut, true, true>(d, p, blk, first, last, given,
                                                                  token_scratch, rows, chunk);
      }
      return norm_backward_run_ahead<IO, PIn, POut, false, true>(d, p, blk, first, last, given,
                                                                 token_scratch, rows, chunk);
    }
  }
#endif
  if (folds) {
    return norm_backward_run_ahead<IO, PIn, POut, true, false, true>(d, p, blk, first, last, given,
                                                                     token_scratch, rows, chunk);
  }
  if (full) {
    return norm_backward_run_ahead<IO, PIn, POut, true>(d, p, blk, first, last, given,
                                                        token_scratch, rows, chunk);
  }
  return norm_backward_run_ahead<IO, PIn, POut, false>(d, p, blk, first, last, given, token_scratch,
                                                       rows, chunk);
}

template <class IO, pairs PIn, pairs POut>
HWY_INLINE void norm_backward_block(df32 d, const rope_plan& p, const head_block& blk,
                                    const typename IO::storage* g_in, typename IO::storage* dx_out,
                                    const typename IO::storage* x_in, const token_angles& a,
                                    float* rows, int chunk) {
  using T = typename IO::storage;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim, D = p.head_dim;
  constexpr std::int64_t group = norm_group;
  float* tdw = rows + 2 * group * D;
  float r_of[group], coef_of[group];
  const float inv_d = 1.0f / static_cast<float>(D);
  const std::int64_t vec_end = D / lanes * lanes;
  for (std::int64_t h0 = 0; h0 < blk.heads; h0 += group) {
    const std::int64_t n = std::min(group, blk.heads - h0);
    for (std::int64_t g = 0; g < n; ++g) {
      const T* gr = g_in + (h0 + g) * blk.in_h;
      const T* x = x_in + (h0 + g) * blk.x_h;
      prefetch_row(gr, D, p.prefetch_bytes);
      prefetch_row(x, D, p.prefetch_bytes);
      float* dh = rows + 2 * g * D;
      float* xr = dh + D;
      rotate_row<IO, f32_io, PIn, POut>(d, gr, dh, a, half);
      for (std::int64_t j = rotary; j < D; ++j) dh[j] = IO::load1(gr + j);
      vf32 sq = hn::Zero(d), dot = hn::Zero(d);
      for (std::int64_t j = 0; j < vec_end; j += lanes) {
        const vf32 xv = IO::load(d, x + j);
        hn::StoreU(xv, d, xr + j);
        sq = hn::MulAdd(xv, xv, sq);
        dot = hn::MulAdd(hn::Mul(hn::LoadU(d, blk.weight + j), hn::LoadU(d, dh + j)), xv, dot);
      }
      float sq_s = hn::GetLane(hn::SumOfLanes(d, sq));
      float dot_s = hn::GetLane(hn::SumOfLanes(d, dot));
      for (std::int64_t j = vec_end; j < D; ++j) {
        xr[j] = IO::load1(x + j);
        sq_s += xr[j] * xr[j];
        dot_s += blk.weight[j] * dh[j] * xr[j];
      }
      const float r = 1.0f / std::sqrt(sq_s * inv_d + p.eps);
      r_of[g] = r;
      coef_of[g] = r * r * r * inv_d * dot_s;
    }
    for (std::int64_t g = 0; g < n; ++g) {
      const float* dh = rows + 2 * g * D;
      const float* xr = dh + D;
      T* dx = dx_out + (h0 + g) * blk.out_h;
      const float r = r_of[g], coef = coef_of[g];
      const vf32 rv = hn::Set(d, r), cv = hn::Set(d, coef);
      for (std::int64_t j = 0; j < vec_end; j += lanes) {
        const vf32 dhv = hn::LoadU(d, dh + j), xv = hn::LoadU(d, xr + j);
        const vf32 wdh = hn::Mul(hn::LoadU(d, blk.weight + j), dhv);
        IO::store(d, hn::MulSub(rv, wdh, hn::Mul(cv, xv)), dx + j);
        hn::StoreU(hn::MulAdd(hn::Mul(dhv, xv), rv, hn::LoadU(d, tdw + j)), d, tdw + j);
      }
      for (std::int64_t j = vec_end; j < D; ++j) {
        IO::store1(r * blk.weight[j] * dh[j] - coef * xr[j], dx + j);
        tdw[j] += dh[j] * xr[j] * r;
      }
    }
  }
  add_into_f64(tdw, blk.weight_grad + chunk * D, D);  // the block's heads of this token, summed
  std::fill(tdw, tdw + D, 0.0f);
}

template <class IO, pairs PIn, pairs POut>
void qk_norm_backward_tokens_loop(const rope_plan& p, std::int64_t first, std::int64_t last,
                                  int chunk) {
  using T = typename IO::storage;
  const df32 d;
  thread_local std::vector<float> scratch;
  // 2 groups of D (dh or dh and x; held rows: the weighted angles, the lane-pair angles and
  // weights, q of 3 rows), dw terms, dw in element order, then for the bf16 block order the
  // angles (2 D) and weights (D)
  const auto need = static_cast<std::size_t>((2 * norm_group + 5) * p.head_dim);
  float* rows = line_aligned(scratch, need);
  std::fill(rows, rows + need, 0.0f);
  float* token_scratch = thread_scratch(p);
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const int held = norm_backward_held_vectors(p, lanes);
  const bool ahead = norm_backward_sums_ahead(p, lanes);
  // A block's rows of a run of tokens at a time, unless the angles are gathered in runs of
  // their own (MRoPE from a table) or, for rows summed ahead whose weights do not fold, a
  // token's angles may be full-width rows (their kernel is chosen per token).
  const bool may_be_full = p.rows_cos != nullptr && p.rows_width != p.rotary_dim / 2;
  if ((held != 0 || (ahead && (every_weight_folds(p) || !may_be_full))) &&
      !gathers_angles_in_runs(p)) {
    for (std::int64_t t0 = first; t0 < last; t0 += block_run) {
      const std::int64_t t1 = std::min(last, t0 + block_run);
      for (int k = 0; k < p.num_blocks; ++k) {
        if (held != 0) {
          norm_backward_held<IO, PIn, POut>(d, p, p.blocks[k], held, t0, t1, nullptr, token_scratch,
                                            rows, chunk);
        } else {
          norm_backward_ahead<IO, PIn, POut>(d, p, p.blocks[k], t0, t1, nullptr, token_scratch,
                                             rows, chunk);
        }
      }
    }
    return;
  }
  for_each_block_in_runs<T>(
      p, first, last, token_scratch,
      [&](std::int64_t b, std::int64_t s, const token_angles& a, const head_block& blk,
          const T* g_in, T* dx_out) {
        const std::int64_t t = b * p.seq + s;
        if (held != 0) {
          return norm_backward_held<IO, PIn, POut>(d, p, blk, held, t, t + 1, &a, token_scratch,
                                                   rows, chunk);
        }
        if (ahead) {
          return norm_backward_ahead<IO, PIn, POut>(d, p, blk, t, t + 1, &a, token_scratch, rows,
                                                    chunk);
        }
        const T* x_in = static_cast<const T*>(blk.x) + b * blk.x_b + s * blk.x_s;
        norm_backward_block<IO, PIn, POut>(d, p, blk, g_in, dx_out, x_in, a, rows, chunk);
      });
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
    const head_block& b = p.blocks[k];
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
void rope_tokens_layout(const rope_plan& p, std::int64_t first, std::int64_t last, int chunk) {
  // QK RMSNorm streams when every dim rotates (pass dims are stored one element at a time)
  const bool norm_streams = p.qk_norm && p.rotary_dim == p.head_dim && can_stream<IO>(p);
  if (p.qk_norm && p.backward) {
    // f16 without AVX-512 streams where the plan says (rope_plan::streams_f16_norm_backward: on
    // Intel) and stores normally elsewhere: on the AVX2 class (AMD EPYC), streamed, its backward
    // (norm_backward_run_ahead) measured 2.5 to 3 times slower with the scratch rows at some
    // offsets (mod 4 KiB) from the output, and no faster at the others (bench --only
    // qk-norm-rope-bwd, f16 out of place, one thread: 60-71 or 22-35 ms streamed, 21-25 ms
    // stored normally); f32 and bf16 streamed did not move. Intel with AVX2, bench --only
    // qk-norm-rope-bwd, two alternations, one / two threads: f16 out of place Qwen3-8B 0.56 /
    // 0.54 of the ceiling to 0.71 / 0.67, gemma3-4b 0.51 / 0.49 to 0.61 / 0.56; with SSE4 (f16
    // converted in software) within 0.01. With AVX-512 f16 streams, measured on Intel: rows held
    // (norm_backward_run_held, two alternations) 0.57 / 0.53 to 0.77 / 0.74 of the ceiling at one
    // / two threads; rows staged in norm_backward_block's own loop (then head dim 256, gemma3-4b)
    // 0.51 / 0.48 to 0.69 / 0.66-0.69, and with the output at eight offsets mod 4 KiB (one thread,
    // 8 + 4 heads, T = 8192) 0.62-0.72 ns per element to 0.46-0.50.
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
void rope_tokens_typed(const rope_plan& p, std::int64_t first, std::int64_t last, int chunk) {
  constexpr pairs H = pairs::halves, A = pairs::adjacent;
  if (p.in_pairs == H) {
    return p.out_pairs == H ? rope_tokens_layout<IO, H, H>(p, first, last, chunk)
                            : rope_tokens_layout<IO, H, A>(p, first, last, chunk);
  }
  return p.out_pairs == H ? rope_tokens_layout<IO, A, H>(p, first, last, chunk)
                          : rope_tokens_layout<IO, A, A>(p, first, last, chunk);
}

void rope_tokens_impl(const rope_plan& p, std::int64_t first, std::int64_t last, int chunk) {
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

void rope_tokens(const rope_plan& plan, std::int64_t first, std::int64_t last, int chunk) {
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
