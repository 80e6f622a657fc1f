#pragma once
/// \file apply_options.h
/// `tilerope apply`'s flags as given, and what they ask for once checked against each other
/// (internal to the apply files).

#include <CLI/CLI.hpp>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tilerope/dtype.h"
#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"

namespace tilerope::cli {

/// The library's RoPE variants, as `--variant` names them.
enum class apply_variant { rope, vision, mrope, qk_norm_rope, interleave };

/// The `--variant` name of `v`.
std::string name_of(apply_variant v);

/// A flag and the variants that read it; any other variant given it is an error.
struct flag_rule {
  std::string name;
  const CLI::Option* option;
  std::vector<apply_variant> used_by;
  std::string note;  // why the others do not use it, when that helps
};

/// The flags of `tilerope apply`, as given.
struct apply_args {
  std::string variant_name = "rope";
  std::string q, k, positions, style, layout = "thd", dtype_name, table = "none";
  std::string precision = "accurate", out_q, out_k;
  std::string cos, sin, config;
  std::string section, section_layout = "chunked";
  std::string q_weight, k_weight, rounding = "fp32_once";
  std::string grad_q, grad_k, out_q_weight_grad, out_k_weight_grad;
  std::string output_layout = "interleaved";
  std::int64_t offset = 0;
  double theta = 0, eps = 1e-6;
  int rotary_dim = 0;
  bool backward = false;
  std::vector<flag_rule> rules;

  bool given(std::string_view flag) const {
    for (const auto& r : rules) {
      if (r.name == flag) return r.option->count() > 0;
    }
    throw error("internal: no flag " + std::string(flag));
  }
};

/// What the flags ask for: each value parsed, the variant chosen, and every combination
/// checked, before any file is read.
struct apply_request {
  explicit apply_request(const apply_args& flags) : args(flags) {}

  const apply_args& args;
  apply_variant variant = apply_variant::rope;
  bool rows = false;           ///< --cos/--sin: the angles are per-token rows
  bool norm_backward = false;  ///< qk-norm-rope --backward
  rope_style style = rope_style::neox;
  std::string layout;  ///< thd | bshd | bhsd
  std::string table;   ///< none | f32 | x
  angle_precision precision = angle_precision::accurate;
  std::optional<dtype> forced_dtype;  ///< --dtype
  mrope_layout section_layout = mrope_layout::chunked;
  std::optional<std::array<int, 3>> section;
  rope_options options;  ///< output_layout (rotary_dim needs q: see apply_call)
  qk_norm norm;          ///< eps and rounding (the weights: see apply_call)
};

/// Checks every flag given against the variant and the others, and parses the values. Reads
/// no file. Every problem is a tilerope::error naming the flag.
apply_request parse_apply_args(const apply_args& args);

}  // namespace tilerope::cli
