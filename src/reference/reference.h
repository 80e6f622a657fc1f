#pragma once
// The reference kernels: every RoPE variant of the source material, written in the tile layer
// the way the article writes it. They are the readable spec; the production kernels in
// src/cpu are checked against the same fp64 golden.

#include <array>
#include <optional>

#include "tilerope/tensor.h"
#include "tilerope/tile.h"

namespace tilerope::reference {

struct tile_config {
  std::optional<tile::shape_t> tile;  ///< overrides each kernel's default tile shape
  std::size_t ub_bytes = 192 * 1024;
};

/// The skeleton (rope.md): a, cos, sin, out [B, S, D] (any rank >= 2: the first dim is
/// looped, the rest is one tile), computed in a's dtype. Default tile: [1, S, D].
tile::kernel_report rope_skeleton(const tensor_view& a, const tensor_view& cos,
                                  const tensor_view& sin, const tensor_view& out,
                                  const tile_config& cfg = {});

/// Vision RoPE: q, k [S, N, D]; cos, sin [S, D] (full head_dim); q and k in one kernel,
/// fp32 inside, one cast back. Default tile: [1, N, D].
tile::kernel_report vision_rope(const tensor_view& q, const tensor_view& k, const tensor_view& cos,
                                const tensor_view& sin, const tensor_view& q_out,
                                const tensor_view& k_out, const tile_config& cfg = {});

/// MRoPE: q [B, Hq, S, D], k [B, Hk, S, D], cos, sin [3, B, S, D]; the section expansion
/// (chunks of mrope_section*2 taken from plane i % 3) happens in the kernel; q and k in one
/// call. Default tile: [1, Hq, 1, D].
tile::kernel_report mrope(const tensor_view& q, const tensor_view& k, const tensor_view& cos,
                          const tensor_view& sin, std::array<int, 3> mrope_section,
                          const tensor_view& q_out, const tensor_view& k_out,
                          const tile_config& cfg = {});

/// Qwen3 QK RMSNorm + RoPE: x [S, N, D] bf16, weight [D], cos, sin [S, D]; per token and head
/// h = x * rsqrt(mean(x^2) + eps) * w, then the half-table rotation
/// o1 = xl*cos_l - xr*sin_l, o2 = xr*cos_l + xl*sin_l; BS_TILE = 8 with valid_shape tails,
/// fp32 inside, one cast to x's dtype. Default tile: [8, 4, D/2].
tile::kernel_report qk_norm_rope(const tensor_view& x, const tensor_view& weight,
                                 const tensor_view& cos, const tensor_view& sin, double eps,
                                 const tensor_view& out, const tile_config& cfg = {});

enum class interleave_output { interleaved, split_half };
enum class interleave_path { deinterleave, gathermask };

/// Interleaved RoPE: x [B, N, S, D] (even/odd pairs), cos, sin [B, 1, S or 1, D].
///   interleaved out (positional tables): y[2k] = xe*cos[2k] - xo*sin[2k],
///                                        y[2k+1] = xo*cos[2k+1] + xe*sin[2k+1]
///   split-half out (half-pair tables):   y[k] = xe*cos[k] - xo*sin[k],
///                                        y[D/2+k] = xe*sin[D/2+k] + xo*cos[D/2+k]
/// xe, xo come from deinterleave or from gathermask(1 | 2). fp32 inside.
/// Default tile: [1, 8, 8, D/2].
tile::kernel_report interleave_rope(const tensor_view& x, const tensor_view& cos,
                                    const tensor_view& sin, interleave_output output,
                                    interleave_path path, const tensor_view& out,
                                    const tile_config& cfg = {});

}  // namespace tilerope::reference
