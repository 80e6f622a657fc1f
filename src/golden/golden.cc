#include "golden/golden.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tilerope::golden {

std::vector<double> inv_freq(std::int64_t rotary_dim, double theta) {
  std::vector<double> f;
  for (std::int64_t i = 0; i < rotary_dim; i += 2) {
    f.push_back(1.0 / std::pow(theta, static_cast<double>(i) / static_cast<double>(rotary_dim)));
  }
  return f;
}

void angles(const std::vector<double>& inv_freq, const std::vector<std::int64_t>& positions,
            std::vector<double>& cos, std::vector<double>& sin) {
  const std::size_t half = inv_freq.size();
  cos.assign(positions.size() * half, 0.0);
  sin.assign(positions.size() * half, 0.0);
  for (std::size_t t = 0; t < positions.size(); ++t) {
    for (std::size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(positions[t]) * inv_freq[i];
      cos[t * half + i] = std::cos(a);
      sin[t * half + i] = std::sin(a);
    }
  }
}

// v rounded to `bits` significant bits, ties to even, with subnormal steps of 2^min_step and
// infinity from 2^max_exp: a 16-bit float's rounding, in fp64 arithmetic.
double round_to_bits(double v, int bits, int min_step, int max_exp) {
  // Scale to an integer count of steps in v's binade and round that.
  if (v == 0 || !std::isfinite(v)) return v;
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const double step = std::ldexp(1.0, std::max(e - bits, min_step));
  const double r = std::nearbyint(v / step) * step;  // default mode: ties to even
  return std::fabs(r) >= std::ldexp(1.0, max_exp) ? std::copysign(INFINITY, v) : r;
}

double round_to(dtype t, double v) {
  if (t == dtype::f16) return round_to_bits(v, 11, -24, 16);
  if (t == dtype::bf16) return round_to_bits(v, 8, -133, 128);
  if (t == dtype::f32) return static_cast<double>(static_cast<float>(v));
  return v;
}

void angles_hf(std::int64_t rotary_dim, double theta, const std::vector<std::int64_t>& positions,
               dtype round, std::vector<double>& cos, std::vector<double>& sin) {
  const auto half = static_cast<std::size_t>(rotary_dim / 2);
  std::vector<float> inv(half);
  for (std::size_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
    inv[i] = 1.0f / static_cast<float>(std::pow(static_cast<double>(static_cast<float>(theta)), e));
  }
  cos.assign(positions.size() * half, 0.0);
  sin.assign(positions.size() * half, 0.0);
  for (std::size_t t = 0; t < positions.size(); ++t) {
    for (std::size_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(positions[t]) * inv[i];
      cos[t * half + i] = round_to(round, static_cast<float>(std::cos(static_cast<double>(a))));
      sin[t * half + i] = round_to(round, static_cast<float>(std::sin(static_cast<double>(a))));
    }
  }
}

tolerance tolerance_for(dtype t) {
  switch (t) {
    case dtype::f16:
      return {1e-3, 1e-3};
    case dtype::bf16:
      return {8e-3, 8e-3};
    default:
      return {1e-5, 1e-5};
  }
}

void rope_full(std::int64_t rows, std::int64_t D, const double* x,
               const std::vector<const double*>& cos_rows,
               const std::vector<const double*>& sin_rows, double* y) {
  const std::int64_t half = D / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * D;
    for (std::int64_t j = 0; j < D; ++j) {
      const double rotated = j < half ? -xr[j + half] : xr[j - half];
      y[r * D + j] = xr[j] * cos_rows[r][j] + rotated * sin_rows[r][j];
    }
  }
}

void mrope_row(const std::int64_t section[3], std::int64_t D, const double* const planes[3],
               double* out) {
  std::int64_t j = 0;
  for (int i = 0; i < 6; ++i) {
    for (std::int64_t w = 0; w < section[i % 3] && j < D; ++w, ++j) out[j] = planes[i % 3][j];
  }
}

int mrope_axis(const int section[3], bool interleaved, int i) {
  if (!interleaved) {
    if (i < section[0]) return 0;
    return i < section[0] + section[1] ? 1 : 2;
  }
  if (i % 3 == 1 && i < 3 * section[1]) return 1;
  if (i % 3 == 2 && i < 3 * section[2]) return 2;
  return 0;
}

