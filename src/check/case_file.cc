#include "check/case_file.h"

#include <array>
#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"

namespace tilerope::check {

namespace {

// Sets `name` from the object's "name" and calls set(key, value) for every other key; set
// returns false for an unknown key. Errors name the case and the key.
void for_each_case_key(const nlohmann::json& j, std::string& name,
                       const std::function<bool(const std::string&, const nlohmann::json&)>& set) {
  if (!j.is_object()) throw error("a case must be a JSON object, got " + j.dump());
  name = j.value("name", std::string("unnamed"));
  for (const auto& [key, v] : j.items()) {
    if (key == "name") continue;
    try {
      if (!set(key, v)) throw error("unknown key");
    } catch (const nlohmann::json::exception&) {
      throw error("case '" + name + "': key '" + key + "' has a bad value " + v.dump());
    } catch (const error& e) {
      throw error("case '" + name + "': key '" + key + "': " + e.what());
    }
  }
}

// The case objects of a file: a JSON list of them, or {"cases": [...]}.
nlohmann::json read_case_list(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw error("cannot open case file '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw error("case file '" + path + "' is not valid JSON: " + e.what());
  }
  if (j.is_object() && j.contains("cases")) j = j["cases"];
  if (!j.is_array())
    throw error("case file '" + path + "' must hold a list of cases or {\"cases\": [...]}");
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
      c.batch = v.get<std::int64_t>();
    else if (key == "tokens")
      c.tokens = v.get<std::int64_t>();
    else if (key == "q_heads")
      c.q_heads = v.get<std::int64_t>();
    else if (key == "k_heads")
      c.k_heads = v.get<std::int64_t>();
    else if (key == "head_dim")
      c.head_dim = v.get<std::int64_t>();
    else if (key == "rotary_dim")
      c.rotary_dim = v.get<int>();
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
      c.offset = v.get<std::int64_t>();
    else if (key == "max_pos")
      c.max_pos = v.get<std::int64_t>();
    else if (key == "table")
      c.table = v.get<std::string>();
    else if (key == "precision")
      c.precision = angle_precision_from_string(v.get<std::string>());
    else if (key == "theta")
      c.theta = v.get<double>();
    else if (key == "seed")
      c.seed = v.get<std::uint64_t>();
    else if (key == "atol")
      c.atol = v.get<double>();
    else if (key == "rtol")
      c.rtol = v.get<double>();
    else if (key == "mrope_section")
      c.mrope_section = v.get<std::array<int, 3>>();
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
      c.eps = v.get<double>();
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
      c.batch = v.get<std::int64_t>();
    else if (key == "seq")
      c.seq = v.get<std::int64_t>();
    else if (key == "heads")
      c.heads = v.get<std::int64_t>();
    else if (key == "k_heads")
      c.k_heads = v.get<std::int64_t>();
    else if (key == "head_dim")
      c.head_dim = v.get<std::int64_t>();
    else if (key == "section")
      c.section = v.get<std::array<int, 3>>();
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
      c.eps = v.get<double>();
    else if (key == "seed")
      c.seed = v.get<std::uint64_t>();
    else if (key == "atol")
      c.atol = v.get<double>();
    else if (key == "rtol")
      c.rtol = v.get<double>();
    else if (key == "tile")
      c.tiles.tile = v.get<std::vector<std::int64_t>>();
    else if (key == "ub_bytes")
      c.tiles.ub_bytes = v.get<std::size_t>();
    else
      return false;
    return true;
  });
  return c;
}

case_list cases_from_file(const std::string& path) {
  case_list cases;
  for (const auto& item : read_case_list(path)) {
    if (item.is_object() && item.contains("kernel")) {
      cases.ref_cases.push_back(ref_case_from_json(item));
    } else {
      cases.rope_cases.push_back(case_from_json(item));
    }
  }
  return cases;
}

}  // namespace tilerope::check
