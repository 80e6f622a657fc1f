// Rows of 16-bit elements: bf16 halves in lane-pair order (AVX512-BF16) and a vector of bf16 at
// a time (x86 without AVX-512).
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_ROWS_16BIT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_ROWS_16BIT_INL_H_
#undef TILEROPE_CPU_ROWS_16BIT_INL_H_
#else
#define TILEROPE_CPU_ROWS_16BIT_INL_H_
#endif

#include "cpu/angles-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
HWY_NOINLINE void rotate_block_held(df32 d, const cpu_plan& p, const cpu_block& blk,
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
// vcvtneps2bf16 of two uops. Output order (rotate_block_output_order) was as fast in cache but
// slower in memory (docs/performance.md, "Performance decisions").
inline bool takes_lane_pairs_tail(std::int64_t half, std::int64_t lanes) {
  return half == 2 * lanes + lanes / 2;
}

template <class IO, bool Full>
HWY_NOINLINE void rotate_block_lane_pairs_tail(df32 d, const cpu_plan& p, const cpu_block& blk,
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
// block of heads (block_ordered). One NaN test covers a step's four results
// (docs/performance.md, "Performance decisions"). Head dim 80 (r/2 = 2n + n with AVX2) ends
// each row with one fp32 vector of pairs.
// The narrowing splits each result's u32 lanes into low and high u16 halves by one byte
// shuffle and one 64-bit unpack per vector and rounds 2n at a time in u16 lanes: 18
// instructions a step of 32 elements where the rounding per fp32 vector and the pack took 22.
// Rows of adjacent bf16 pairs stored as halves (the interleaved layout's forward) take it too:
// two u32 vectors of pairs put in block order, each pair widened by a shift and a mask; in
// place without a copy of the row where it has 2 or 4 steps (rotate_row_bf16_pairs_in_place).
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4)
#define TILEROPE_BF16_BLOCKS 1
using du16_t = hn::Repartition<std::uint16_t, df32>;  // 2n lanes

// [2n] bf16 -> two [n] fp32 in block order. v is held in a register (in_register): GCC
// otherwise loaded it again for each unpack, and QK RMSNorm's forward step (a row rotated, the
// next one summed) issued 17 loads for 32 elements instead of 12, one of them a constant of the
// rounding spilled to the stack.
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
inline bool takes_bf16_blocks(const cpu_plan& p, std::int64_t lanes) {
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
inline bool takes_bf16_blocks(const cpu_plan&, std::int64_t) {
  return false;
}
#endif

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_ROWS_16BIT_INL_H_
