#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "npy.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"
#include "tilerope/rope_config.h"

namespace tilerope::cli {

namespace {

// The library's RoPE variants, as `--variant` names them.
enum class variant { rope, vision, mrope, qk_norm_rope, interleave };

constexpr std::array<std::pair<variant, std::string_view>, 5> variant_names = {{
    {variant::rope, "rope"},
    {variant::vision, "vision"},
    {variant::mrope, "mrope"},
    {variant::qk_norm_rope, "qk-norm-rope"},
    {variant::interleave, "interleave"},
}};

std::string name_of(variant v) {
  for (const auto& [x, name] : variant_names) {
    if (x == v) return std::string(name);
  }
  return "?";
}

// A flag and the variants that read it; any other variant given it is an error.
struct flag_rule {
  std::string name;
  const CLI::Option* option;
  std::vector<variant> used_by;
  std::string note;  // why the others do not use it, when that helps
};

// The flags of `tilerope apply`, as given.
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

// The largest table the CLI builds (cos and sin together); past it, --table none is the way.
constexpr std::int64_t max_table_bytes = std::int64_t{4} << 30;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// `value` if it is one of `names`, else an error naming the flag, the value and the choices.
const std::string& one_of(const std::string& flag, const std::string& value,
                          const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), value) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw error(flag + " '" + value + "' is not one of " + list);
  }
  return value;
}

variant variant_from_name(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& [v, n] : variant_names) names.emplace_back(n);
  one_of("--variant", name, names);
  for (const auto& [v, n] : variant_names) {
    if (n == name) return v;
  }
  return variant::rope;
}

// Every flag given is one the variant reads.
void check_flags_for(variant v, const apply_args& a) {
  for (const auto& r : a.rules) {
    if (r.option->count() == 0 ||
        std::find(r.used_by.begin(), r.used_by.end(), v) != r.used_by.end()) {
      continue;
    }
    if (r.used_by.size() == 1) {
      throw error(r.name + " is only for --variant " + name_of(r.used_by[0]) + r.note);
    }
    std::string list;
    for (variant u : r.used_by) list += (list.empty() ? "" : ", ") + name_of(u);
    throw error(r.name + " is not used by --variant " + name_of(v) + " (only by " + list + ")" +
                r.note);
  }
}

// The dtype of a float file: f4 -> f32, f2 -> f16, u2 -> bf16 (only with --dtype bf16).
dtype float_dtype(const npy_array& a, const std::string& path, std::optional<dtype> forced) {
  if (a.descr == "<f2") return dtype::f16;
  if (a.descr == "<u2") {
    if (forced != dtype::bf16) {
      throw error(path + ": dtype '<u2' is read as bf16 bits only with --dtype bf16");
    }
    return dtype::bf16;
  }
  return dtype::f32;
}

// The dtype q or k holds, checked against --dtype.
dtype x_dtype(const npy_array& a, const std::string& path, std::optional<dtype> forced) {
  const dtype t = float_dtype(a, path, forced);
  if (forced && *forced != t) {
    throw error(path + ": holds " + std::string(to_string(t)) + " ('" + a.descr +
                "') but --dtype is " + std::string(to_string(*forced)));
  }
  return t;
}

// The rope_apply view of a q or k file: thd [T, H, D] as it is, bshd [B, S, H, D] as it is,
// bhsd [B, H, S, D] as shape {B, S, H, D} with strides {H*S*D, D, S*D, 1}.
tensor_view x_view(void* data, dtype t, const std::vector<std::int64_t>& s,
                   const std::string& layout, const std::string& path, const char* role) {
  const std::size_t rank = layout == "thd" ? 3 : 4;
  if (s.size() != rank) {
    throw error(path + ": " + role + " shape " + shape_text(s) + " has rank " +
                std::to_string(s.size()) + "; --layout " + layout + " needs " +
                (layout == "thd"    ? "[T, H, D]"
                 : layout == "bshd" ? "[B, S, H, D]"
                                    : "[B, H, S, D]"));
  }
  if (layout != "bhsd") return tensor_view::contiguous(data, t, s);
  const std::int64_t b = s[0], h = s[1], seq = s[2], d = s[3];
  return tensor_view(data, t, {b, seq, h, d}, {h * seq * d, d, seq * d, 1});
}

