// dtype conversions: every fp32 bit pattern against independent references, every 16-bit
// pattern round-tripped.

#include <gtest/gtest.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "golden/golden.h"
#include "tilerope/dtype.h"
#include "tilerope/error.h"

namespace {

using tilerope::bf16_bits_to_f32;
using tilerope::f16_bits_to_f32;
using tilerope::f32_to_bf16_bits;
using tilerope::f32_to_f16_bits;

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The f16 references, independent of the library: the CPU's own conversions (F16C vcvtps2ph,
// round to nearest even, and vcvtph2ps) where there are, else the golden's fp64 rounding with
// a plain encoding and decoding of the bits (gcc and clang alike: no _Float16).
std::uint16_t encode_f16(double r, bool negative) {  // r: an f16 value (or inf), exactly
  const std::uint16_t sign = negative ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < 0x1p-14) return sign | static_cast<std::uint16_t>(a * 0x1p24);  // subnormal or 0
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  return sign | static_cast<std::uint16_t>((e + 14) << 10) |
         static_cast<std::uint16_t>(m * 2048 - 1024);
}
float decode_f16(std::uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double a = e == 0    ? m * 0x1p-24
                   : e == 31 ? (m ? std::numeric_limits<double>::quiet_NaN() : INFINITY)
                             : std::ldexp(1024 + m, e - 25);
  return static_cast<float>(h & 0x8000 ? -a : a);
}
#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t hardware_f16(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, 0));
}
__attribute__((target("f16c"))) float hardware_f16_to_f32(std::uint16_t h) { return _cvtsh_ss(h); }
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
const bool have_f16c = cpu_has_f16c();
#endif
std::uint16_t reference_f16(float x) {
#if defined(__x86_64__)
  if (have_f16c) return hardware_f16(x);
#endif
  return encode_f16(tilerope::golden::round_to(tilerope::dtype::f16, x), std::signbit(x));
}
float reference_f16_to_f32(std::uint16_t h) {
#if defined(__x86_64__)
  if (have_f16c) return hardware_f16_to_f32(h);
#endif
  return decode_f16(h);
}

// bf16 reference by exact integer comparison with the two candidates: truncate, then compare
// the dropped 16 bits with half (0x8000), ties to the even candidate. Carries into the
// exponent (and up to Inf) fall out of the integer increment.
std::uint16_t reference_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  const auto truncated = static_cast<std::uint16_t>(u >> 16);
  const std::uint32_t dropped = u & 0xffffu;
  if (std::isnan(x)) return truncated;  // NaN checked separately (quiet, sign kept)
  if (dropped > 0x8000u || (dropped == 0x8000u && (truncated & 1u))) {
    return static_cast<std::uint16_t>(truncated + 1);
  }
  return truncated;
}

