#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "apply_options.h"
#include "tilerope/error.h"

namespace tilerope::cli {

namespace {

constexpr std::array<std::pair<apply_variant, std::string_view>, 5> variant_names = {{
    {apply_variant::rope, "rope"},
    {apply_variant::vision, "vision"},
    {apply_variant::mrope, "mrope"},
    {apply_variant::qk_norm_rope, "qk-norm-rope"},
    {apply_variant::interleave, "interleave"},
}};

}  // namespace

std::string name_of(apply_variant v) {
  for (const auto& [x, name] : variant_names) {
    if (x == v) return std::string(name);
  }
  return "?";
}

namespace {

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

apply_variant variant_from_name(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& [v, n] : variant_names) names.emplace_back(n);
  one_of("--variant", name, names);
  for (const auto& [v, n] : variant_names) {
    if (n == name) return v;
  }
  return apply_variant::rope;
}

// Every flag given is one the variant reads.
void check_flags_for(apply_variant v, const apply_args& a) {
  for (const auto& r : a.rules) {
    if (r.option->count() == 0 ||
        std::find(r.used_by.begin(), r.used_by.end(), v) != r.used_by.end()) {
      continue;
    }
    if (r.used_by.size() == 1) {
      throw error(r.name + " is only for --variant " + name_of(r.used_by[0]) + r.note);
    }
    std::string list;
    for (apply_variant u : r.used_by) list += (list.empty() ? "" : ", ") + name_of(u);
    throw error(r.name + " is not used by --variant " + name_of(v) + " (only by " + list + ")" +
                r.note);
  }
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

// The combinations of flags the variant allows: what one flag needs of another, what excludes
// what, and outputs that name distinct files.
void check_flag_combinations(apply_variant v, const apply_args& a) {
  const bool rows = a.given("--cos") || a.given("--sin");
  const bool norm_backward = v == apply_variant::qk_norm_rope && a.backward;
  for (const char* f : {"--grad-q", "--grad-k", "--out-q-weight-grad", "--out-k-weight-grad"}) {
    if (a.given(f) && !a.backward) {
      throw error(std::string(f) + " is only for --variant qk-norm-rope with --backward");
    }
  }
  if (a.k.empty() != a.out_k.empty()) {
    throw error(a.k.empty() ? "--out-k (" + a.out_k + ") is given without --k"
                            : "--k (" + a.k + ") is given without --out-k");
  }
  if (v == apply_variant::qk_norm_rope) {
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
                            std::string(v == apply_variant::rope || v == apply_variant::qk_norm_rope
                                            ? ""
                                            : " (or --cos/--sin)"));
    }
    const bool offset_ok = v != apply_variant::vision && v != apply_variant::mrope;
    if (a.given("--positions") && a.given("--offset")) {
      throw error("--positions and --offset are mutually exclusive; give one");
    }
    if (!a.given("--positions") && !a.given("--offset")) {
      throw error(offset_ok ? "one of --positions P.npy and --offset N is required"
                            : "--variant " + name_of(v) + " needs --positions P.npy" +
                                  (v == apply_variant::vision ? " [S, 2]" : " [3, T]") +
                                  " or --cos/--sin");
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
  if (v == apply_variant::rope && !a.given("--style")) {
    throw error("--variant rope needs --style neox|gptj");
  }
}

}  // namespace

apply_request parse_apply_args(const apply_args& a) {
  const apply_variant v = variant_from_name(a.variant_name);
  check_flags_for(v, a);
  check_flag_combinations(v, a);
  apply_request r(a);
  r.variant = v;
  r.rows = a.given("--cos") || a.given("--sin");
  r.norm_backward = v == apply_variant::qk_norm_rope && a.backward;
  r.style = v == apply_variant::rope || (v == apply_variant::qk_norm_rope && a.given("--style"))
                ? rope_style_from_string(a.style)
            : v == apply_variant::interleave ? rope_style::gptj
                                             : rope_style::neox;
  r.layout = one_of("--layout", a.layout, {"thd", "bshd", "bhsd"});
  r.table = one_of("--table", a.table, {"none", "f32", "x"});
  r.precision = angle_precision_from_string(a.precision);
  if (!a.dtype_name.empty()) {
    r.forced_dtype = dtype_from_string(one_of("--dtype", a.dtype_name, {"f32", "f16", "bf16"}));
  }
  r.section_layout = mrope_layout_from_string(
      one_of("--section-layout", a.section_layout, {"chunked", "interleaved"}));
  if (a.given("--section")) r.section = parse_section(a.section);
  r.options.output_layout = rope_output_layout_from_string(
      one_of("--output-layout", a.output_layout, {"interleaved", "split-half"}));
  r.norm.rounding =
      qk_norm_rounding_from_string(one_of("--rounding", a.rounding, {"fp32_once", "hf_qwen3"}));
  r.norm.eps = a.eps;
  if (v == apply_variant::qk_norm_rope && !(std::isfinite(r.norm.eps) && r.norm.eps >= 0)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", a.eps);
    throw error("--eps (" + std::string(text) + ") must be finite and >= 0");
  }
  if (a.given("--theta")) rope_angles::from_theta(a.theta);  // checks theta
  return r;
}

}  // namespace tilerope::cli
