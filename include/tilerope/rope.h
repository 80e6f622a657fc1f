#pragma once
/// \file rope.h
/// The production rotary position embedding: q and k rotated in one call.
///
/// Shapes (strides in elements; the last dim must be contiguous):
///
///     q : [T, Hq, D]      or [B, S, Hq, D]       f32 | f16 | bf16
///     k : [T, Hk, D]      or [B, S, Hk, D]       same dtype as q, Hk may differ from Hq (GQA)
///     positions : [T]     or [S] (shared by the batch) or [B, S]        i32 | i64
///     cos, sin  : [max_pos, rotary_dim/2]         f32 | f16 | bf16 (see freqs.h)
///
/// The rank-4 form covers both BSHD and BHSD buffers by its strides:
///
///     BSHD buffer [B, S, H, D]: shape {B, S, H, D}, strides {S*H*D, H*D, D, 1}
///     BHSD buffer [B, H, S, D]: shape {B, S, H, D}, strides {H*S*D, D, S*D, 1}
///     THD  buffer [T, H, D]   : shape {T, H, D},    strides {H*D, D, 1}
///
/// For each token with position p and each head, with c_i = cos(p * inv_freq_i),
/// s_i = sin(p * inv_freq_i), r = rotary_dim, and dims >= r passed through unchanged:
///
///     neox (rotate half):   y[i]     = x[i] c_i - x[i + r/2] s_i
///                           y[i+r/2] = x[i + r/2] c_i + x[i] s_i          i < r/2
///     gptj (adjacent pairs): y[2i]   = x[2i] c_i - x[2i+1] s_i
///                           y[2i+1]  = x[2i+1] c_i + x[2i] s_i           i < r/2
///
///     gptj, split_half output: y[i] = x[2i] c_i - x[2i+1] s_i
///                           y[i+r/2] = x[2i+1] c_i + x[2i] s_i           i < r/2
///
/// Per-token rows (rope_angles::from_token_rows) may give the second element of each pair its
/// own cos/sin (full-width rows, as HF's `x * cos + rotate_half(x) * sin` with any cos/sin).
/// `backward` applies the transpose of the forward, its gradient w.r.t. x: the inverse
/// rotation (s_i -> -s_i). See docs/variants.md for every variant.
/// All arithmetic is fp32; f16 / bf16 are converted at load and rounded once at store.

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tilerope/freqs.h"
#include "tilerope/tensor.h"

namespace tilerope {

/// Which elements a frequency rotates together.
enum class rope_style {
  neox,  ///< halves: (x[i], x[i + r/2]), "rotate_half" (Llama, Qwen, Mistral, HF default)
  gptj,  ///< adjacent pairs: (x[2i], x[2i+1]), interleaved (GPT-J, ChatGLM, Llama's Meta code)
};

std::string_view to_string(rope_style s);
/// "neox" or "gptj"; anything else throws tilerope::error.
rope_style rope_style_from_string(std::string_view name);

/// Where the position of each token comes from.
struct rope_positions {
  enum class source { ids, offset, axes, none };
  source from = source::offset;
  tensor_view ids;  ///< i32 | i64: [T] for rank-3 x, [S] or [B, S] for rank-4 x; axes: [A, T]
  std::int64_t start = 0;  ///< offset: token t (rank 3) or s (rank 4) has position start + t
  std::vector<int> axis_of_frequency;  ///< axes: frequency i takes its position from axis [i]

  /// Position ids per token.
  static rope_positions from_ids(const tensor_view& ids);
  /// Consecutive positions start, start + 1, ... (decode at a KV-cache offset).
  static rope_positions from_offset(std::int64_t start);
  /// Several positions per token, ids [A, T] (rank-3 x only), and for each of the rotary_dim/2
  /// frequencies the axis it reads: angle_i = ids[axis_of_frequency[i], t] * inv_freq_i.
  /// MRoPE (Qwen2-VL, Qwen3-VL) is this with A = 3 (temporal, height, width) and the map of
  /// mrope_axis_map.
  static rope_positions from_axes(const tensor_view& ids, std::vector<int> axis_of_frequency);
  /// No positions: the angles are rows per token (rope_angles::from_token_rows).
  static rope_positions none();
};

/// How mrope_section lays the three position axes over the frequencies.
enum class mrope_layout {
  chunked,      ///< [T..T H..H W..W], sections in order (Qwen2-VL, Qwen2.5-VL)
  interleaved,  ///< [T H W T H W ... T..T] (Qwen3-VL): H at i % 3 == 1 below 3 * section[1],
                ///< W at i % 3 == 2 below 3 * section[2], T elsewhere
};
std::string_view to_string(mrope_layout l);
mrope_layout mrope_layout_from_string(std::string_view name);

/// The axis (0 temporal, 1 height, 2 width) of each of the sum(section) frequencies.
/// Throws tilerope::error for a negative section entry.
std::vector<int> mrope_axis_map(const std::array<int, 3>& section, mrope_layout layout);

/// Qwen2-VL's vision-tower RoPE (also Qwen2.5-VL's): each patch has a (row, col) position;
/// head_dim/4 frequencies theta^(-2j / (head_dim/2)) serve each axis. Frequency i of the
/// head_dim/2 reads the row for i < head_dim/4 and the column after, with
/// inv_freq[i] = theta^(-2 (i mod head_dim/4) / (head_dim/2)); neox style over the whole head.
/// Use with rope_positions::from_axes(ids [2, T], axis_of_frequency) and
/// rope_angles::from_inv_freq(inv_freq) (or make_rope_table(max_pos, inv_freq)).
struct vision_2d_frequencies {
  std::vector<double> inv_freq;        ///< head_dim/2 entries
  std::vector<int> axis_of_frequency;  ///< 0 (row) or 1 (column), head_dim/2 entries
};
/// Throws tilerope::error unless head_dim is a positive multiple of 4 and theta is finite > 0.
vision_2d_frequencies qwen2vl_vision_frequencies(int head_dim, double theta = 10000.0);

/// Where cos/sin come from.
struct rope_angles {
  enum class source { table, inv_freq, token_rows };
  source from = source::inv_freq;
  tensor_view cos;               ///< table: [max_pos, rotary_dim/2]; token_rows: see below
  tensor_view sin;               ///< same shape and dtype as cos
  std::vector<double> inv_freq;  ///< computed: rotary_dim/2 frequencies
  angle_precision precision = angle_precision::accurate;
  double attention_scaling = 1.0;      ///< computed angles: cos and sin are multiplied by it
  std::vector<int> axis_of_frequency;  ///< token_rows with planes: the plane of frequency i