// Rows a cos/sin table needs for these positions, validating what sizing it depends on
// (non-negative positions, no overflow); rope_apply checks everything else.
std::int64_t table_rows(const rope_positions& p, const tensor_view& q) {
  const std::int64_t batch = q.rank == 4 ? q.shape[0] : 1;
  const std::int64_t tokens = q.shape[q.rank == 4 ? 1 : 0];
  if (p.from == rope_positions::source::offset) {
    if (p.start < 0) throw error("position offset (" + std::to_string(p.start) + ") must be >= 0");
    if (batch == 0 || tokens == 0) return 0;
    std::int64_t rows = 0;
    if (__builtin_add_overflow(p.start, tokens, &rows)) {
      throw error("position offset (" + std::to_string(p.start) + ") + " + std::to_string(tokens) +
                  " tokens overflows int64");
    }
    return rows;
  }
  const tensor_view& ids = p.ids;
  const std::int64_t n = ids.numel();
  const std::int64_t last = ids.rank > 0 ? ids.shape[ids.rank - 1] : 1;
  std::int64_t largest = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t v = ids.type == dtype::i32 ? static_cast<const std::int32_t*>(ids.data)[i]
                                                  : static_cast<const std::int64_t*>(ids.data)[i];
    if (v < 0) {
      const std::string at = ids.rank == 2
                                 ? std::to_string(i / last) + ", " + std::to_string(i % last)
                                 : std::to_string(i);
      throw error("positions[" + at + "] (" + std::to_string(v) + ") must be >= 0");
    }
    largest = std::max(largest, v);
  }
  if (largest == std::numeric_limits<std::int64_t>::max()) {
    throw error("position " + std::to_string(largest) + " is too large for a table");
  }
  return largest + 1;
}

// "16,24,24" -> {16, 24, 24}: three integers >= 0.
std::array<int, 3> parse_section(const std::string& text) {
  std::array<int, 3> s{};
  std::size_t at = 0;
  for (int i = 0; i < 3; ++i) {
    const std::size_t comma = text.find(',', at);
    const std::string part =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    errno = 0;
    const long v = part.empty() ? -1 : std::strtol(part.c_str(), &end, 10);
    const bool last_ok = i < 2 ? comma != std::string::npos : comma == std::string::npos;
    if (part.empty() || *end != '\0' || errno != 0 || v < 0 || v > (1 << 20) || !last_ok) {
      throw error("--section '" + text +
                  "' must be three integers >= 0, T,H,W (e.g. 16,24,24 for Qwen2-VL)");
    }
    s[i] = static_cast<int>(v);
    at = comma + 1;
  }
  return s;
}

std::string section_text(const std::array<int, 3>& s) {
  return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
         "]";
}

// A per-token cos or sin file: its shape must be one of `tokens` followed by a width of
// rotary_dim or rotary_dim/2.
void check_rows_shape(const std::string& path, const char* flag, const npy_array& a,
                      const std::vector<std::vector<std::int64_t>>& tokens, std::int64_t rotary,
                      const std::string& what, variant v) {
  for (const auto& t : tokens) {
    if (a.shape.size() == t.size() + 1 && std::equal(t.begin(), t.end(), a.shape.begin()) &&
        (a.shape.back() == rotary || a.shape.back() == rotary / 2)) {
      return;
    }
  }
  std::string want;
  for (const auto& t : tokens) {
    for (const std::int64_t w : {rotary, rotary / 2}) {
      auto e = t;
      e.push_back(w);
      want += (want.empty() ? "" : " or ") + shape_text(e);
    }
  }
  throw error(path + ": " + flag + " shape " + shape_text(a.shape) + " must be " + want + " (" +
              what + "; rotary_dim " + std::to_string(rotary) +
              " or rotary_dim/2 wide) for --variant " + name_of(v));
}

// The output files: distinct, so that no output is lost under another.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outs) {
  for (std::size_t i = 0; i < outs.size(); ++i) {
    for (std::size_t j = i + 1; j < outs.size(); ++j) {
      std::error_code e1, e2;
      const auto pi = std::filesystem::weakly_canonical(outs[i].second, e1);
      const auto pj = std::filesystem::weakly_canonical(outs[j].second, e2);
      if (outs[i].second == outs[j].second || (!e1 && !e2 && pi == pj)) {
        throw error(outs[i].first + " and " + outs[j].first + " name the same file (" +
                    outs[j].second + ")");
      }
    }
  }
}

// A norm weight file: [D], float32, float16 or bf16 bits (with --dtype bf16).
tensor_view weight_view(npy_array& w, const std::string& path, const char* flag,
                        std::optional<dtype> forced, std::int64_t head_dim) {
  const dtype t = float_dtype(w, path, forced);
  if (w.shape.size() != 1 || w.shape[0] != head_dim) {
    throw error(path + ": " + flag + " shape " + shape_text(w.shape) + " must be [D] = [" +
                std::to_string(head_dim) + "] (q head_dim)");
  }
  return tensor_view::contiguous(w.data.data(), t, w.shape);
}

