// sin and cos of fp64 angles, a vector at a time, for the angles the kernels compute per token
// (rope_angles::from_theta and its kin). Included by each SIMD target's pass of
// rope_kernels.cc, inside its namespace (Highway's -inl.h convention).
//
// The angle a is reduced by multiples of pi/2, a = k pi/2 + r with k = round(a 2/pi), then
//
//     sin(r) = r + r^3 (-1/3! + r^2 (1/5! - ...  r^2 / 15!))
//     cos(r) = 1 - r^2/2 + r^4 (1/4! - ...  r^2 / 16!)          |r| <= pi/4 (and a rounding)
//
// and k mod 4 picks and signs them. pi/2 is split into P1 + P2 + P3 + P4, the first three of
// 28 significant bits, so that k Pj is exact for |k| < 2^25: r = a - k P1 is exact (Sterbenz),
// each later step rounds once, about 2e-16 in all for |r| <= pi/4; the Taylor series cut after
// r^15 and r^16 are off by at most 5e-17 and 2e-18 there. Together well under an fp64 ulp of 1,
// so once rounded to fp32 the result is libm's but where the exact value lies within about
// 3e-16 of an fp32 rounding boundary. Valid for |a| < max_reduced_angle; callers take libm past
// it.

#if defined(TILEROPE_CPU_SIN_COS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_SIN_COS_INL_H_
#undef TILEROPE_CPU_SIN_COS_INL_H_
#else
#define TILEROPE_CPU_SIN_COS_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {

// |a| below this (2^25 rad): |k| < 2^25 and every k Pj exact
constexpr double max_reduced_angle = 0x1p25;

template <class D>
HWY_INLINE void sin_cos(D d, hwy::HWY_NAMESPACE::Vec<D> a, hwy::HWY_NAMESPACE::Vec<D>& sin_a,
                        hwy::HWY_NAMESPACE::Vec<D>& cos_a) {
  namespace hn = hwy::HWY_NAMESPACE;
  static_assert(std::is_same_v<hn::TFromD<D>, double>);
  // pi/2 = P1 + P2 + P3 + P4 (P1 to P3 of 28 significant bits)
  const auto P1 = hn::Set(d, 0x1.921fb54p+0), P2 = hn::Set(d, 0x1.10b4612p-30);
  const auto P3 = hn::Set(d, -0x1.676733ap-60), P4 = hn::Set(d, -0x1.d1fc8f8cbb5bfp-89);
  const auto k = hn::Round(hn::Mul(a, hn::Set(d, 0x1.45f306dc9c883p-1)));  // a 2/pi, to even
  auto r = hn::NegMulAdd(k, P1, a);
  r = hn::NegMulAdd(k, P2, r);
  r = hn::NegMulAdd(k, P3, r);
  r = hn::NegMulAdd(k, P4, r);
  const auto r2 = hn::Mul(r, r);
  auto ps = hn::Set(d, -1.0 / 1307674368000.0);  // -1/15!
  ps = hn::MulAdd(ps, r2, hn::Set(d, 1.0 / 6227020800.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, -1.0 / 39916800.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, 1.0 / 362880.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, -1.0 / 5040.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, 1.0 / 120.0));
  ps = hn::MulAdd(ps, r2, hn::Set(d, -1.0 / 6.0));
  const auto sin_r = hn::MulAdd(hn::Mul(r, r2), ps, r);
  auto pc = hn::Set(d, 1.0 / 20922789888000.0);  // 1/16!
  pc = hn::MulAdd(pc, r2, hn::Set(d, -1.0 / 87178291200.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, 1.0 / 479001600.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, -1.0 / 3628800.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, 1.0 / 40320.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, -1.0 / 720.0));
  pc = hn::MulAdd(pc, r2, hn::Set(d, 1.0 / 24.0));
  const auto cos_r =
      hn::MulAdd(hn::Mul(r2, r2), pc, hn::NegMulAdd(hn::Set(d, 0.5), r2, hn::Set(d, 1.0)));
  // k mod 4 in [0, 4): sin(a) = sin r, cos r, -sin r, -cos r; cos(a) = cos r, -sin r, -cos r, sin r
  const auto q = hn::NegMulAdd(hn::Floor(hn::Mul(k, hn::Set(d, 0.25))), hn::Set(d, 4.0), k);
  const auto odd = hn::Eq(hn::NegMulAdd(hn::Floor(hn::Mul(q, hn::Set(d, 0.5))), hn::Set(d, 2.0), q),
                          hn::Set(d, 1.0));
  const auto s = hn::IfThenElse(odd, cos_r, sin_r), c = hn::IfThenElse(odd, sin_r, cos_r);
  sin_a = hn::IfThenElse(hn::Ge(q, hn::Set(d, 2.0)), hn::Neg(s), s);
  cos_a =
      hn::IfThenElse(hn::Or(hn::Eq(q, hn::Set(d, 1.0)), hn::Eq(q, hn::Set(d, 2.0))), hn::Neg(c), c);
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_SIN_COS_INL_H_
