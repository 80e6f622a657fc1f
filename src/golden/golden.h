#pragma once
// The fp64 golden: plain scalar loops straight from the formulas. It shares no code with the
// kernels (only the dtype enum), so that agreement between the two means something.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tilerope/dtype.h"

namespace tilerope::golden {

// inv_freq[i] = theta^(-2i/rotary_dim), fp64.
std::vector<double> inv_freq(std::int64_t rotary_dim, double theta);

// cos/sin rows for the given positions: out[t * half + i] = cos(pos[t] * inv_freq[i]).
void angles(const std::vector<double>& inv_freq, const std::vector<std::int64_t>& positions,
            std::vector<double>& cos, std::vector<double>& sin);

// HF transformers' fp32 angles: inv_freq = fp32(1 / fp32(theta ^ fp32(2i/d))), angle =
// fp32(fp32(p) * inv_freq), cos/sin rounded to fp32 and then to the x dtype (f32, f16 or bf16,
// each rounded to nearest even by this file's own conversions).
void angles_hf(std::int64_t rotary_dim, double theta, const std::vector<std::int64_t>& positions,
               dtype round_to, std::vector<double>& cos, std::vector<double>& sin);

// fp64 -> the nearest value of `t`, ties to even (the golden's own rounding).
double round_to(dtype t, double v);

// The tolerance table: |y - golden| <= atol + rtol * |golden| for outputs of dtype t.
//   f32 : atol = rtol = 1e-5   (fp32 arithmetic on |x| <~ 5: a few ulp)
//   f16 : atol = rtol = 1e-3   (about one f16 ulp: 2^-10 relative)
//   bf16: atol = rtol = 8e-3   (about one bf16 ulp: 2^-7 relative)
struct tolerance {
  double atol, rtol;
};
tolerance tolerance_for(dtype t);

// ---- the source material's variants, with full-width tables as its goldens take them -------

// y = x * cos + rotate_half(x) * sin on rows of D, rotate_half(x) = cat(-x2, x1); row r uses
// the table rows cos_rows[r], sin_rows[r] (D entries each).
void rope_full(std::int64_t rows, std::int64_t D, const double* x,
               const std::vector<const double*>& cos_rows,
               const std::vector<const double*>& sin_rows, double* y);

// MRoPE's table for one token: chunk i of widths section*2 = [s0 s1 s2 s0 s1 s2] taken from
// plane i % 3 (planes[p] points at that token's D entries).
void mrope_row(const std::int64_t section[3], std::int64_t D, const double* const planes[3],
               double* out);

// MRoPE's position axis for frequency i (0 temporal, 1 height, 2 width). Chunked (Qwen2-VL):
// the first section[0] frequencies are temporal, the next section[1] height, the rest width.
// Interleaved (Qwen3-VL): T H W T H W ..., height only below 3*section[1], width below
// 3*section[2].
int mrope_axis(const int section[3], bool interleaved, int i);

// Qwen2-VL vision RoPE, frequency i of head_dim/2: (axis, inv_freq) = (0 row | 1 column,
// theta^(-(2 (i mod D/4)) / (D/2))).
std::pair<int, double> vision_2d_frequency(std::int64_t head_dim, double theta, std::int64_t i);

// h = x * (mean(x^2) + eps)^-1/2 * w on rows of D.
void rms_norm(std::int64_t rows, std::int64_t D, const double* x, const double* w, double eps,
              double* y);

// Interleaved pairs (xe, xo) = (x[2k], x[2k+1]). interleaved output, positional tables:
//   y[2k] = xe cos[2k] - xo sin[2k],  y[2k+1] = xo cos[2k+1] + xe sin[2k+1]
// split-half output, half-pair tables:
//   y[k] = xe cos[k] - xo sin[k],     y[D/2+k] = xe sin[D/2+k] + xo cos[D/2+k]
void interleave_rope(std::int64_t rows, std::int64_t D, bool split_half_output, const double* x,
                     const std::vector<const double*>& cos_rows,
                     const std::vector<const double*>& sin_rows, double* y);

// ---- every variant on rows, with full-width cos/sin rows (as HF passes position_embeddings) -

// Which pairs a variant rotates and where it writes them: neox (x*cos + rotate_half(x)*sin),
// gptj (adjacent pairs, positional tables), gptj_split_half (adjacent pairs in, split-half out,
// half-pair tables: interleave_rope's split-half form).
enum class variant { neox, gptj, gptj_split_half };

// One row of head_dim: the first rotary_dim dims by the variant's formula with cos_row and
// sin_row (rotary_dim entries each), the rest copied.
void rotate_row(variant v, std::int64_t head_dim, std::int64_t rotary_dim, const double* cos_row,
                const double* sin_row, const double* x, double* y);

// The transpose of a linear map f of rows of n: dx = J^T g, J's column j being f(e_j). The
// gradient of sum(g * f(x)) w.r.t. x, exact for the rotations (linear in x).
void linear_transpose(std::int64_t n, const std::function<void(const double*, double*)>& f,
                      const double* g, double* dx);

// Qwen3's RMSNorm then the neox rotation with HF transformers' roundings in dtype t:
//   r = fp32(1 / sqrt(fp32(mean(x^2)) + eps)), n = t(fp32(x r)), h = t(fp32(n w)),
//   y = t(t(h * cos) + t(rotate_half(h) * sin))         (cos, sin: full rows, already in t)
void qk_norm_rope_row_hf(dtype t, std::int64_t head_dim, std::int64_t rotary_dim, double eps,
                         const double* w, const double* cos_row, const double* sin_row,
                         const double* x, double* y);

// Central finite differences of a scalar function of n variables at x, step h * max(1, |x_j|).
void finite_difference_gradient(std::int64_t n, const std::function<double(const double*)>& f,
                                const double* x, double h, double* grad);

}  // namespace tilerope::golden