void run_apply(const apply_args& a) {
  // Flags first, before any file is read.
  const variant v = variant_from_name(a.variant_name);
  check_flags_for(v, a);
  const bool rows = a.given("--cos") || a.given("--sin");
  const bool norm_backward = v == variant::qk_norm_rope && a.backward;
  for (const char* f : {"--grad-q", "--grad-k", "--out-q-weight-grad", "--out-k-weight-grad"}) {
    if (a.given(f) && !a.backward) {
      throw error(std::string(f) + " is only for --variant qk-norm-rope with --backward");
    }
  }
  if (a.k.empty() != a.out_k.empty()) {
    throw error(a.k.empty() ? "--out-k (" + a.out_k + ") is given without --k"
                            : "--k (" + a.k + ") is given without --out-k");
  }
  if (v == variant::qk_norm_rope) {
    if (!a.given("--q-weight")) {
      throw error("--variant qk-norm-rope needs --q-weight W.npy (the [D] RMSNorm weight of q)");
    }
    if (a.k.empty() == a.given("--k-weight")) {
      throw error(a.k.empty() ? "--k-weight (" + a.k_weight + ") is given without --k"
                              : "--k (" + a.k +
                                    ") needs --k-weight W.npy with --variant "
                                    "qk-norm-rope");
    }
  }
  if (norm_backward) {
    if (!a.given("--grad-q")) {
      throw error(
          "--variant qk-norm-rope --backward needs --grad-q G.npy (the gradient of q's output)");
    }
    if (a.k.empty() == a.given("--grad-k")) {
      throw error(a.k.empty() ? "--grad-k (" + a.grad_k + ") is given without --k"
                              : "--k (" + a.k + ") needs --grad-k G.npy with --backward");
    }
    if (a.k.empty() && a.given("--out-k-weight-grad")) {
      throw error("--out-k-weight-grad (" + a.out_k_weight_grad + ") is given without --k");
    }
    if (a.rounding == "hf_qwen3") {
      throw error(
          "--backward is the gradient of --rounding fp32_once; --rounding hf_qwen3 has "
          "no backward");
    }
  }
  if (a.given("--cos") != a.given("--sin")) {
    throw error(a.given("--cos") ? "--cos (" + a.cos + ") needs --sin"
                                 : "--sin (" + a.sin + ") needs --cos");
  }
  if (rows) {
    for (const char* f :
         {"--theta", "--config", "--positions", "--offset", "--table", "--precision"}) {
      if (a.given(f)) {
        throw error(std::string(f) + " is not used with --cos/--sin: the rows are the angles, " +
                    "one row per token");
      }
    }
  } else {
    if (a.given("--theta") == a.given("--config")) {
      throw error(a.given("--theta")
                      ? "--theta and --config are mutually exclusive; give one"
                      : "one of --theta F and --config FILE is required" +
                            std::string(v == variant::rope || v == variant::qk_norm_rope
                                            ? ""
                                            : " (or --cos/--sin)"));
    }
    const bool offset_ok = v != variant::vision && v != variant::mrope;
    if (a.given("--positions") && a.given("--offset")) {
      throw error("--positions and --offset are mutually exclusive; give one");
    }
    if (!a.given("--positions") && !a.given("--offset")) {
      throw error(offset_ok
                      ? "one of --positions P.npy and --offset N is required"
                      : "--variant " + name_of(v) + " needs --positions P.npy" +
                            (v == variant::vision ? " [S, 2]" : " [3, T]") + " or --cos/--sin");
    }
  }
  if (a.given("--config") && a.given("--rotary-dim")) {
    throw error("--rotary-dim and --config are mutually exclusive: the config gives rotary_dim");
  }
  {
    std::vector<std::pair<std::string, std::string>> outs = {{"--out-q", a.out_q}};
    if (!a.out_k.empty()) outs.emplace_back("--out-k", a.out_k);
    if (a.given("--out-q-weight-grad")) {
      outs.emplace_back("--out-q-weight-grad", a.out_q_weight_grad);
    }
    if (a.given("--out-k-weight-grad")) {
      outs.emplace_back("--out-k-weight-grad", a.out_k_weight_grad);
    }
    check_distinct_outputs(outs);
  }
  if (a.given("--rotary-dim") && a.rotary_dim == 0) {
    throw error("--rotary-dim (0) must be > 0; leave it out to rotate all of head_dim");
  }
  if (v == variant::rope && !a.given("--style")) {
    throw error("--variant rope needs --style neox|gptj");
  }
  const rope_style style = v == variant::rope || (v == variant::qk_norm_rope && a.given("--style"))
                               ? rope_style_from_string(a.style)
                           : v == variant::interleave ? rope_style::gptj
                                                      : rope_style::neox;
  const std::string& layout = one_of("--layout", a.layout, {"thd", "bshd", "bhsd"});
  const std::string& table = one_of("--table", a.table, {"none", "f32", "x"});
  const angle_precision precision = angle_precision_from_string(a.precision);
  std::optional<dtype> forced;
  if (!a.dtype_name.empty()) {
    forced = dtype_from_string(one_of("--dtype", a.dtype_name, {"f32", "f16", "bf16"}));
  }
  const mrope_layout section_layout = mrope_layout_from_string(
      one_of("--section-layout", a.section_layout, {"chunked", "interleaved"}));
  std::optional<std::array<int, 3>> section;
  if (a.given("--section")) section = parse_section(a.section);
  rope_options options;
  options.output_layout = rope_output_layout_from_string(
      one_of("--output-layout", a.output_layout, {"interleaved", "split-half"}));
  qk_norm norm;
  norm.rounding =
      qk_norm_rounding_from_string(one_of("--rounding", a.rounding, {"fp32_once", "hf_qwen3"}));
  norm.eps = a.eps;
  if (v == variant::qk_norm_rope && !(std::isfinite(norm.eps) && norm.eps >= 0)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", a.eps);
    throw error("--eps (" + std::string(text) + ") must be finite and >= 0");
  }
  if (a.given("--theta")) rope_angles::from_theta(a.theta);  // checks theta
  std::optional<rope_config> config;
  if (a.given("--config")) config = rope_config::from_hf_json(a.config);

  // Inputs, and out-of-place outputs in memory.
  npy_array q = read_npy(a.q, npy_content::floats);
  const dtype t = x_dtype(q, a.q, forced);
  std::optional<npy_array> k;
  if (!a.k.empty()) k = read_npy(a.k, npy_content::floats);
  std::vector<unsigned char> q_out(q.data.size()), k_out(k ? k->data.size() : 0);
  rope_tensors x;
  x.q = x_view(q.data.data(), t, q.shape, layout, a.q, "q");
  x.q_out = x_view(q_out.data(), t, q.shape, layout, a.q, "q");
  if (k) {
    const dtype kt = x_dtype(*k, a.k, forced);  // rope_apply reports a k dtype unlike q's
    x.k = x_view(k->data.data(), kt, k->shape, layout, a.k, "k");
    x.k_out = x_view(k_out.data(), kt, k->shape, layout, a.k, "k");
  }
  const std::int64_t head_dim = x.q.shape[x.q.rank - 1];
  const std::int64_t tokens = x.q.shape[x.q.rank == 4 ? 1 : 0];
  if (config) {
    if (config->head_dim != head_dim) {
      throw error(a.config + ": head_dim (" + std::to_string(config->head_dim) +
                  ") differs from q head_dim (" + std::to_string(head_dim) + ", " + a.q + " " +
                  shape_text(q.shape) + ")");
    }
    options.rotary_dim = config->effective_rotary_dim();
  } else {
    options.rotary_dim = a.rotary_dim;
  }
  const std::int64_t rotary = options.rotary_dim ? options.rotary_dim : head_dim;

  std::vector<int> mrope_axes;
  if (v == variant::mrope) {
    const bool from_config = !section && config && config->mrope_section;
    if (!section && !from_config) {
      throw error("--variant mrope needs --section T,H,W" +
                  std::string(config ? " (" + a.config + " has no mrope_section)"
                                     : " (or a --config with mrope_section)"));
    }
    if (from_config) section = config->mrope_section;
    const mrope_layout l = a.given("--section-layout") || !config ? section_layout
                           : config->mrope_interleaved            ? mrope_layout::interleaved
                                                                  : mrope_layout::chunked;
    const std::int64_t sum = std::int64_t{(*section)[0]} + (*section)[1] + (*section)[2];
    if (2 * sum != rotary) {
      throw error((from_config ? a.config + ": mrope_section " : "--section ") +
                  section_text(*section) + " sums to " + std::to_string(sum) +
                  "; it must be rotary_dim/2 (" + std::to_string(rotary / 2) + ")");
    }
    mrope_axes = mrope_axis_map(*section, l);
  }

  // Positions: as given for rope, qk-norm-rope and interleave; [S, 2] -> [2, S] for vision;
  // [3, T] for mrope.
  npy_array ids;
  std::vector<unsigned char> ids_by_axis;
  rope_positions positions = rope_positions::none();
  std::optional<vision_2d_frequencies> vision_freqs;
  if (!rows && a.given("--offset")) positions = rope_positions::from_offset(a.offset);
  if (!rows && a.given("--positions")) {
    ids = read_npy(a.positions, npy_content::integers);
    const dtype it = ids.descr == "<i4" ? dtype::i32 : dtype::i64;
    if (v == variant::vision) {
      if (ids.shape.size() != 2 || ids.shape[0] != tokens || ids.shape[1] != 2) {
        throw error(a.positions + ": positions shape " + shape_text(ids.shape) +
                    " must be [S, 2] = [" + std::to_string(tokens) +
                    ", 2] (row, col of each patch) for --variant vision");
      }
      const std::size_t es = size_of(it);
      ids_by_axis.resize(ids.data.size());
      for (std::int64_t s = 0; s < tokens; ++s) {
        for (std::int64_t axis = 0; axis < 2; ++axis) {
          const unsigned char* from = ids.data.data() + (s * 2 + axis) * es;
          const std::int64_t id = it == dtype::i32 ? *reinterpret_cast<const std::int32_t*>(from)
                                                   : *reinterpret_cast<const std::int64_t*>(from);
          if (id < 0) {
            throw error(a.positions + ": positions[" + std::to_string(s) + ", " +
                        std::to_string(axis) + "] (" + std::to_string(id) + ") must be >= 0");
          }
          std::copy(from, from + es, ids_by_axis.data() + (axis * tokens + s) * es);
        }
      }
      if (head_dim % 4 != 0) {
        throw error(a.q + ": q head_dim (" + std::to_string(head_dim) + ", shape " +
                    shape_text(q.shape) +
                    ") must be a multiple of 4 for --variant vision with --positions (head_dim/4 "
                    "frequencies per axis)");
      }
      vision_freqs = qwen2vl_vision_frequencies(static_cast<int>(head_dim), a.theta);
      positions =
          rope_positions::from_axes(tensor_view::contiguous(ids_by_axis.data(), it, {2, tokens}),
                                    vision_freqs->axis_of_frequency);
    } else if (v == variant::mrope) {
      if (ids.shape.size() != 2 || ids.shape[0] != 3 || ids.shape[1] != tokens) {
        throw error(a.positions + ": positions shape " + shape_text(ids.shape) +
                    " must be [3, T] = [3, " + std::to_string(tokens) +
                    "] (temporal, height, width of each token) for --variant mrope");
      }
      positions = rope_positions::from_axes(tensor_view::contiguous(ids.data.data(), it, ids.shape),
                                            mrope_axes);
    } else {
      positions = rope_positions::from_ids(tensor_view::contiguous(ids.data.data(), it, ids.shape));
    }
  }

  // Angles: per-token rows, or computed from --theta / --config (looked up in a table or not).
  npy_array cos_rows, sin_rows;
  rope_table tables;
  rope_angles angles;
  if (rows) {
    cos_rows = read_npy(a.cos, npy_content::floats);
    sin_rows = read_npy(a.sin, npy_content::floats);
    const dtype ct = float_dtype(cos_rows, a.cos, forced);
    const dtype st = float_dtype(sin_rows, a.sin, forced);
    std::vector<std::vector<std::int64_t>> token_shapes;
    std::string what = "one row per token";
    if (v == variant::mrope) {
      token_shapes = {{3, tokens}};
      what = "a plane per axis (temporal, height, width), one row per token";
    } else if (x.q.rank == 3) {
      token_shapes = {{tokens}};
      if (v == variant::vision) what = "one row per patch";
    } else {
      token_shapes = {{tokens}, {x.q.shape[0], tokens}};
      what = "one row per token, shared by the batch or per batch";
    }
    check_rows_shape(a.cos, "--cos", cos_rows, token_shapes, rotary, what, v);
    if (sin_rows.shape != cos_rows.shape || st != ct) {
      throw error(a.sin + ": --sin " + shape_text(sin_rows.shape) + " " +
                  std::string(to_string(st)) + " must match --cos " + a.cos + " " +
                  shape_text(cos_rows.shape) + " " + std::string(to_string(ct)));
    }
    angles = rope_angles::from_token_rows(
        tensor_view::contiguous(cos_rows.data.data(), ct, cos_rows.shape),
        tensor_view::contiguous(sin_rows.data.data(), st, sin_rows.shape), mrope_axes);
  } else {
    // Explicit frequencies (a config's, the vision tower's); plain --theta otherwise.
    std::optional<rope_frequencies> freqs;
    if (config) freqs = config->frequencies(table_rows(positions, x.q));
    if (vision_freqs) freqs = rope_frequencies{vision_freqs->inv_freq, 1.0};
    if (table != "none") {
      if (freqs && precision == angle_precision::hf_compat) {
        throw error("--precision hf_compat with --table builds the table from --theta; with " +
                    std::string(config ? "--config" : "--variant vision") +
                    " leave out --table or --precision");
      }
      const std::int64_t table_len = table_rows(positions, x.q);
      const dtype table_type = table == "x" ? t : dtype::f32;
      const std::int64_t row_bytes =
          2 * (rotary / 2) * static_cast<std::int64_t>(size_of(table_type));
      if (row_bytes > 0 && table_len > max_table_bytes / row_bytes) {
        throw error("--table " + table + ": positions up to " + std::to_string(table_len - 1) +
                    " need a cos/sin table of " + std::to_string(table_len) +
                    " rows, over the 4 GiB this program builds; use --table none");
      }
      tables = freqs ? make_rope_table(table_len, *freqs, table_type)
                     : make_rope_table(table_len, static_cast<int>(rotary), a.theta, table_type,
                                       precision);
      angles = rope_angles::from_table(tables.cos, tables.sin);
    } else {
      angles = freqs ? rope_angles::from_frequencies(*freqs, precision)
                     : rope_angles::from_theta(a.theta, precision);
    }
  }

  // The rotation, into the output buffers.
  std::vector<float> q_weight_grad, k_weight_grad;
  npy_array q_weight, k_weight, grad_q, grad_k;
  if (v == variant::qk_norm_rope) {
    q_weight = read_npy(a.q_weight, npy_content::floats);
    norm.q_weight = weight_view(q_weight, a.q_weight, "--q-weight", forced, head_dim);
    if (k) {
      k_weight = read_npy(a.k_weight, npy_content::floats);
      norm.k_weight = weight_view(k_weight, a.k_weight, "--k-weight", forced, head_dim);
    }
  }
  if (norm_backward) {
    // The gradients of the outputs, shaped and typed as q and k.
    const auto grad_view = [&](npy_array& g, const std::string& path, const char* flag,
                               const npy_array& of, const std::string& of_path, const char* role) {
      const dtype gt = x_dtype(g, path, forced);
      const dtype want = float_dtype(of, of_path, forced);
      if (g.shape != of.shape || gt != want) {
        throw error(path + ": " + flag + " " + shape_text(g.shape) + " " +
                    std::string(to_string(gt)) + " must match --" + role + " " + of_path + " " +
                    shape_text(of.shape) + " " + std::string(to_string(want)));
      }
      return x_view(g.data.data(), gt, g.shape, layout, path, role);
    };
    grad_q = read_npy(a.grad_q, npy_content::floats);
    qk_norm_rope_grad_tensors g;
    g.q = x.q;
    g.dq_out = grad_view(grad_q, a.grad_q, "--grad-q", q, a.q, "q");
    g.dq = x.q_out;
    q_weight_grad.resize(static_cast<std::size_t>(head_dim));
    g.dq_weight = tensor_view::contiguous(q_weight_grad.data(), dtype::f32, {head_dim});
    if (k) {
      grad_k = read_npy(a.grad_k, npy_content::floats);
      g.k = x.k;
      g.dk_out = grad_view(grad_k, a.grad_k, "--grad-k", *k, a.k, "k");
      g.dk = x.k_out;
      k_weight_grad.resize(static_cast<std::size_t>(head_dim));
      g.dk_weight = tensor_view::contiguous(k_weight_grad.data(), dtype::f32, {head_dim});
    }
    qk_norm_rope_backward(style, g, positions, angles, norm, options);
  } else if (v == variant::qk_norm_rope) {
    qk_norm_rope_apply(style, x, positions, angles, norm, options);
  } else {
    options.backward = a.backward;
    rope_apply(style, x, positions, angles, options);
  }

  // Every output written beside its destination first, then all renamed.
  std::vector<pending_npy> outs;
  outs.emplace_back(a.out_q, q.descr, q.shape, q_out.data(), q_out.size());
  if (k) outs.emplace_back(a.out_k, k->descr, k->shape, k_out.data(), k_out.size());
  if (norm_backward && a.given("--out-q-weight-grad")) {
    outs.emplace_back(a.out_q_weight_grad, "<f4", std::vector<std::int64_t>{head_dim},
                      q_weight_grad.data(), q_weight_grad.size() * sizeof(float));
  }
  if (norm_backward && a.given("--out-k-weight-grad")) {
    outs.emplace_back(a.out_k_weight_grad, "<f4", std::vector<std::int64_t>{head_dim},
                      k_weight_grad.data(), k_weight_grad.size() * sizeof(float));
  }
  for (auto& o : outs) o.commit();
}

