// HF transformers' RoPE presets: config.json parsing and the frequencies of each rope type.
//
// The formulas follow transformers' modeling_rope_utils (_compute_*_parameters) and its
// RotaryEmbeddingConfigMixin (standardize_rope_params), evaluated in fp64 where HF uses fp32.

#include "tilerope/rope_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>
#include <tuple>
#include <utility>

#include "core/enum_names.h"
#include "core/json_bounded.h"
#include "tilerope/error.h"

namespace tilerope {

namespace {
constexpr detail::enum_name<rope_scaling_type> scaling_names[] = {
    {rope_scaling_type::none, "default"},
    {rope_scaling_type::linear, "linear"},
    {rope_scaling_type::dynamic, "dynamic"},
    {rope_scaling_type::yarn, "yarn"},
    {rope_scaling_type::longrope, "longrope"},
    {rope_scaling_type::llama3, "llama3"},
    {rope_scaling_type::proportional, "proportional"},
    {rope_scaling_type::longrope, "su", true},  // Phi-3's first configs
    {rope_scaling_type::none, "mrope", true}};  // Qwen2-VL: the default frequencies
}  // namespace

std::string_view to_string(rope_scaling_type t) { return detail::name_of(scaling_names, t); }

rope_scaling_type rope_scaling_type_from_string(std::string_view name) {
  return detail::value_named(scaling_names, name, "rope_type");
}

namespace {

// The shortest decimal that reads back as `v` (at most 17 digits): "-2", "0.707", "1e+06".
std::string num(double v) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v || std::isnan(v)) break;
  }
  return buf;
}

std::string num(std::int64_t v) { return std::to_string(v); }

// The names a validation message uses for each field: JSON keys for a parsed config.json
// ("config.json: rope_scaling.factor"), struct fields for a config built by hand.
struct field_names {
  std::string origin;  // "config.json: " or ""
  std::string theta = "theta";
  std::string head_dim = "head_dim";
  std::string partial_rotary_factor = "partial_rotary_factor";
  std::string max_pos = "max_position_embeddings";
  std::string scaling = "scaling";  // prefix of the scaling parameters: "scaling.factor"
  std::string original = "scaling.original_max_position_embeddings";
  std::string mrope_section = "mrope_section";

  std::string key(const std::string& k) const { return scaling + "." + k; }  // "scaling.factor"
  std::string of(const std::string& k) const { return origin + key(k); }     // with the origin
};

int rotary_dim_of(int head_dim, double partial_rotary_factor, rope_scaling_type type) {
  // proportional rotates the whole head (its factor zeroes frequencies instead).
  if (type == rope_scaling_type::proportional) return head_dim;
  // int(head_dim * partial_rotary_factor) in Python: truncation of the fp64 product.
  return static_cast<int>(static_cast<double>(head_dim) * partial_rotary_factor);
}

double get_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

void require_positive(const std::string& name, const std::optional<double>& v) {
  if (v && !(std::isfinite(*v) && *v > 0)) {
    throw error(name + " (" + num(*v) + ") must be finite and > 0");
  }
}