TEST(DtypeExhaustive, F32ToF16MatchesCompilerForAllBitPatterns) {
  std::int64_t mismatches = 0;
  std::uint32_t first_bad = 0;
#pragma omp parallel for reduction(+ : mismatches) schedule(static)
  for (std::int64_t i = 0; i <= 0xffffffffLL; ++i) {
    const float x = float_of(static_cast<std::uint32_t>(i));
    const std::uint16_t got = f32_to_f16_bits(x);
    if (std::isnan(x)) {
      // NaN stays NaN, quiet, with its sign
      if ((got & 0x7c00u) != 0x7c00u || (got & 0x0200u) == 0 ||
          (got >> 15) != (static_cast<std::uint32_t>(i) >> 31)) {
        ++mismatches;
      }
    } else if (got != reference_f16(x)) {
      if (mismatches == 0) first_bad = static_cast<std::uint32_t>(i);
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch at fp32 bits 0x" << std::hex << first_bad;
}

TEST(DtypeExhaustive, F32ToBf16MatchesIntegerReferenceForAllBitPatterns) {
  std::int64_t mismatches = 0;
#pragma omp parallel for reduction(+ : mismatches) schedule(static)
  for (std::int64_t i = 0; i <= 0xffffffffLL; ++i) {
    const float x = float_of(static_cast<std::uint32_t>(i));
    const std::uint16_t got = f32_to_bf16_bits(x);
    if (std::isnan(x)) {
      if (!std::isnan(bf16_bits_to_f32(got)) || (got & 0x40u) == 0 ||
          (got >> 15) != (static_cast<std::uint32_t>(i) >> 31)) {
        ++mismatches;
      }
    } else if (got != reference_bf16(x)) {
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DtypeExhaustive, SixteenBitValuesRoundTripExactly) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float fh = f16_bits_to_f32(h);
    const float ref = reference_f16_to_f32(h);
    if (std::isnan(fh)) {
      EXPECT_TRUE(std::isnan(ref));
      EXPECT_EQ(f32_to_f16_bits(fh), h | 0x0200u) << b;  // quieted, payload kept
    } else {
      EXPECT_EQ(bits_of(fh), bits_of(ref)) << b;
      EXPECT_EQ(f32_to_f16_bits(fh), h) << b;
    }
    const float fb = bf16_bits_to_f32(h);
    if (std::isnan(fb)) {
      EXPECT_EQ(f32_to_bf16_bits(fb), h | 0x40u) << b;
    } else {
      EXPECT_EQ(f32_to_bf16_bits(fb), h) << b;
    }
  }
}

TEST(Dtype, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16_bits(inf), 0x7c00u);
  EXPECT_EQ(f32_to_f16_bits(-inf), 0xfc00u);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000u);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000u);
  EXPECT_EQ(f32_to_bf16_bits(inf), 0x7f80u);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16_bits(65519.99f), 0x7bffu);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00u);         // halfway to 2^16 rounds to even: Inf
  EXPECT_EQ(f32_to_f16_bits(0x1p-24f), 0x0001u);         // smallest subnormal
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f), 0x0000u);         // halfway to zero: even (zero)
  EXPECT_EQ(f32_to_f16_bits(0x1.8p-24f), 0x0002u);       // 1.5 steps: ties to even (2)
  EXPECT_EQ(f32_to_f16_bits(0x1.000002p-25f), 0x0001u);  // just above halfway
  EXPECT_EQ(f16_bits_to_f32(0x03ffu), 0x3ffp-24f);       // largest subnormal
  EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(std::nanf("")))));
  EXPECT_EQ(f32_to_bf16_bits(1.00390625f), 0x3f80u);  // 1 + 2^-8: tie, to even
  EXPECT_EQ(f32_to_bf16_bits(1.01171875f), 0x3f82u);  // 1 + 3*2^-8: tie, to even (up)
}

TEST(Dtype, Fp64StoresRoundOnce) {
  // 1 + 2^-11 + 2^-40 is just above the f16 tie between 1 and 1 + 2^-10: it must round up,
  // although rounding to fp32 first (1 + 2^-11, an exact tie) would round down to 1.
  std::uint16_t h = 0;
  tilerope::store_from_f64(&h, tilerope::dtype::f16, 0, 1.0 + 0x1p-11 + 0x1p-40);
  EXPECT_EQ(h, 0x3c01u);
  tilerope::store_from_f64(&h, tilerope::dtype::bf16, 0, 1.0 + 0x1p-8 + 0x1p-40);
  EXPECT_EQ(h, 0x3f81u);
  tilerope::store_from_f64(&h, tilerope::dtype::f16, 0, 65519.999999);
  EXPECT_EQ(h, 0x7bffu);
  tilerope::store_from_f64(&h, tilerope::dtype::f16, 0, 1e300);
  EXPECT_EQ(h, 0x7c00u);
  tilerope::store_from_f64(&h, tilerope::dtype::bf16, 0, -1e300);
  EXPECT_EQ(h, 0xff80u);
}

TEST(Dtype, NamesRoundTripAndUnknownNamesAreErrors) {
  for (auto t : {tilerope::dtype::f32, tilerope::dtype::f16, tilerope::dtype::bf16,
                 tilerope::dtype::i32, tilerope::dtype::i64}) {
    EXPECT_EQ(tilerope::dtype_from_string(tilerope::to_string(t)), t);
  }
  try {
    tilerope::dtype_from_string("f8");
    FAIL();
  } catch (const tilerope::error& e) {
    EXPECT_NE(std::string(e.what()).find("'f8'"), std::string::npos);
  }
}

}  // namespace
