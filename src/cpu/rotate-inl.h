// The rotation of pairs: y_a = x_a c_a - x_b s_a, y_b = x_b c_b + x_a s_b, a vector of pairs at a
// time, read and written as halves or adjacent pairs.
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_ROTATE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_ROTATE_INL_H_
#undef TILEROPE_CPU_ROTATE_INL_H_
#else
#define TILEROPE_CPU_ROTATE_INL_H_
#endif

#include "cpu/prefetch-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_ROTATE_INL_H_