// Everything frequencies() relies on. `n` names the fields in the messages.
void validate(const rope_config& c, const field_names& n) {
  const std::string& o = n.origin;
  if (!std::isfinite(c.theta) || !(c.theta > 0)) {
    throw error(o + n.theta + " (" + num(c.theta) + ") must be finite and > 0");
  }
  if (c.head_dim <= 0 || c.head_dim > rope_config::max_head_dim) {
    throw error(o + n.head_dim + " (" + std::to_string(c.head_dim) + ") must be in [1, " +
                std::to_string(rope_config::max_head_dim) + "]");
  }
  const double prf = c.partial_rotary_factor;
  if (!std::isfinite(prf) || !(prf > 0) || prf > 1) {
    throw error(o + n.partial_rotary_factor + " (" + num(prf) + ") must be in (0, 1]");
  }
  const int derived = rotary_dim_of(c.head_dim, prf, c.scaling.type);
  const std::string derivation = c.scaling.type == rope_scaling_type::proportional
                                     ? n.head_dim + " (" + std::to_string(c.head_dim) + ")"
                                     : "int(" + n.head_dim + " (" + std::to_string(c.head_dim) +
                                           ") * " + n.partial_rotary_factor + " (" + num(prf) +
                                           "))";
  if (c.rotary_dim != 0 && c.rotary_dim != derived) {
    throw error(o + "rotary_dim (" + std::to_string(c.rotary_dim) + ") must be 0 or " + derivation +
                " = " + std::to_string(derived));
  }
  if (derived <= 0 || derived % 2 != 0) {
    throw error(o + "rotary_dim (" + std::to_string(derived) + ") = " + derivation +
                " must be even and > 0");
  }
  const int half = derived / 2;
  if (c.max_position_embeddings < 0) {
    throw error(o + n.max_pos + " (" + num(c.max_position_embeddings) +
                ") must be >= 0 (0: not given)");
  }
  if (c.mrope_section) {
    const auto& s = *c.mrope_section;
    const std::string text = "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " +
                             std::to_string(s[2]) + "]";
    if (s[0] < 0 || s[1] < 0 || s[2] < 0 ||
        std::int64_t{s[0]} + std::int64_t{s[1]} + std::int64_t{s[2]} != half) {
      throw error(o + n.mrope_section + " (" + text + ") must be 3 entries >= 0 summing to " +
                  "rotary_dim/2 (" + std::to_string(half) + ")");
    }
  }

  const rope_scaling& s = c.scaling;
  const rope_scaling_type t = s.type;
  const std::string type_text = "rope_type '" + std::string(to_string(t)) + "'";
  if (t == rope_scaling_type::none) return;
  auto missing = [&](const std::string& what) {
    return error(n.of(what) + " is missing (" + type_text + " needs it)");
  };
  // The maximum position, where a rope type falls back to it.
  auto need_max_pos = [&](const std::string& why) {
    if (c.max_position_embeddings <= 0) {
      throw error(o + n.max_pos + " is missing (" + type_text + " needs it " + why + ")");
    }
  };

  if (s.factor) {
    if (!std::isfinite(*s.factor) || !(*s.factor > 0)) {
      throw error(n.of("factor") + " (" + num(*s.factor) + ") must be > 0");
    }
  } else if (t == rope_scaling_type::linear || t == rope_scaling_type::dynamic ||
             t == rope_scaling_type::llama3) {
    throw missing("factor");
  }
  if (s.original_max_position_embeddings && *s.original_max_position_embeddings <= 0) {
    throw error(o + n.original + " (" + num(*s.original_max_position_embeddings) + ") must be > 0");
  }
  const bool uses_original = t == rope_scaling_type::yarn || t == rope_scaling_type::longrope ||
                             t == rope_scaling_type::llama3;
  if (uses_original && !s.original_max_position_embeddings) {
    need_max_pos("when " + n.original + " is absent");
  }
  if (t == rope_scaling_type::dynamic) {
    need_max_pos("for the scaled base");
    if (derived <= 2) {
      throw error(o + "rotary_dim (" + std::to_string(derived) + ") must be > 2 for " + type_text +
                  " (its base has the exponent d / (d - 2))");
    }
  }
  if ((t == rope_scaling_type::yarn || t == rope_scaling_type::longrope) && !s.factor) {
    need_max_pos("when " + n.key("factor") + " is absent");
  }

  if (t == rope_scaling_type::yarn || t == rope_scaling_type::longrope) {
    require_positive(n.of("attention_factor"), s.attention_factor);
  }
  if (t == rope_scaling_type::yarn) {
    if (!(c.theta > 1)) {
      throw error(o + n.theta + " (" + num(c.theta) + ") must be > 1 for " + type_text +
                  " (its correction range divides by ln(theta))");
    }
    using named = std::pair<const char*, std::optional<double>>;
    for (const auto& [key, v] :
         {named{"beta_fast", s.beta_fast}, named{"beta_slow", s.beta_slow}}) {
      if (v && !(std::isfinite(*v) && *v >= 0)) {
        throw error(n.of(key) + " (" + num(*v) + ") must be finite and >= 0 (0 means default)");
      }
    }
    const double beta_fast = s.beta_fast.value_or(0) != 0 ? *s.beta_fast : 32.0;
    const double beta_slow = s.beta_slow.value_or(0) != 0 ? *s.beta_slow : 1.0;
    if (beta_fast < beta_slow) {
      throw error(n.of("beta_fast") + " (" + num(beta_fast) + ") must be >= " + n.key("beta_slow") +
                  " (" + num(beta_slow) + ")");
    }
    for (const auto& [key, v] :
         {named{"mscale", s.mscale}, named{"mscale_all_dim", s.mscale_all_dim}}) {
      if (v && !std::isfinite(*v)) throw error(n.of(key) + " (" + num(*v) + ") must be finite");
    }
  }
  if (t == rope_scaling_type::longrope) {
    using named = std::pair<const char*, const std::vector<double>*>;
    for (const auto& [key, list] :
         {named{"short_factor", &s.short_factor}, named{"long_factor", &s.long_factor}}) {
      if (list->empty()) throw missing(key);
      if (list->size() != static_cast<std::size_t>(half)) {
        throw error(n.of(key) + " has " + std::to_string(list->size()) +
                    " entries; it needs rotary_dim/2 = " + std::to_string(half));
      }
      for (std::size_t i = 0; i < list->size(); ++i) {
        const double v = (*list)[i];
        if (!std::isfinite(v) || !(v > 0)) {
          throw error(n.of(key) + "[" + std::to_string(i) + "] (" + num(v) + ") must be > 0");
        }
      }
    }
  }
  if (t == rope_scaling_type::llama3) {
    if (!s.low_freq_factor) throw missing("low_freq_factor");
    if (!s.high_freq_factor) throw missing("high_freq_factor");
    require_positive(n.of("low_freq_factor"), s.low_freq_factor);
    require_positive(n.of("high_freq_factor"), s.high_freq_factor);
    if (!(*s.high_freq_factor > *s.low_freq_factor)) {
      throw error(n.of("high_freq_factor") + " (" + num(*s.high_freq_factor) + ") must be > " +
                  n.key("low_freq_factor") + " (" + num(*s.low_freq_factor) + ")");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// config.json

using json = nlohmann::json;

// Looks keys up in text_config first (when the config has one), then at the top level; a
// null value counts as absent, as HF's `getattr(config, key, None) or default` reads it.
class config_reader {
 public:
  config_reader(const json& root, std::string origin) : root_(root), origin_(std::move(origin)) {
    if (auto it = root.find("text_config"); it != root.end() && !it->is_null()) {
      if (!it->is_object()) throw error(at("text_config") + " must be an object");
      text_ = &*it;
    }
  }

  const std::string& origin() const { return origin_; }
  std::string at(const std::string& path) const { return origin_ + ": " + path; }

  // (value, "text_config.key" or "key"), or (nullptr, "key") when absent.
  std::pair<const json*, std::string> find(const std::string& key) const {
    if (text_) {
      if (auto it = text_->find(key); it != text_->end() && !it->is_null()) {
        return {&*it, "text_config." + key};
      }
    }
    if (auto it = root_.find(key); it != root_.end() && !it->is_null()) return {&*it, key};
    return {nullptr, key};
  }

 private:
  const json& root_;
  const json* text_ = nullptr;
  std::string origin_;
};

std::string dump(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

double as_number(const json& v, const std::string& where) {
  if (!v.is_number()) throw error(where + " (" + dump(v) + ") must be a number");
  return v.get<double>();
}

std::int64_t as_integer(const json& v, const std::string& where) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<std::int64_t>(d);
    }
  }
  throw error(where + " (" + dump(v) + ") must be an integer");
}

int as_int(const json& v, const std::string& where) {
  const std::int64_t i = as_integer(v, where);
  if (i < -(std::int64_t{1} << 30) || i > (std::int64_t{1} << 30)) {
    throw error(where + " (" + std::to_string(i) + ") is out of range");
  }
  return static_cast<int>(i);
}

// A key of an object, null counting as absent.
const json* member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> optional_number(const json& object, const char* key,
                                      const std::string& path) {
  const json* v = member(object, key);
  if (!v) return std::nullopt;
  return as_number(*v, path + "." + key);
}

std::vector<double> number_list(const json& object, const char* key, const std::string& path) {
  const json* v = member(object, key);
  if (!v) return {};
  const std::string where = path + "." + key;
  if (!v->is_array()) throw error(where + " (" + dump(*v) + ") must be a list of numbers");
  std::vector<double> out;
  out.reserve(v->size());
  for (std::size_t i = 0; i < v->size(); ++i) {
    out.push_back(as_number((*v)[i], where + "[" + std::to_string(i) + "]"));
  }
  return out;
}

}  // namespace

