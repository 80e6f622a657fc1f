#include "tilerope/freqs.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/enum_names.h"
#include "tilerope/error.h"

namespace tilerope {

namespace {
constexpr detail::enum_name<angle_precision> precision_names[] = {
    {angle_precision::accurate, "accurate"}, {angle_precision::hf_compat, "hf_compat"}};
}  // namespace

std::string_view to_string(angle_precision p) { return detail::name_of(precision_names, p); }

angle_precision angle_precision_from_string(std::string_view name) {
  return detail::value_named(precision_names, name, "angle precision");
}

namespace {
void check_theta_and_dim(int rotary_dim, double theta) {
  if (!std::isfinite(theta) || !(theta > 0)) {
    throw error("theta (" + std::to_string(theta) + ") must be finite and > 0");
  }
  if (rotary_dim <= 0 || rotary_dim % 2 != 0) {
    throw error("rotary_dim (" + std::to_string(rotary_dim) + ") must be even and > 0");
  }
}

void check_table_type(dtype t) {
  if (!is_floating(t)) {
    throw error("table dtype (" + std::string(to_string(t)) + ") must be f32, f16 or bf16");
  }
}

// The shortest decimal that reads back as `v` ("0", "1.25", "nan").
std::string shortest(double v) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (!std::isfinite(v) || std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void check_max_pos(std::int64_t max_pos) {
  if (max_pos < 0) throw error("max_pos (" + std::to_string(max_pos) + ") must be >= 0");
}

// Fills rows [0, max_pos) of both tables; angle(p, i) gives (cos, sin) as fp64.
template <class AngleFn>
rope_table fill_table(std::int64_t max_pos, std::int64_t half, dtype table_type, AngleFn angle) {
  rope_table t{tensor(table_type, {max_pos, half}), tensor(table_type, {max_pos, half})};
  void* c = t.cos.data();
  void* s = t.sin.data();
#pragma omp parallel for schedule(static) if (max_pos * half > 65536)
  for (std::int64_t p = 0; p < max_pos; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      const auto [cv, sv] = angle(p, i);
      const auto at = static_cast<std::size_t>(p * half + i);
      store_from_f64(c, table_type, at, cv);
      store_from_f64(s, table_type, at, sv);
    }
  }
  return t;
}
}  // namespace

std::vector<double> rope_inv_freq(int rotary_dim, double theta) {
  check_theta_and_dim(rotary_dim, theta);
  std::vector<double> f(static_cast<std::size_t>(rotary_dim / 2));
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / rotary_dim);
  }
  return f;
}

std::vector<float> rope_inv_freq_hf(int rotary_dim, double theta) {
  check_theta_and_dim(rotary_dim, theta);
  std::vector<float> f(static_cast<std::size_t>(rotary_dim / 2));
  const float base = static_cast<float>(theta);
  for (std::size_t i = 0; i < f.size(); ++i) {
    // fp32 at every step, as torch evaluates 1.0 / (base ** (arange(0, d, 2).float() / d)).
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float power = static_cast<float>(std::pow(static_cast<double>(base), exponent));
    f[i] = 1.0f / power;
  }
  return f;
}

rope_table make_rope_table(std::int64_t max_pos, int rotary_dim, double theta, dtype table_type,
                           angle_precision precision) {
  check_theta_and_dim(rotary_dim, theta);
  check_table_type(table_type);
  check_max_pos(max_pos);
  if (precision == angle_precision::accurate) {
    return make_rope_table(max_pos, rope_inv_freq(rotary_dim, theta), table_type);
  }
  const std::vector<float> inv = rope_inv_freq_hf(rotary_dim, theta);
  return fill_table(max_pos, static_cast<std::int64_t>(inv.size()), table_type,
                    [&](std::int64_t p, std::int64_t i) {
                      const float angle = static_cast<float>(p) * inv[static_cast<std::size_t>(i)];
                      // cos/sin of the fp32 angle rounded to fp32, then (by the caller's
                      // store) to the table type: the two roundings HF performs.
                      const double a = angle;
                      return std::pair<double, double>{static_cast<float>(std::cos(a)),
                                                       static_cast<float>(std::sin(a))};
                    });
}

rope_table make_rope_table(std::int64_t max_pos, const std::vector<double>& inv_freq,
                           dtype table_type) {
  check_table_type(table_type);
  check_max_pos(max_pos);
  if (inv_freq.empty()) throw error("inv_freq must not be empty");
  return fill_table(max_pos, static_cast<std::int64_t>(inv_freq.size()), table_type,
                    [&](std::int64_t p, std::int64_t i) {
                      const double a =
                          static_cast<double>(p) * inv_freq[static_cast<std::size_t>(i)];
                      return std::pair<double, double>{std::cos(a), std::sin(a)};
                    });
}

rope_table make_rope_table(std::int64_t max_pos, const rope_frequencies& f, dtype table_type) {
  check_table_type(table_type);
  check_max_pos(max_pos);
  if (f.inv_freq.empty()) throw error("inv_freq must not be empty");
  for (std::size_t i = 0; i < f.inv_freq.size(); ++i) {
    if (!std::isfinite(f.inv_freq[i])) {
      throw error("inv_freq[" + std::to_string(i) + "] (" + shortest(f.inv_freq[i]) +
                  ") must be finite");
    }
  }
  const double s = f.attention_scaling;
  if (!std::isfinite(s) || !(s > 0)) {
    throw error("attention_scaling (" + shortest(s) + ") must be finite and > 0");
  }
  return fill_table(max_pos, static_cast<std::int64_t>(f.inv_freq.size()), table_type,
                    [&](std::int64_t p, std::int64_t i) {
                      const double a =
                          static_cast<double>(p) * f.inv_freq[static_cast<std::size_t>(i)];
                      // Scaled in fp64, then rounded once by the store.
                      return std::pair<double, double>{std::cos(a) * s, std::sin(a) * s};
                    });
}

}  // namespace tilerope