constexpr char apply_footer[] = R"(Variants (--variant):
  rope          (default) --style neox|gptj; positions [T] / [S] / [B, S] or --offset; --theta or --config
  vision        Qwen2-VL / Qwen2.5-VL vision tower, neox over the whole head, q and k [S, N, D]:
                --positions [S, 2] (row, col per patch) with --theta (2D frequencies), or
                --cos/--sin rows [S, D] as HF passes them
  mrope         Qwen2-VL / Qwen3-VL text MRoPE, neox, q and k [T, H, D]: --positions [3, T] with
                --theta or --config, or --cos/--sin planes [3, T, D]; --section T,H,W (sum
                rotary_dim/2; from --config when absent) and --section-layout chunked|interleaved
  qk-norm-rope  Qwen3 per-head RMSNorm of q and k, then RoPE (--style, default neox):
                --q-weight/--k-weight [D], --eps, --rounding fp32_once|hf_qwen3. With --backward:
                --q/--k are the forward's inputs, --grad-q/--grad-k the gradients of its outputs;
                dq/dk go to --out-q/--out-k, the weight gradients (float32 [D]) to
                --out-q-weight-grad/--out-k-weight-grad
  interleave    adjacent pairs (gptj); --output-layout interleaved|split-half (split-half: the
                NPU's InterleaveRope); --theta/--config with positions, or --cos/--sin rows
                [T, D] (thd), [S, D] or [B, S, D] (bshd, bhsd)
--backward applies the inverse rotation (the gradient w.r.t. x) for every variant but
qk-norm-rope, whose backward is described above. A flag the variant does not use is an error.)";

}  // namespace

