#pragma once
/// \file qk_norm_rope.h
/// Qwen3's per-head RMSNorm of q and k fused with RoPE: one pass over q and k.
///
/// For every token and head, over the whole head_dim D, with w the weight of q or of k:
///
///     h = x * (mean(x^2) + eps)^(-1/2) * w          (dims >= rotary_dim too)
///     y = rope(h)                                    (as rope_apply, rope.h)
///
/// Shapes are those of rope_apply (q [T, Hq, D] or [B, S, Hq, D], k with its own head count);
/// q_weight and k_weight are [D], f32 | f16 | bf16. The positions and angles are rope_apply's.

#include <optional>
#include <string_view>

#include "tilerope/rope.h"
#include "tilerope/tensor.h"

namespace tilerope {

/// Where the fused kernel rounds to the x dtype.
enum class qk_norm_rounding {
  /// Everything in fp32 (normalise, weight, rotate), rounded once at the store: the most
  /// accurate result, within the golden's tolerance of the exact one.
  fp32_once,
  /// As HF transformers' Qwen3 computes in the x dtype: the normalised x rounded to it, the
  /// weight product rounded to it, then x*cos and rotate_half(x)*sin each rounded and their
  /// sum rounded. For f32 x this is ordinary fp32 arithmetic, no fused multiply-add. Only the
  /// mean of squares is summed in another order than PyTorch's: where that changes the
  /// normalisation by an ulp the result moves by about an ulp, more where x*cos and
  /// rotate_half(x)*sin nearly cancel.
  hf_qwen3,
};
std::string_view to_string(qk_norm_rounding r);
/// "fp32_once" or "hf_qwen3"; anything else throws tilerope::error.
qk_norm_rounding qk_norm_rounding_from_string(std::string_view name);

/// The normalisation's parameters.
struct qk_norm {
  tensor_view q_weight;                 ///< [D]
  std::optional<tensor_view> k_weight;  ///< [D]; required when k is given
  double eps = 1e-6;  ///< 0 or a normal fp32 value; added to the fp32 mean of squares, so a
                      ///< row of zeros with eps = 0 gives NaN (as in HF)
  qk_norm_rounding rounding = qk_norm_rounding::fp32_once;
};

/// RMSNorm then RoPE on q (and k), in place or into q_out / k_out. Every argument is validated
/// before anything is written. options.backward must be false: see qk_norm_rope_backward.
void qk_norm_rope_apply(rope_style style, const rope_tensors& x, const rope_positions& positions,
                        const rope_angles& angles, const qk_norm& norm,
                        const rope_options& options = {});

/// The tensors of the backward pass.
struct qk_norm_rope_grad_tensors {
  tensor_view q;                         ///< the forward's input q
  std::optional<tensor_view> k;          ///< the forward's input k
  tensor_view dq_out;                    ///< dL/d(q_out), q's shape and dtype
  std::optional<tensor_view> dk_out;     ///< dL/d(k_out), with k
  std::optional<tensor_view> dq;         ///< written: dL/dq; absent: written over dq_out
  std::optional<tensor_view> dk;         ///< written: dL/dk; absent: written over dk_out
  tensor_view dq_weight;                 ///< written: dL/d(q_weight), [D] f32 (not accumulated)
  std::optional<tensor_view> dk_weight;  ///< written: dL/d(k_weight), [D] f32, with k
};

/// Gradients of qk_norm_rope_apply (fp32_once) w.r.t. x and the weights, in fp32 (weight
/// gradients summed in fp32 over the heads of a token or of a run of up to 16 tokens, as
/// docs/api.md says, then in fp64). With g = dL/dy, r = (mean(x^2) + eps)^-1/2 and
/// dh = rope_backward(g):
///
///     dx_j = r w_j dh_j - x_j r^3 / D * sum_k(w_k dh_k x_k)
///     dw_j = sum over tokens and heads of dh_j x_j r
void qk_norm_rope_backward(rope_style style, const qk_norm_rope_grad_tensors& g,
                           const rope_positions& positions, const rope_angles& angles,
                           const qk_norm& norm, const rope_options& options = {});

}  // namespace tilerope
