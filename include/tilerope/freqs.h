#pragma once
/// \file freqs.h
/// Rotary frequencies and cos/sin tables.
///
///     inv_freq[i] = theta^(-2i / rotary_dim),      i in [0, rotary_dim/2)
///     angle(p, i) = p * inv_freq[i]
///     cos_table[p][i] = cos(angle(p, i)),  sin_table[p][i] = sin(angle(p, i))
///
/// Tables are half width, [max_pos, rotary_dim/2]: column i serves both elements that
/// frequency i rotates (dims i and i + rotary_dim/2 in neox style, 2i and 2i+1 in gptj style).

#include <cstdint>
#include <string_view>
#include <vector>

#include "tilerope/dtype.h"
#include "tilerope/tensor.h"

namespace tilerope {

/// How angles are formed.
enum class angle_precision {
  /// p * inv_freq in fp64 and sin/cos in fp64 (argument reduction included), rounded once to
  /// the table type: every position up to 2^24 keeps full fp32 accuracy (<= 0.5 ulp + 1e-9).
  accurate,
  /// As HF transformers does: inv_freq in fp32 (1 / fp32(theta ^ fp32(2i/d))), the angle as an
  /// fp32 product fp32(p) * inv_freq, cos/sin of that fp32 angle, then rounded to the table
  /// type. The fp32 angle carries an absolute error up to ulp(p * inv_freq) / 2, about
  /// 2.4e-4 rad at p = 4096 and 3.9e-3 rad at p = 65536 for the fastest frequency.
  hf_compat,
};

std::string_view to_string(angle_precision p);
angle_precision angle_precision_from_string(std::string_view name);

/// inv_freq[i] = theta^(-2i/rotary_dim) in fp64, i in [0, rotary_dim/2).
/// Throws tilerope::error unless theta is finite and > 0 and rotary_dim is even and > 0.
std::vector<double> rope_inv_freq(int rotary_dim, double theta);

/// HF transformers' fp32 inv_freq: 1 / fp32(theta ^ fp32(2i / rotary_dim)), rounded to fp32.
std::vector<float> rope_inv_freq_hf(int rotary_dim, double theta);

/// The frequencies a model rotates by, and the factor its scaled variants (YaRN, LongRoPE)
/// multiply cos and sin by ("attention scaling"; 1 for plain RoPE).
struct rope_frequencies {
  std::vector<double> inv_freq;    ///< rotary_dim/2 entries, fp64
  double attention_scaling = 1.0;  ///< cos and sin are both multiplied by it
};

/// A pair of half-width tables, cos and sin: each [max_pos, rotary_dim/2] of `table_type`.
struct rope_table {
  tensor cos;
  tensor sin;
};

/// Builds cos/sin tables for positions [0, max_pos). `table_type` is f32 (default), f16 or
/// bf16 (e.g. the x dtype, as HF keeps its tables). Each entry is rounded once.
/// Throws tilerope::error for max_pos < 0, a bad rotary_dim or theta, or an integer table type.
rope_table make_rope_table(std::int64_t max_pos, int rotary_dim, double theta,
                           dtype table_type = dtype::f32,
                           angle_precision precision = angle_precision::accurate);

/// The same, from explicit fp64 frequencies (scaled RoPE variants build their own).
rope_table make_rope_table(std::int64_t max_pos, const std::vector<double>& inv_freq,
                           dtype table_type = dtype::f32);

/// Tables for a scaled RoPE variant (rope_config::frequencies() gives `f`): [max_pos, n] with
/// n = f.inv_freq.size(),
///
///     cos_table[p][i] = cos(p * inv_freq[i]) * attention_scaling
///     sin_table[p][i] = sin(p * inv_freq[i]) * attention_scaling
///
/// computed in fp64 and rounded once to `table_type` (f32, f16 or bf16), so rope_apply with
/// these tables gives HF's x * cos * s + rotate(x) * sin * s. Throws tilerope::error for
/// max_pos < 0, an empty inv_freq, a non-finite inv_freq entry, an attention_scaling that is
/// not finite and > 0, or an integer table type.
rope_table make_rope_table(std::int64_t max_pos, const rope_frequencies& f,
                           dtype table_type = dtype::f32);

}  // namespace tilerope