void add_apply_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "apply",
      "Rotate q (and k) read from .npy files with one RoPE variant; write .npy outputs of the "
      "same dtype and shape");
  cmd->footer(apply_footer);
  auto a = std::make_shared<apply_args>();
  const std::vector<variant> all = {variant::rope, variant::vision, variant::mrope,
                                    variant::qk_norm_rope, variant::interleave};
  // Registers a flag: its help says which variants read it.
  const auto flag = [&](CLI::Option* o, const std::string& name, std::vector<variant> used_by,
                        const std::string& help, std::string note = "") {
    std::string who;
    if (used_by.size() == all.size()) {
      who = "[all variants] ";
    } else {
      for (variant u : used_by) who += (who.empty() ? "[" : ", ") + name_of(u);
      who += "] ";
    }
    o->description(who + help);
    a->rules.push_back({name, o, std::move(used_by), std::move(note)});
    return o;
  };
  flag(cmd->add_option("--variant", a->variant_name)
           ->type_name("rope|vision|mrope|qk-norm-rope|interleave"),
       "--variant", all, "which RoPE variant (default rope); see below");
  flag(cmd->add_option("--q", a->q)->type_name("FILE")->required(), "--q", all,
       "q .npy: [T, H, D] (thd), [B, S, H, D] (bshd) or [B, H, S, D] (bhsd); float32, float16, "
       "or uint16 holding bf16 bits (with --dtype bf16). With qk-norm-rope --backward: the "
       "forward's input q");
  flag(cmd->add_option("--k", a->k)->type_name("FILE"), "--k", all,
       "k .npy: as q, same dtype and layout; its head count may differ (GQA). Needs --out-k");
  flag(cmd->add_option("--positions", a->positions)->type_name("FILE"), "--positions", all,
       "int32 or int64 .npy of positions. rope, qk-norm-rope, interleave: [T] for thd; [S] "
       "(shared by the batch) or [B, S] for bshd and bhsd (or --offset). vision: [S, 2], the "
       "(row, col) of each patch. mrope: [3, T] (temporal, height, width)");
  flag(cmd->add_option("--offset", a->offset)->type_name("N"), "--offset",
       {variant::rope, variant::qk_norm_rope, variant::interleave},
       "consecutive positions N, N + 1, ... for the T (or S) tokens. Or --positions");
  flag(cmd->add_option("--style", a->style)->type_name("neox|gptj"), "--style",
       {variant::rope, variant::qk_norm_rope},
       "neox (rotate halves) or gptj (adjacent pairs); required for rope, default neox for "
       "qk-norm-rope",
       "; vision and mrope rotate neox, interleave gptj");
  flag(cmd->add_option("--theta", a->theta)->type_name("F"), "--theta", all,
       "RoPE base, finite and > 0: inv_freq[i] = theta^(-2i/rotary_dim) (vision: "
       "theta^(-2j/(D/2)) per axis). Or --config, or --cos/--sin");
  flag(cmd->add_option("--config", a->config)->type_name("FILE"), "--config",
       {variant::rope, variant::mrope, variant::qk_norm_rope, variant::interleave},
       "a Hugging Face config.json instead of --theta: its rope_theta, rotary_dim and scaling "
       "(linear, dynamic, YaRN, LongRoPE, Llama 3) for positions up to the largest given; "
       "mrope takes its mrope_section when --section is absent",
       "; the vision tower's frequencies come from --theta");
  flag(cmd->add_option("--cos", a->cos)->type_name("FILE"), "--cos",
       {variant::vision, variant::mrope, variant::interleave},
       "per-token cos rows instead of --theta/--config and positions, rotary_dim or "
       "rotary_dim/2 wide, float32, float16 or bf16 bits: vision [S, D]; mrope planes [3, T, w]; "
       "interleave [T, w] (thd), [S, w] or [B, S, w] (bshd, bhsd). A full row's columns pair "
       "as the output does: (i, i + r/2) for halves and split-half, (2i, 2i+1) for adjacent");
  flag(cmd->add_option("--sin", a->sin)->type_name("FILE"), "--sin",
       {variant::vision, variant::mrope, variant::interleave},
       "per-token sin rows, shaped and typed as --cos");
  flag(cmd->add_option("--rotary-dim", a->rotary_dim)->type_name("N"), "--rotary-dim",
       {variant::rope, variant::mrope, variant::qk_norm_rope, variant::interleave},
       "leading dims rotated per head, even and <= head_dim (default head_dim); the rest pass "
       "through unchanged",
       "; vision rotates the whole head");
  flag(cmd->add_option("--layout", a->layout)->type_name("thd|bshd|bhsd"), "--layout",
       {variant::rope, variant::qk_norm_rope, variant::interleave},
       "thd (default), bshd or bhsd: how q and k files are laid out (see --q)",
       "; vision and mrope take thd: q [T, H, D]");
  flag(cmd->add_option("--dtype", a->dtype_name)->type_name("f32|f16|bf16"), "--dtype", all,
       "f32, f16 or bf16: the dtype of q and k; required for bf16 (uint16 files, read as bf16 "
       "bits in every input then), otherwise taken from the files and checked against them");
  flag(cmd->add_flag("--backward", a->backward), "--backward", all,
       "the gradient w.r.t. x: the inverse rotation; qk-norm-rope: its backward (see below)");
  flag(cmd->add_option("--table", a->table)->type_name("none|f32|x"), "--table", all,
       "none (default): cos/sin computed per token; f32 or x: looked up in a [max position + 1, "
       "rotary_dim/2] table of fp32 or of the q dtype (with --theta or --config)");
  flag(cmd->add_option("--precision", a->precision)->type_name("accurate|hf_compat"), "--precision",
       all,
       "accurate (default): fp64 angles; hf_compat: fp32 angles as HF transformers, cos/sin "
       "rounded to the q dtype");
  flag(cmd->add_option("--section", a->section)->type_name("T,H,W"), "--section", {variant::mrope},
       "frequencies per axis (temporal, height, width), summing to rotary_dim/2, e.g. 16,24,24 "
       "(Qwen2-VL) or 24,20,20 (Qwen3-VL)");
  flag(cmd->add_option("--section-layout", a->section_layout)->type_name("chunked|interleaved"),
       "--section-layout", {variant::mrope},
       "chunked (default; Qwen2-VL, Qwen2.5-VL: T..T H..H W..W) or interleaved (Qwen3-VL: T H W "
       "T H W ...); with --config and without it, the config's mrope_interleaved");
  flag(cmd->add_option("--q-weight", a->q_weight)->type_name("FILE"), "--q-weight",
       {variant::qk_norm_rope},
       "q's RMSNorm weight [D]: float32, float16 or bf16 bits (with --dtype bf16); required");
  flag(cmd->add_option("--k-weight", a->k_weight)->type_name("FILE"), "--k-weight",
       {variant::qk_norm_rope}, "k's RMSNorm weight [D], as --q-weight; required with --k");
  flag(cmd->add_option("--eps", a->eps)->type_name("F"), "--eps", {variant::qk_norm_rope},
       "RMSNorm epsilon, finite and >= 0 (default 1e-6)");
  flag(cmd->add_option("--rounding", a->rounding)->type_name("fp32_once|hf_qwen3"), "--rounding",
       {variant::qk_norm_rope},
       "fp32_once (default): fp32 throughout, rounded once; hf_qwen3: rounded to the q dtype "
       "where HF's Qwen3 rounds (neox only, no --backward)");
  flag(cmd->add_option("--grad-q", a->grad_q)->type_name("FILE"), "--grad-q",
       {variant::qk_norm_rope}, "with --backward: dL/d(q output), q's shape and dtype; required");
  flag(cmd->add_option("--grad-k", a->grad_k)->type_name("FILE"), "--grad-k",
       {variant::qk_norm_rope}, "with --backward: dL/d(k output), k's shape and dtype; with --k");
  flag(cmd->add_option("--out-q-weight-grad", a->out_q_weight_grad)->type_name("FILE"),
       "--out-q-weight-grad", {variant::qk_norm_rope},
       "with --backward: output .npy for dL/d(q weight), float32 [D] (optional)");
  flag(cmd->add_option("--out-k-weight-grad", a->out_k_weight_grad)->type_name("FILE"),
       "--out-k-weight-grad", {variant::qk_norm_rope},
       "with --backward and --k: output .npy for dL/d(k weight), float32 [D] (optional)");
  flag(cmd->add_option("--output-layout", a->output_layout)->type_name("interleaved|split-half"),
       "--output-layout", {variant::interleave},
       "interleaved (default): pairs written back in place; split-half: first elements in "
       "[0, r/2), second in [r/2, r) (NPU InterleaveRope)");
  flag(cmd->add_option("--out-q", a->out_q)->type_name("FILE")->required(), "--out-q", all,
       "output .npy for q (qk-norm-rope --backward: dq), same dtype and shape; replaced whole or "
       "not at all");
  flag(cmd->add_option("--out-k", a->out_k)->type_name("FILE"), "--out-k", all,
       "output .npy for k (with --k; qk-norm-rope --backward: dk)");
  cmd->callback([a] { run_apply(*a); });
}

}  // namespace tilerope::cli