int rope_config::effective_rotary_dim() const {
  return rotary_dim != 0 ? rotary_dim
                         : rotary_dim_of(head_dim, partial_rotary_factor, scaling.type);
}

rope_config rope_config::from_hf_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(path + ": cannot be opened");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw error(path + ": cannot be read");
  return from_hf_json_text(text.str(), path);
}

rope_config rope_config::from_hf_json_text(const std::string& text, const std::string& origin) {
  const json root = detail::parse_json_bounded(text, origin);
  if (!root.is_object()) throw error(origin + ": the config must be a JSON object");
  const config_reader r(root, origin);
  field_names names;
  names.origin = origin + ": ";
  rope_config c;

  if (auto [v, key] = r.find("model_type"); v && v->is_string())
    c.model_type = v->get<std::string>();

  // The rope dictionary: rope_scaling when it is a non-empty object (HF: `rope_scaling or
  // rope_parameters`), else rope_parameters.
  const json* rope = nullptr;
  std::string rope_key = "rope_scaling";
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto [v, path] = r.find(key);
    if (!v) continue;
    if (!v->is_object()) throw error(r.at(path) + " (" + dump(*v) + ") must be an object");
    if (v->empty()) continue;
    rope = v;
    rope_key = path;
    break;
  }
  const json empty = json::object();
  if (!rope) rope = &empty;
  names.scaling = rope_key;
  names.original = rope_key + ".original_max_position_embeddings";
  if (!member(*rope, "rope_type") && !member(*rope, "type") && !member(*rope, "rope_theta")) {
    for (const auto& [key, value] : rope->items()) {
      if (value.is_object()) {
        throw error(r.at(rope_key) + " holds per-layer-type parameters ('" + key +
                    "'); only one set of RoPE parameters for every layer is supported");
      }
    }
  }

  // rope_type (or the legacy "type"); Phi-3's config class maps its legacy "su" and "yarn".
  std::string type_name = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (const json* v = member(*rope, key)) {
      if (!v->is_string()) throw error(r.at(rope_key + "." + key) + " must be a string");
      type_name = v->get<std::string>();
      if (type_name == "yarn" && c.model_type == "phi3") type_name = "longrope";
      try {
        c.scaling.type = rope_scaling_type_from_string(type_name);
      } catch (const error& e) {
        throw error(r.at(rope_key + "." + key) + ": " + e.what());
      }
      break;
    }
  }

  // rope_theta: the rope dictionary's own first (transformers 5 keeps it there), then the
  // config's; HF's default_theta (10000) when neither has one.
  names.theta = "rope_theta";
  if (const json* v = member(*rope, "rope_theta")) {
    names.theta = rope_key + ".rope_theta";
    c.theta = as_number(*v, r.at(names.theta));
  } else if (auto [v, key] = r.find("rope_theta"); v) {
    names.theta = key;
    c.theta = as_number(*v, r.at(key));
  }

  // head_dim: DeepSeek's qk_rope_head_dim (HF's DeepseekV2Config sets head_dim to it), else
  // head_dim, else hidden_size / num_attention_heads.
  if (auto [v, key] = r.find("qk_rope_head_dim"); v) {
    names.head_dim = key;
    c.head_dim = as_int(*v, r.at(key));
  } else if (auto [hd, hd_key] = r.find("head_dim"); hd) {
    names.head_dim = hd_key;
    c.head_dim = as_int(*hd, r.at(hd_key));
  } else {
    auto [hs, hs_key] = r.find("hidden_size");
    auto [nh, nh_key] = r.find("num_attention_heads");
    if (!hs || !nh) {
      throw error(r.at("head_dim") + " is missing, and so is " + (hs ? nh_key : hs_key) +
                  " to derive it from hidden_size / num_attention_heads");
    }
    const int hidden = as_int(*hs, r.at(hs_key));
    const int heads = as_int(*nh, r.at(nh_key));
    if (heads <= 0) {
      throw error(r.at(nh_key) + " (" + std::to_string(heads) + ") must be > 0");
    }
    if (hidden <= 0) throw error(r.at(hs_key) + " (" + std::to_string(hidden) + ") must be > 0");
    names.head_dim = hs_key + " / " + nh_key;
    c.head_dim = hidden / heads;
  }

  // partial_rotary_factor: the config's wins over the rope dictionary's (HF's
  // standardize_rope_params copies the config attribute in).
  if (auto [v, key] = r.find("partial_rotary_factor"); v) {
    names.partial_rotary_factor = key;
    c.partial_rotary_factor = as_number(*v, r.at(key));
  } else if (const json* p = member(*rope, "partial_rotary_factor")) {
    names.partial_rotary_factor = rope_key + ".partial_rotary_factor";
    c.partial_rotary_factor = as_number(*p, r.at(names.partial_rotary_factor));
  }

  if (auto [v, key] = r.find("max_position_embeddings"); v) {
    names.max_pos = key;
    c.max_position_embeddings = as_integer(*v, r.at(key));
    if (c.max_position_embeddings <= 0) {
      throw error(r.at(key) + " (" + num(c.max_position_embeddings) + ") must be > 0");
    }
  }

  // The scaling parameters.
  rope_scaling& s = c.scaling;
  const std::string where = r.at(rope_key);
  s.factor = optional_number(*rope, "factor", where);
  s.attention_factor = optional_number(*rope, "attention_factor", where);
  s.beta_fast = optional_number(*rope, "beta_fast", where);
  s.beta_slow = optional_number(*rope, "beta_slow", where);
  s.mscale = optional_number(*rope, "mscale", where);
  s.mscale_all_dim = optional_number(*rope, "mscale_all_dim", where);
  s.low_freq_factor = optional_number(*rope, "low_freq_factor", where);
  s.high_freq_factor = optional_number(*rope, "high_freq_factor", where);
  s.short_factor = number_list(*rope, "short_factor", where);
  s.long_factor = number_list(*rope, "long_factor", where);
  if (const json* v = member(*rope, "truncate")) {
    if (!v->is_boolean()) throw error(where + ".truncate (" + dump(*v) + ") must be true or false");
    s.truncate = v->get<bool>();
  }
  // original_max_position_embeddings: a top-level one wins (HF's Phi-3 exception in
  // standardize_rope_params), else the rope dictionary's.
  if (auto [v, key] = r.find("original_max_position_embeddings"); v) {
    names.original = key;
    s.original_max_position_embeddings = as_integer(*v, r.at(key));
  } else if (const json* o = member(*rope, "original_max_position_embeddings")) {
    s.original_max_position_embeddings =
        as_integer(*o, where + ".original_max_position_embeddings");
  }

  // MRoPE: inside the rope dictionary (Qwen2-VL, Qwen3-VL), else at the config's level.
  {
    const json* v = member(*rope, "mrope_section");
    std::string key = rope_key + ".mrope_section";
    if (!v) std::tie(v, key) = r.find("mrope_section");
    if (v) {
      names.mrope_section = key;
      if (!v->is_array() || v->size() != 3) {
        throw error(r.at(key) + " (" + dump(*v) + ") must be a list of 3 integers");
      }
      std::array<int, 3> section{};
      for (int i = 0; i < 3; ++i) {
        section[i] = as_int((*v)[i], r.at(key) + "[" + std::to_string(i) + "]");
      }
      c.mrope_section = section;
    }
    const json* inter = member(*rope, "mrope_interleaved");
    key = rope_key + ".mrope_interleaved";
    if (!inter) std::tie(inter, key) = r.find("mrope_interleaved");
    if (inter) {
      if (!inter->is_boolean()) {
        throw error(r.at(key) + " (" + dump(*inter) + ") must be true or false");
      }
      c.mrope_interleaved = inter->get<bool>();
    }
  }

  validate(c, names);
  c.rotary_dim = rotary_dim_of(c.head_dim, c.partial_rotary_factor, c.scaling.type);
  return c;
}