  /// Rows of precomputed tables, looked up by position (see make_rope_table).
  static rope_angles from_table(const tensor_view& cos, const tensor_view& sin);
  /// cos/sin computed per token from inv_freq = theta^(-2i/rotary_dim). The frequencies are
  /// derived from rotary_dim at the call. Throws for a non-finite theta or theta <= 0.
  static rope_angles from_theta(double theta,
                                angle_precision precision = angle_precision::accurate);
  /// cos/sin computed per token from explicit frequencies (rotary_dim/2 of them).
  static rope_angles from_inv_freq(std::vector<double> inv_freq,
                                   angle_precision precision = angle_precision::accurate);
  /// cos/sin computed per token from a model's frequencies, multiplied by its attention
  /// scaling (YaRN, LongRoPE; see rope_config.h).
  static rope_angles from_frequencies(const rope_frequencies& f,
                                      angle_precision precision = angle_precision::accurate);
  /// One precomputed row per token, as HF models pass `position_embeddings` and the source
  /// material's kernels take cos/sin. Call rope_apply without positions. Width w is
  /// rotary_dim (full rows, each column used as given) or rotary_dim/2 (one entry per
  /// frequency):
  ///
  ///     rank-3 x [T, H, D]:     cos [T, w],     or planes [A, T, w]
  ///     rank-4 x [B, S, H, D]:  cos [B, S, w] or [S, w] (shared by the batch),
  ///                             or planes [A, B, S, w] / [A, S, w]
  ///
  /// With planes, frequency i reads plane axis_of_frequency[i]: MRoPE's precomputed
  /// [3, B, S, D] tables are planes with mrope_axis_map(section, layout). A full row is split
  /// between the two elements of each pair by the output layout: columns (i, i + r/2) for
  /// halves (neox, split-half output), (2i, 2i+1) for adjacent pairs (gptj):
  ///
  ///     y_first  = x_first  cos[col_first]  - x_second sin[col_first]
  ///     y_second = x_second cos[col_second] + x_first  sin[col_second]
  static rope_angles from_token_rows(const tensor_view& cos, const tensor_view& sin,
                                     std::vector<int> axis_of_frequency = {});

  double theta = 0;  ///< set by from_theta; 0 otherwise
};

/// The tensors of one call. Absent outputs mean in place. An output may be exactly its input
/// (same pointer, shape and strides); any other overlap with an input is an error.
struct rope_tensors {
  tensor_view q;
  std::optional<tensor_view> k;
  std::optional<tensor_view> q_out;
  std::optional<tensor_view> k_out;
};

/// Where the two rotated elements of each pair are written.
enum class rope_output_layout {
  as_input,    ///< where they were read: halves for neox, adjacent pairs for gptj
  split_half,  ///< first elements in [0, r/2), second in [r/2, r): with gptj input this is
               ///< the NPU-compatible interleaved RoPE (ops-transformer's InterleaveRope)
};
std::string_view to_string(rope_output_layout l);
/// "as_input" (also "interleaved") or "split_half" (also "split-half").
rope_output_layout rope_output_layout_from_string(std::string_view name);

struct rope_options {
  int rotary_dim = 0;     ///< dims rotated, even, <= head_dim; 0 means head_dim
  bool backward = false;  ///< the gradient w.r.t. x of the forward (its transpose): the inverse
                          ///< rotation; for split_half it reads halves and writes pairs back
  rope_output_layout output_layout = rope_output_layout::as_input;
  /// CPU threads for this call, in [0, 4096]; 0 means num_threads(). Results do not depend on
  /// it, except for the summation order of qk_norm_rope_backward's weight gradients.
  int num_threads = 0;
};

/// Rotates q (and k) by their positions. Every argument is validated first; a
/// tilerope::error naming the argument and values is thrown before any output is written.
/// T = 0 (or B = 0 or S = 0) is a valid no-op.
void rope_apply(rope_style style, const rope_tensors& x, const rope_positions& positions,
                const rope_angles& angles, const rope_options& options = {});

/// The same with per-token rows (rope_angles::from_token_rows), which need no positions.
void rope_apply(rope_style style, const rope_tensors& x, const rope_angles& angles,
                const rope_options& options = {});

}  // namespace tilerope
