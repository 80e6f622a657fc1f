#include "check/case_file.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_bounded.h"
#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"
#include "tilerope/rope_config.h"

namespace tilerope::check {

namespace {

// Bounds of what a case's integer fields may hold; check_case_fields then bounds the buffers
// and tables they imply.
constexpr std::int64_t max_extent = std::int64_t{1} << 31;
constexpr std::int64_t max_offset = std::int64_t{1} << 62;
constexpr std::int64_t max_table_positions = std::int64_t{1} << 31;

// A value for an error message, cut short.
std::string brief(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A JSON integer in [lo, hi]: floats, and integers out of range, are errors (never truncated).
std::int64_t integer_in(const nlohmann::json& v, std::int64_t lo, std::int64_t hi) {
  // non-negative JSON integers are stored unsigned, up to 2^64 - 1
  const bool fits =
      v.is_number_unsigned()
          ? v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi) &&
                (lo <= 0 || v.get<std::uint64_t>() >= static_cast<std::uint64_t>(lo))
          : v.is_number_integer() && v.get<std::int64_t>() >= lo && v.get<std::int64_t>() <= hi;
  if (!fits) {
    std::string what = "value ";
    what += brief(v);
    what += " must be an integer in [";
    what += std::to_string(lo);
    what += ", ";
    what += std::to_string(hi);
    what += "]";
    throw error(what);
  }
  return v.get<std::int64_t>();
}

// A finite JSON number.
double finite_number(const nlohmann::json& v) {
  if (!v.is_number()) throw error("value " + brief(v) + " must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw error("value " + brief(v) + " must be finite");
  return d;
}

// [t, h, w] of an MRoPE section.
std::array<int, 3> section_of(const nlohmann::json& v) {
  if (!v.is_array() || v.size() != 3) throw error("value " + brief(v) + " must be 3 integers");
  std::array<int, 3> s{};
  for (int i = 0; i < 3; ++i)
    s[i] = static_cast<int>(integer_in(v[i], 0, rope_config::max_head_dim));
  return s;
}

// A tile shape: up to 8 extents.
std::vector<std::int64_t> tile_of(const nlohmann::json& v) {
  if (!v.is_array() || v.size() > 8)
    throw error("value " + brief(v) + " must be a list of up to 8 integers");
  std::vector<std::int64_t> t;
  for (const auto& e : v) t.push_back(integer_in(e, 0, max_extent));
  return t;
}

// Sets `name` from the object's "name" and calls set(key, value) for every other key; set
// returns false for an unknown key. Errors name the case and the key.
void for_each_case_key(const nlohmann::json& j, std::string& name,
                       const std::function<bool(const std::string&, const nlohmann::json&)>& set) {
  if (!j.is_object()) throw error("a case must be a JSON object, got " + brief(j));
  const auto n = j.find("name");
  if (n != j.end() && !n->is_string())
    throw error("a case's name must be a string, got " + brief(*n));
  name = n != j.end() ? n->get<std::string>() : std::string("unnamed");
  for (const auto& [key, v] : j.items()) {
    if (key == "name") continue;
    try {
      if (!set(key, v)) throw error("unknown key");
    } catch (const nlohmann::json::exception&) {
      throw error("case '" + name + "': key '" + key + "' has a bad value " + brief(v));
    } catch (const error& e) {
      throw error("case '" + name + "': key '" + key + "': " + e.what());
    }
  }
}

// The case objects of a text: a JSON list of them, or {"cases": [...]}.
nlohmann::json case_list_of(const std::string& text, const std::string& origin) {
  nlohmann::json j = detail::parse_json_bounded(text, origin);
  if (j.is_object() && j.contains("cases")) {
    nlohmann::json cases = std::move(j["cases"]);
    j = std::move(cases);
  }
  if (!j.is_array()) throw error(origin + " must hold a list of cases or {\"cases\": [...]}");
  return j;
}

}  // namespace

rope_case case_from_json(const nlohmann::json& j) {
  rope_case c;
  for_each_case_key(j, c.name, [&](const std::string& key, const nlohmann::json& v) {
    if (key == "style")
      c.style = rope_style_from_string(v.get<std::string>());
    else if (key == "dtype")
      c.x_type = dtype_from_string(v.get<std::string>());
    else if (key == "layout")
      c.layout = x_layout_from_string(v.get<std::string>());
    else if (key == "batch")
      c.batch = integer_in(v, 0, max_extent);
    else if (key == "tokens")
      c.tokens = integer_in(v, 0, max_extent);
    else if (key == "q_heads")
      c.q_heads = integer_in(v, 0, max_extent);
    else if (key == "k_heads")
      c.k_heads = integer_in(v, 0, max_extent);
    else if (key == "head_dim")
      c.head_dim = integer_in(v, 0, max_extent);
    else if (key == "rotary_dim")
      c.rotary_dim = static_cast<int>(integer_in(v, 0, rope_config::max_head_dim));
    else if (key == "packed")
      c.packed = v.get<bool>();
    else if (key == "inplace")
      c.inplace = v.get<bool>();
    else if (key == "backward")
      c.backward = v.get<bool>();
    else if (key == "positions")
      c.positions = v.get<std::string>();
    else if (key == "shared_positions")
      c.shared_positions = v.get<bool>();
    else if (key == "offset")
      c.offset = integer_in(v, 0, max_offset);
    else if (key == "max_pos")
      c.max_pos = integer_in(v, 1, max_table_positions);
    else if (key == "table")
      c.table = v.get<std::string>();
    else if (key == "precision")
      c.precision = angle_precision_from_string(v.get<std::string>());
    else if (key == "theta")
      c.theta = finite_number(v);
    else if (key == "seed")
      c.seed = static_cast<std::uint64_t>(integer_in(v, 0, INT64_MAX));
    else if (key == "atol")
      c.atol = finite_number(v);
    else if (key == "rtol")
      c.rtol = finite_number(v);
    else if (key == "mrope_section")
      c.mrope_section = section_of(v);
    else if (key == "mrope_layout")
      c.mrope = mrope_layout_from_string(v.get<std::string>());
    else if (key == "vision_2d")
      c.vision_2d = v.get<bool>();
    else if (key == "output_layout")
      c.output_layout = rope_output_layout_from_string(v.get<std::string>());
    else if (key == "rows")
      c.rows = v.get<std::string>();
    else if (key == "rows_half")
      c.rows_half = v.get<bool>();
    else if (key == "random_rows")
      c.random_rows = v.get<bool>();
    else if (key == "qk_norm")
      c.qk_norm = v.get<bool>();
    else if (key == "zero_weights")
      c.zero_weights = v.get<bool>();
    else if (key == "eps")
      c.eps = finite_number(v);
    else if (key == "norm_rounding")
      c.norm_rounding = qk_norm_rounding_from_string(v.get<std::string>());
    else
      return false;
    return true;
  });
  return c;
}

ref_case ref_case_from_json(const nlohmann::json& j) {
  ref_case c;
  for_each_case_key(j, c.name, [&](const std::string& key, const nlohmann::json& v) {
    if (key == "kernel")
      c.kernel = ref_kernel_from_string(v.get<std::string>());
    else if (key == "dtype")
      c.x_type = dtype_from_string(v.get<std::string>());
    else if (key == "batch")
      c.batch = integer_in(v, 0, max_extent);
    else if (key == "seq")
      c.seq = integer_in(v, 0, max_extent);
    else if (key == "heads")
      c.heads = integer_in(v, 0, max_extent);
    else if (key == "k_heads")
      c.k_heads = integer_in(v, 0, max_extent);
    else if (key == "head_dim")
      c.head_dim = integer_in(v, 0, max_extent);
    else if (key == "section")
      c.section = section_of(v);
    else if (key == "table_seq1")
      c.table_seq1 = v.get<bool>();
    else if (key == "output") {
      const auto o = v.get<std::string>();
      if (o != "interleaved" && o != "split-half")
        throw error("output must be interleaved or split-half");
      c.output = o == "interleaved" ? reference::interleave_output::interleaved
                                    : reference::interleave_output::split_half;
    } else if (key == "path") {
      const auto p = v.get<std::string>();
      if (p != "deinterleave" && p != "gathermask")
        throw error("path must be deinterleave or gathermask");
      c.path = p == "deinterleave" ? reference::interleave_path::deinterleave
                                   : reference::interleave_path::gathermask;
    } else if (key == "eps")
      c.eps = finite_number(v);
    else if (key == "seed")
      c.seed = static_cast<std::uint64_t>(integer_in(v, 0, INT64_MAX));
    else if (key == "atol")
      c.atol = finite_number(v);
    else if (key == "rtol")
      c.rtol = finite_number(v);
    else if (key == "tile")
      c.tiles.tile = tile_of(v);
    else if (key == "ub_bytes")
      c.tiles.ub_bytes = static_cast<std::size_t>(integer_in(v, 0, max_extent));
    else
      return false;
    return true;
  });
  return c;
}

case_list cases_from_text(const std::string& text, const std::string& origin) {
  case_list cases;
  for (const auto& item : case_list_of(text, origin)) {
    if (item.is_object() && item.contains("kernel")) {
      cases.ref_cases.push_back(ref_case_from_json(item));
    } else {
      cases.rope_cases.push_back(case_from_json(item));
    }
  }
  return cases;
}

case_list cases_from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error("cannot open case file '" + path + "'");
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) throw error("cannot read case file '" + path + "'");
  return cases_from_text(text.str(), "case file '" + path + "'");
}

}  // namespace tilerope::check