rope_frequencies rope_config::frequencies(std::int64_t seq_len) const {
  validate(*this, field_names{});
  if (seq_len < 0) throw error("seq_len (" + std::to_string(seq_len) + ") must be >= 0");
  const int d = effective_rotary_dim();
  const std::size_t half = static_cast<std::size_t>(d / 2);
  const rope_scaling& s = scaling;
  const double max_pos = static_cast<double>(max_position_embeddings);
  const double original =
      static_cast<double>(s.original_max_position_embeddings.value_or(max_position_embeddings));
  // theta^(-2i/d), the unscaled frequencies every type starts from.
  const std::vector<double> base = rope_inv_freq(d, theta);

  rope_frequencies f;
  f.inv_freq = base;
  switch (s.type) {
    case rope_scaling_type::none:
      break;
    case rope_scaling_type::linear:
      for (double& v : f.inv_freq) v /= *s.factor;
      break;
    case rope_scaling_type::dynamic: {
      // HF: seq_len None (here 0) means max_position_embeddings; a shorter sequence uses the
      // original frequencies (dynamic_rope_update resets to them), which the max() gives.
      const double len = std::max(static_cast<double>(seq_len), max_pos);
      const double factor = *s.factor;
      const double scaled_theta =
          theta * std::pow(factor * len / max_pos - (factor - 1), static_cast<double>(d) / (d - 2));
      f.inv_freq = rope_inv_freq(d, scaled_theta);
      break;
    }
    case rope_scaling_type::yarn: {
      // Current HF: the configured factor as given; derived only when the config has none.
      const double factor = s.factor.value_or(max_pos / original);
      if (s.attention_factor) {
        f.attention_scaling = *s.attention_factor;
      } else if (s.mscale.value_or(0) != 0 && s.mscale_all_dim.value_or(0) != 0) {
        f.attention_scaling = get_mscale(factor, *s.mscale) / get_mscale(factor, *s.mscale_all_dim);
      } else {
        f.attention_scaling = get_mscale(factor, 1.0);
      }
      const double beta_fast = s.beta_fast.value_or(0) != 0 ? *s.beta_fast : 32.0;
      const double beta_slow = s.beta_slow.value_or(0) != 0 ? *s.beta_slow : 1.0;
      // The dimension (in [0, d)) whose wavelength fits `rotations` turns in the original
      // context; frequencies below `low` extrapolate, above `high` interpolate.
      auto correction_dim = [&](double rotations) {
        return d * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
      };
      double low = correction_dim(beta_fast);
      double high = correction_dim(beta_slow);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(d - 1));
      if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
      for (std::size_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
        f.inv_freq[i] = base[i] / factor * (1.0 - extrapolation) + base[i] * extrapolation;
      }
      break;
    }
    case rope_scaling_type::longrope: {
      const double factor = s.factor.value_or(max_pos / original);
      if (s.attention_factor) {
        f.attention_scaling = *s.attention_factor;
      } else {
        f.attention_scaling =
            factor <= 1 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(original));
      }
      const std::vector<double>& ext =
          static_cast<double>(seq_len) > original ? s.long_factor : s.short_factor;
      for (std::size_t i = 0; i < half; ++i) f.inv_freq[i] = base[i] / ext[i];
      break;
    }
    case rope_scaling_type::llama3: {
      const double factor = *s.factor;
      const double low_ff = *s.low_freq_factor;
      const double high_ff = *s.high_freq_factor;
      const double low_freq_wavelen = original / low_ff;
      const double high_freq_wavelen = original / high_ff;
      for (std::size_t i = 0; i < half; ++i) {
        const double wavelen = 2 * std::numbers::pi / base[i];
        if (wavelen > low_freq_wavelen) {
          f.inv_freq[i] = base[i] / factor;  // low frequencies: fully interpolated
        } else if (wavelen >= high_freq_wavelen) {
          // Between the two bounds: a smooth blend of interpolated and original.
          const double smooth = (original / wavelen - low_ff) / (high_ff - low_ff);
          f.inv_freq[i] = (1 - smooth) * base[i] / factor + smooth * base[i];
        }  // high frequencies keep base[i]
      }
      break;
    }
    case rope_scaling_type::proportional: {
      // HF: int(partial_rotary_factor * head_dim // 2) frequencies theta^(-2i/head_dim), the
      // rest 0 (those pairs are not rotated), all divided by factor.
      const auto rotated = static_cast<std::size_t>(
          std::floor(partial_rotary_factor * static_cast<double>(head_dim) / 2));
      for (std::size_t i = 0; i < half; ++i) {
        f.inv_freq[i] = i < rotated ? base[i] / s.factor.value_or(1.0) : 0.0;
      }
      break;
    }
  }
  const bool zeros_allowed = s.type == rope_scaling_type::proportional;
  for (std::size_t i = 0; i < half; ++i) {
    if (!std::isfinite(f.inv_freq[i]) ||
        !(f.inv_freq[i] > 0 || (zeros_allowed && f.inv_freq[i] == 0))) {
      throw error("rope_type '" + std::string(to_string(s.type)) + "' gives inv_freq[" +
                  std::to_string(i) + "] = " + num(f.inv_freq[i]) + "; check its parameters");
    }
  }
  if (!std::isfinite(f.attention_scaling) || !(f.attention_scaling > 0)) {
    throw error("rope_type '" + std::string(to_string(s.type)) + "' gives attention_scaling " +
                num(f.attention_scaling) + "; check its parameters");
  }
  return f;
}

}  // namespace tilerope