std::pair<int, double> vision_2d_frequency(std::int64_t head_dim, double theta, std::int64_t i) {
  const std::int64_t quarter = head_dim / 4;
  const double j = static_cast<double>(i % quarter);
  return {i < quarter ? 0 : 1, std::pow(theta, -2.0 * j / static_cast<double>(head_dim / 2))};
}

void rms_norm(std::int64_t rows, std::int64_t D, const double* x, const double* w, double eps,
              double* y) {
  for (std::int64_t r = 0; r < rows; ++r) {
    double sq = 0;
    for (std::int64_t j = 0; j < D; ++j) sq += x[r * D + j] * x[r * D + j];
    const double scale = 1.0 / std::sqrt(sq / static_cast<double>(D) + eps);
    for (std::int64_t j = 0; j < D; ++j) y[r * D + j] = x[r * D + j] * scale * w[j];
  }
}

void interleave_rope(std::int64_t rows, std::int64_t D, bool split_half_output, const double* x,
                     const std::vector<const double*>& cos_rows,
                     const std::vector<const double*>& sin_rows, double* y) {
  const std::int64_t half = D / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* c = cos_rows[r];
    const double* s = sin_rows[r];
    for (std::int64_t k = 0; k < half; ++k) {
      const double xe = x[r * D + 2 * k], xo = x[r * D + 2 * k + 1];
      if (split_half_output) {
        y[r * D + k] = xe * c[k] - xo * s[k];
        y[r * D + half + k] = xe * s[half + k] + xo * c[half + k];
      } else {
        y[r * D + 2 * k] = xe * c[2 * k] - xo * s[2 * k];
        y[r * D + 2 * k + 1] = xo * c[2 * k + 1] + xe * s[2 * k + 1];
      }
    }
  }
}

void rotate_row(variant v, std::int64_t head_dim, std::int64_t rotary_dim, const double* cos_row,
                const double* sin_row, const double* x, double* y) {
  const std::vector<const double*> c{cos_row}, s{sin_row};
  if (v == variant::neox) {
    rope_full(1, rotary_dim, x, c, s, y);
  } else {
    interleave_rope(1, rotary_dim, v == variant::gptj_split_half, x, c, s, y);
  }
  for (std::int64_t j = rotary_dim; j < head_dim; ++j) y[j] = x[j];
}

void linear_transpose(std::int64_t n, const std::function<void(const double*, double*)>& f,
                      const double* g, double* dx) {
  std::vector<double> e(static_cast<std::size_t>(n), 0.0), col(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    e[j] = 1.0;
    f(e.data(), col.data());
    e[j] = 0.0;
    double sum = 0;
    for (std::int64_t i = 0; i < n; ++i) sum += col[i] * g[i];
    dx[j] = sum;
  }
}

void qk_norm_rope_row_hf(dtype t, std::int64_t head_dim, std::int64_t rotary_dim, double eps,
                         const double* w, const double* cos_row, const double* sin_row,
                         const double* x, double* y) {
  auto f32 = [](double v) { return round_to(dtype::f32, v); };
  double sq = 0;
  for (std::int64_t j = 0; j < head_dim; ++j) sq += x[j] * x[j];
  const double mean = f32(sq / static_cast<double>(head_dim));
  const double r = f32(1.0 / std::sqrt(f32(mean + f32(eps))));
  std::vector<double> h(static_cast<std::size_t>(head_dim));
  for (std::int64_t j = 0; j < head_dim; ++j) {
    const double n = round_to(t, f32(x[j] * r));
    h[j] = round_to(t, f32(n * w[j]));
  }
  const std::int64_t half = rotary_dim / 2;
  for (std::int64_t j = 0; j < rotary_dim; ++j) {
    const double rotated = j < half ? -h[j + half] : h[j - half];
    const double a = round_to(t, f32(h[j] * cos_row[j]));
    const double b = round_to(t, f32(rotated * sin_row[j]));
    y[j] = round_to(t, f32(a + b));
  }
  for (std::int64_t j = rotary_dim; j < head_dim; ++j) y[j] = h[j];
}

void finite_difference_gradient(std::int64_t n, const std::function<double(const double*)>& f,
                                const double* x, double h, double* grad) {
  std::vector<double> p(x, x + n);
  for (std::int64_t j = 0; j < n; ++j) {
    const double step = h * std::max(1.0, std::fabs(x[j]));
    p[j] = x[j] + step;
    const double up = f(p.data());
    p[j] = x[j] - step;
    const double down = f(p.data());
    p[j] = x[j];
    grad[j] = (up - down) / (2 * step);
  }
}

}  // namespace tilerope::golden
