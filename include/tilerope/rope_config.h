#pragma once
/// \file rope_config.h
/// A model's RoPE settings, read from a Hugging Face config.json, and the frequencies they give:
/// HF transformers' rope types (default, linear, dynamic, yarn, longrope, llama3, proportional)
/// evaluated in
/// fp64 from the same formulas as `transformers.modeling_rope_utils`.
///
///     const rope_config c = rope_config::from_hf_json("Qwen2.5-7B-Instruct/config.json");
///     const rope_frequencies f = c.frequencies();           // inv_freq [rotary_dim/2]
///     const rope_table t = make_rope_table(131072, f);       // cos, sin * attention_scaling
///
/// Where HF versions differ, the behaviour is the one of current transformers (since PR #40320,
/// August 2025, which fixed issue #38224): a YaRN `factor` given in the config is used as
/// given, also when `original_max_position_embeddings` is there. Some earlier 4.x releases replaced
/// it by max_position_embeddings / original_max_position_embeddings, which for Qwen2.5's documented
/// YaRN block (factor 4, original 32768, max_position_embeddings 32768) gave factor 1 and no
/// scaling at all. docs/api.md has every formula.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tilerope/freqs.h"

namespace tilerope {

/// HF's `rope_type`. `none` is HF's "default": plain theta^(-2i/d). `proportional` (Gemma 4)
/// rotates the whole head and gives the frequencies past partial_rotary_factor a zero.
enum class rope_scaling_type { none, linear, dynamic, yarn, longrope, llama3, proportional };

/// "default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional".
std::string_view to_string(rope_scaling_type t);

/// The names above, and the legacy names HF maps: "su" -> longrope (Phi-3's first configs),
/// "mrope" -> none (Qwen2-VL's rope_scaling, whose frequencies are the default ones).
/// Anything else throws tilerope::error naming the value and the accepted names.
rope_scaling_type rope_scaling_type_from_string(std::string_view name);

/// The parameters of a scaled rope type, as HF's `rope_scaling` / `rope_parameters` hold them.
/// Fields a type does not use are ignored. Optional fields are those HF treats as "absent or
/// null": their defaults are derived as HF derives them (see each field).
struct rope_scaling {
  rope_scaling_type type = rope_scaling_type::none;
  /// linear, dynamic, llama3: required. yarn, longrope: absent means
  /// max_position_embeddings / original_max_position_embeddings. proportional: absent means 1.
  std::optional<double> factor;
  /// yarn, longrope, llama3: the pretraining context. Absent means max_position_embeddings.
  /// (from_hf_json takes a top-level `original_max_position_embeddings` first, as HF does for
  /// Phi-3.)
  std::optional<std::int64_t> original_max_position_embeddings;
  /// yarn, longrope: the factor on cos and sin. Absent means derived: yarn
  /// get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both mscales are
  /// non-zero, else get_mscale(factor), with get_mscale(s, m) = s <= 1 ? 1 : 0.1 m ln(s) + 1;
  /// longrope factor <= 1 ? 1 : sqrt(1 + ln(factor) / ln(original_max_position_embeddings)).
  std::optional<double> attention_factor;
  /// yarn: rotations bounding the ramp; absent or 0 means 32 and 1 (HF's `or 32`, `or 1`).
  std::optional<double> beta_fast;
  std::optional<double> beta_slow;
  /// yarn (DeepSeek): the mscale pair of the derived attention factor.
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  /// yarn: floor/ceil the correction range (HF's default true; gpt-oss sets false).
  bool truncate = true;
  /// longrope: one factor per frequency (rotary_dim/2 each); short up to
  /// original_max_position_embeddings positions, long past it.
  std::vector<double> short_factor;
  std::vector<double> long_factor;
  /// llama3: wavelength bounds original / low_freq_factor and original / high_freq_factor.
  std::optional<double> low_freq_factor;
  std::optional<double> high_freq_factor;
};

/// A model's RoPE settings. Build one from a config.json with from_hf_json, or by hand (then
/// frequencies() validates it).
struct rope_config {
  /// The largest head_dim accepted (real models use up to a few hundred).
  static constexpr int max_head_dim = 1 << 16;
  double theta = 10000.0;  ///< rope_theta (HF's default_theta when a config has none)
  int head_dim = 0;        ///< head_dim, else hidden_size / num_attention_heads, in [1, 65536]
  /// The rotated fraction of head_dim, in (0, 1]. For proportional, the fraction of the
  /// head_dim/2 frequencies that are non-zero (the rest rotate by 0).
  double partial_rotary_factor = 1.0;
  /// The rotated dims: int(head_dim * partial_rotary_factor), truncated as HF does
  /// (proportional: head_dim). 0 means "derive it"; from_hf_json fills it.
  int rotary_dim = 0;
  std::int64_t max_position_embeddings = 0;  ///< 0: not given (needed by some rope types)
  rope_scaling scaling;
  /// MRoPE (Qwen2-VL, Qwen3-VL): frequencies per axis (temporal, height, width), summing to
  /// rotary_dim/2; pass to mrope_axis_map with the layout mrope_interleaved says.
  std::optional<std::array<int, 3>> mrope_section;
  bool mrope_interleaved = false;  ///< Qwen3-VL's T H W T H W ... layout, else chunked
  std::string model_type;          ///< as the config says (informational)

