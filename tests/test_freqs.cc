// Frequencies and tables: the formula, accuracy at long positions, HF parity mode.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/rope.h"

namespace {

using namespace tilerope;

double ulp_f32(double v) {
  const float f = static_cast<float>(std::fabs(v));
  return std::nextafter(f, INFINITY) - f;
}

TEST(Freqs, InvFreqIsThetaToTheMinusTwoIOverD) {
  for (int d : {2, 64, 80, 128}) {
    const auto f = rope_inv_freq(d, 10000.0);
    const auto g = golden::inv_freq(d, 10000.0);
    ASSERT_EQ(f.size(), static_cast<std::size_t>(d / 2));
    for (std::size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], g[i], 1e-15 * g[i]);
    EXPECT_EQ(f[0], 1.0);
  }
}

TEST(Freqs, TablesRoundOnceFromFp64) {
  const auto inv = golden::inv_freq(64, 500000.0);
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    const rope_table table = make_rope_table(300, 64, 500000.0, t);
    ASSERT_EQ(table.cos.shape(), (std::vector<std::int64_t>{300, 32}));
    for (std::int64_t p = 0; p < 300; p += 7) {
      for (std::size_t i = 0; i < 32; ++i) {
        const double a = static_cast<double>(p) * inv[i];
        EXPECT_EQ(load_as_f64(table.cos.data(), t, p * 32 + i), golden::round_to(t, std::cos(a)));
        EXPECT_EQ(load_as_f64(table.sin.data(), t, p * 32 + i), golden::round_to(t, std::sin(a)));
      }
    }
  }
}

TEST(Freqs, HfCompatTableMatchesHfArithmetic) {
  std::vector<std::int64_t> pos(1000);
  for (std::size_t p = 0; p < pos.size(); ++p) pos[p] = static_cast<std::int64_t>(p) * 37;
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const rope_table table = make_rope_table(37000, 128, 1e6, t, angle_precision::hf_compat);
    std::vector<double> c, s;
    golden::angles_hf(128, 1e6, pos, t, c, s);
    for (std::size_t j = 0; j < pos.size(); ++j) {
      for (std::size_t i = 0; i < 64; ++i) {
        ASSERT_EQ(load_as_f64(table.cos.data(), t, pos[j] * 64 + i), c[j * 64 + i]) << pos[j];
        ASSERT_EQ(load_as_f64(table.sin.data(), t, pos[j] * 64 + i), s[j * 64 + i]) << pos[j];
      }
    }
  }
}

// Rotating the unit vector e_i gives (cos, sin) of angle i itself, so the computed angles can
// be read back through rope_apply. Reference: long double.
struct readback {
  std::vector<double> excess;  // per position: worst |error| - ulp_f32(value) / 2
  double worst_abs = 0;
};

readback read_angles(const std::vector<std::int64_t>& positions, angle_precision precision) {
  const std::int64_t D = 128, half = 64, T = static_cast<std::int64_t>(positions.size());
  // one head per frequency i: x = e_i, so y[i] = cos_i and y[i + 64] = sin_i
  std::vector<float> x(T * half * D, 0.0f);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < half; ++i) x[(t * half + i) * D + i] = 1.0f;
  rope_tensors xt;
  xt.q = tensor_view::contiguous(x.data(), dtype::f32, {T, half, D});
  std::vector<std::int64_t> ids = positions;
  rope_apply(rope_style::neox, xt,
             rope_positions::from_ids(tensor_view::contiguous(ids.data(), dtype::i64, {T})),
             rope_angles::from_theta(10000.0, precision));
  readback r;
  for (std::int64_t t = 0; t < T; ++t) {
    double worst = 0;
    for (std::int64_t i = 0; i < half; ++i) {
      const long double inv = powl(10000.0L, -2.0L * i / D);
      const long double a = static_cast<long double>(positions[t]) * inv;
      const double c = static_cast<double>(cosl(a)), s = static_cast<double>(sinl(a));
      const double got_c = x[(t * half + i) * D + i], got_s = x[(t * half + i) * D + i + half];
      // beyond the fp32 rounding itself (half an ulp of the value)
      worst = std::max(
          {worst, std::fabs(got_c - c) - ulp_f32(c) / 2, std::fabs(got_s - s) - ulp_f32(s) / 2});
      r.worst_abs = std::max({r.worst_abs, std::fabs(got_c - c), std::fabs(got_s - s)});
    }
    r.excess.push_back(worst);
  }
  return r;
}

// Within half an fp32 ulp of the exact value, plus the fp64 angle's own error.
TEST(Freqs, AccurateAnglesKeepFp32AccuracyUpTo2To24) {
  const std::vector<std::int64_t> pos = {0, 1, 4095, 65535, 1 << 20, (1 << 24) - 1, 1 << 24};
  const readback r = read_angles(pos, angle_precision::accurate);
  for (std::size_t j = 0; j < pos.size(); ++j) {
    // The fp64 angle p * inv_freq carries up to ~p * 2^-52 of error: 3.7e-9 at p = 2^24.
    EXPECT_LE(r.excess[j], 4e-9) << "position " << pos[j];
  }
}

// The documented cost of hf_compat: an fp32 angle, off by up to half an ulp of p * inv_freq.
TEST(Freqs, HfCompatErrorAtLongPositionsIsTheFp32AngleError) {
  const readback at_4096 = read_angles({4096}, angle_precision::hf_compat);
  const readback at_65536 = read_angles({65536}, angle_precision::hf_compat);
  EXPECT_LE(at_4096.worst_abs, 2.5e-4);
  EXPECT_LE(at_65536.worst_abs, 4e-3);
  EXPECT_GT(at_65536.worst_abs, 1e-4);  // the effect is real, and far above fp32 accuracy
  const readback accurate = read_angles({65536}, angle_precision::accurate);
  EXPECT_LT(accurate.worst_abs, 1e-7);
}

TEST(Freqs, InvalidArgumentsNameTheirValues) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { rope_inv_freq(63, 1e4); }).find("rotary_dim (63)"), std::string::npos);
  EXPECT_NE(message([] { rope_inv_freq(64, -1); }).find("theta (-1"), std::string::npos);
  EXPECT_NE(message([] { rope_inv_freq(64, NAN); }).find("theta (nan"), std::string::npos);
  EXPECT_NE(message([] { make_rope_table(-4, 64, 1e4); }).find("max_pos (-4)"), std::string::npos);
  EXPECT_NE(message([] { make_rope_table(4, 64, 1e4, dtype::i32); }).find("table dtype (i32)"),
            std::string::npos);
}

}  // namespace