  /// Reads a Hugging Face config.json. Throws tilerope::error, naming `path`, the key and the
  /// value, for an unreadable file, invalid JSON, a missing required key, a value of the wrong
  /// JSON type, or one out of range ("config.json: rope_scaling.factor (-2) must be > 0").
  ///
  /// Keys read (from `text_config` first when the config has one, Qwen2-VL / Qwen3-VL style,
  /// then from the top level):
  /// - rope_theta inside rope_parameters / rope_scaling, else at the top level, else 10000
  ///   (HF's default_theta);
  /// - head_dim, else hidden_size / num_attention_heads; DeepSeek-V2/V3's qk_rope_head_dim
  ///   replaces both (the rotated part of its heads, as HF's DeepseekV2Config sets head_dim);
  /// - partial_rotary_factor (top level, else inside rope_parameters), max_position_embeddings;
  /// - rope_scaling (older configs), else rope_parameters (transformers 5): rope_type, or the
  ///   legacy key "type", and the parameters of rope_scaling above; a Phi-3 config's legacy
  ///   "yarn" means longrope, as HF's Phi3Config maps it;
  /// - original_max_position_embeddings at the top level (Phi-3), which wins over the one
  ///   inside rope_scaling;
  /// - mrope_section and mrope_interleaved, inside rope_scaling / rope_parameters or at the top.
  static rope_config from_hf_json(const std::string& path);

  /// The same from JSON text; `origin` names it in error messages (e.g. the file name).
  static rope_config from_hf_json_text(const std::string& json, const std::string& origin);

  /// rotary_dim if set, else int(head_dim * partial_rotary_factor) (proportional: head_dim).
  int effective_rotary_dim() const;

  /// The inverse frequencies (rotary_dim/2 of them, fp64) and the attention scaling for a
  /// sequence covering positions [0, seq_len) (HF's max(position_ids) + 1):
  /// - dynamic: base theta * (factor * L / max_pos - (factor - 1))^(d / (d - 2)) with
  ///   L = max(seq_len, max_position_embeddings), so any seq_len up to max_position_embeddings
  ///   gives plain RoPE (HF resets to the original frequencies there);
  /// - longrope: long_factor when seq_len > original_max_position_embeddings, else short_factor;
  /// - proportional: theta^(-2i/head_dim) / factor for i < int(partial_rotary_factor *
  ///   head_dim // 2), then 0 up to head_dim/2;
  /// - the other types do not depend on seq_len.
  /// seq_len = 0 means "not known", HF's seq_len=None: the frequencies a model starts with
  /// (dynamic: plain RoPE; longrope: short_factor). Throws tilerope::error for seq_len < 0 or
  /// any invalid field (the message names it, e.g. "scaling.factor (-2) must be > 0").
  rope_frequencies frequencies(std::int64_t seq_len = 0) const;
};

}  // namespace tilerope
