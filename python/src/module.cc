// tilerope._C: the C++ API over DLPack arrays (torch tensors, numpy arrays), with no copies.
// Every argument is turned into a tensor_view while the GIL is held; the kernel then runs with
// the GIL released. tilerope::error becomes ValueError, an unsupported dtype TypeError.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "output_cache.h"
#include "tile_module.h"
#include "tilerope/tilerope.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tilerope::python {
namespace {

using python::view_of;

std::optional<tensor_view> view_of(const optional_array& a, const char* name) {
  if (!a) return std::nullopt;
  return view_of(*a, name);
}

/// Where cos and sin come from, and the positions that index them: the Python form of
/// rope_positions + rope_angles. It keeps its arrays alive for as long as it exists.
struct angle_source {
  rope_positions positions = rope_positions::none();
  rope_angles angles;
  std::vector<array> keep_alive;

  /// One cos/sin row per token (rope_angles::from_token_rows), optionally planes.
  static angle_source rows(const array& cos, const array& sin, std::vector<int> axis_of_frequency) {
    angle_source s;
    s.angles = rope_angles::from_token_rows(view_of(cos, "cos"), view_of(sin, "sin"),
                                            std::move(axis_of_frequency));
    s.keep_alive = {cos, sin};
    return s;
  }

  void set_positions(const optional_array& ids, std::int64_t offset,
                     std::vector<int> axis_of_frequency) {
    if (!ids) {
      if (!axis_of_frequency.empty()) {
        throw error("axis_of_frequency needs positions [A, T]");
      }
      positions = rope_positions::from_offset(offset);
      return;
    }
    if (offset != 0) {
      throw error("offset (" + std::to_string(offset) + ") and positions are exclusive");
    }
    positions = axis_of_frequency.empty() ? rope_positions::from_ids(view_of(*ids, "positions"))
                                          : rope_positions::from_axes(view_of(*ids, "positions"),
                                                                      std::move(axis_of_frequency));
    keep_alive.push_back(*ids);
  }

  /// Half-width tables [max_pos, rotary_dim/2] looked up by position.
  static angle_source table(const array& cos, const array& sin, const optional_array& positions,
                            std::int64_t offset, std::vector<int> axis_of_frequency) {
    angle_source s;
    s.angles = rope_angles::from_table(view_of(cos, "cos"), view_of(sin, "sin"));
    s.keep_alive = {cos, sin};
    s.set_positions(positions, offset, std::move(axis_of_frequency));
    return s;
  }

  /// cos/sin computed per token from the frequencies.
  static angle_source frequencies(std::vector<double> inv_freq, double attention_scaling,
                                  std::string_view precision, const optional_array& positions,
                                  std::int64_t offset, std::vector<int> axis_of_frequency) {
    angle_source s;
    s.angles =
        rope_angles::from_frequencies(rope_frequencies{std::move(inv_freq), attention_scaling},
                                      angle_precision_from_string(precision));
    s.set_positions(positions, offset, std::move(axis_of_frequency));
    return s;
  }
};

rope_tensors tensors_of(const array& q, const optional_array& k, const optional_array& q_out,
                        const optional_array& k_out) {
  rope_tensors x;
  x.q = view_of(q, "q");
  x.k = view_of(k, "k");
  x.q_out = view_of(q_out, "q_out");
  x.k_out = view_of(k_out, "k_out");
  return x;
}

rope_options options_of(int rotary_dim, bool backward, bool split_half) {
  rope_options o;
  o.rotary_dim = rotary_dim;
  o.backward = backward;
  o.output_layout = split_half ? rope_output_layout::split_half : rope_output_layout::as_input;
  return o;
}

qk_norm norm_of(const array& q_weight, const optional_array& k_weight, double eps,
                std::string_view rounding) {
  qk_norm n;
  n.q_weight = view_of(q_weight, "q_weight");
  n.k_weight = view_of(k_weight, "k_weight");
  n.eps = eps;
  n.rounding = qk_norm_rounding_from_string(rounding);
  return n;
}

void rope(std::string_view style, const array& q, const optional_array& k,
          const optional_array& q_out, const optional_array& k_out, const angle_source& angles,
          int rotary_dim, bool backward, bool split_half) {
  const rope_style s = rope_style_from_string(style);
  const rope_tensors x = tensors_of(q, k, q_out, k_out);
  const rope_options o = options_of(rotary_dim, backward, split_half);
  nb::gil_scoped_release unlocked;
  rope_apply(s, x, angles.positions, angles.angles, o);
}

void qk_norm_rope(std::string_view style, const array& q, const optional_array& k,
                  const optional_array& q_out, const optional_array& k_out,
                  const angle_source& angles, const array& q_weight, const optional_array& k_weight,
                  double eps, std::string_view rounding, int rotary_dim) {
  const rope_style s = rope_style_from_string(style);
  const rope_tensors x = tensors_of(q, k, q_out, k_out);
  const qk_norm n = norm_of(q_weight, k_weight, eps, rounding);
  const rope_options o = options_of(rotary_dim, false, false);
  nb::gil_scoped_release unlocked;
  qk_norm_rope_apply(s, x, angles.positions, angles.angles, n, o);
}

void qk_norm_rope_grad(std::string_view style, const array& q, const optional_array& k,
                       const array& dq_out, const optional_array& dk_out, const optional_array& dq,
                       const optional_array& dk, const array& dq_weight,
                       const optional_array& dk_weight, const angle_source& angles,
                       const array& q_weight, const optional_array& k_weight, double eps,
                       int rotary_dim) {
  const rope_style s = rope_style_from_string(style);
  qk_norm_rope_grad_tensors g;
  g.q = view_of(q, "q");
  g.k = view_of(k, "k");
  g.dq_out = view_of(dq_out, "dq_out");
  g.dk_out = view_of(dk_out, "dk_out");
  g.dq = view_of(dq, "dq");
  g.dk = view_of(dk, "dk");
  g.dq_weight = view_of(dq_weight, "dq_weight");
  g.dk_weight = view_of(dk_weight, "dk_weight");
  const qk_norm n = norm_of(q_weight, k_weight, eps, "fp32_once");
  const rope_options o = options_of(rotary_dim, false, false);
  nb::gil_scoped_release unlocked;
  qk_norm_rope_backward(s, g, angles.positions, angles.angles, n, o);
}

/// A model's frequencies from its config.json text, with the settings they came from.
nb::dict frequencies_of_config(const std::string& json, const std::string& origin,
                               std::int64_t seq_len) {
  const rope_config c = rope_config::from_hf_json_text(json, origin);
  const rope_frequencies f = c.frequencies(seq_len);
  nb::dict d;
  d["inv_freq"] = f.inv_freq;
  d["attention_scaling"] = f.attention_scaling;
  d["rope_type"] = std::string(to_string(c.scaling.type));
  d["theta"] = c.theta;
  d["head_dim"] = c.head_dim;
  d["rotary_dim"] = c.effective_rotary_dim();
  d["mrope_section"] = c.mrope_section;
  d["mrope_interleaved"] = c.mrope_interleaved;
  return d;
}

}  // namespace
}  // namespace tilerope::python

NB_MODULE(_C, m) {
  using namespace tilerope;
  using namespace tilerope::python;
  m.doc() = "tilerope's C++ kernels over DLPack arrays (private: use the tilerope package)";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tilerope::error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<angle_source>(m, "angles",
                           "Where cos/sin come from, and the positions that index them")
      .def_static("rows", &angle_source::rows, "cos"_a, "sin"_a,
                  "axis_of_frequency"_a = std::vector<int>{})
      .def_static("table", &angle_source::table, "cos"_a, "sin"_a,
                  "positions"_a.none() = nb::none(), "offset"_a = 0,
                  "axis_of_frequency"_a = std::vector<int>{})
      .def_static("frequencies", &angle_source::frequencies, "inv_freq"_a,
                  "attention_scaling"_a = 1.0, "precision"_a = "accurate",
                  "positions"_a.none() = nb::none(), "offset"_a = 0,
                  "axis_of_frequency"_a = std::vector<int>{});

  m.def("rope", &rope, "style"_a, "q"_a, "k"_a.none(), "q_out"_a.none(), "k_out"_a.none(),
        "angles"_a, "rotary_dim"_a = 0, "backward"_a = false, "split_half"_a = false,
        "rope_apply: q (and k) rotated in place, or into q_out (and k_out)");
  m.def("qk_norm_rope", &qk_norm_rope, "style"_a, "q"_a, "k"_a.none(), "q_out"_a.none(),
        "k_out"_a.none(), "angles"_a, "q_weight"_a, "k_weight"_a.none(), "eps"_a,
        "rounding"_a = "fp32_once", "rotary_dim"_a = 0, "qk_norm_rope_apply");
  m.def("qk_norm_rope_backward", &qk_norm_rope_grad, "style"_a, "q"_a, "k"_a.none(), "dq_out"_a,
        "dk_out"_a.none(), "dq"_a.none(), "dk"_a.none(), "dq_weight"_a, "dk_weight"_a.none(),
        "angles"_a, "q_weight"_a, "k_weight"_a.none(), "eps"_a, "rotary_dim"_a = 0,
        "qk_norm_rope_backward (weight gradients overwritten, f32)");
  m.def("frequencies_of_config", &frequencies_of_config, "json"_a, "origin"_a, "seq_len"_a = 0);
  m.def(
      "cached_empty",
      [](const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
         std::string_view type) {
        PyObject* capsule = cached_empty(shape, strides, dtype_from_string(type));
        if (!capsule) throw nb::python_error();
        return nb::steal(capsule);
      },
      "shape"_a, "strides"_a, "dtype"_a,
      "A DLPack capsule of an uninitialised dense CPU tensor from the output cache");
  m.def("output_cache_bytes", &output_cache_bytes);
  m.def("output_cache_limit", &output_cache_limit);
  m.def("set_output_cache_limit", &set_output_cache_limit, "bytes"_a);
  m.def("empty_output_cache", &empty_output_cache);
  m.def("mrope_axis_map", [](std::array<int, 3> section, std::string_view layout) {
    return mrope_axis_map(section, mrope_layout_from_string(layout));
  });

  m.def("set_num_threads", &set_num_threads, "n"_a);
  m.def("num_threads", &num_threads);
  m.def("set_cpu_target", &set_cpu_target, "name"_a);
  m.def("cpu_target", &cpu_target);
  m.def("cpu_class", &cpu_class);
  m.def("compiled_cpu_targets", &compiled_cpu_targets);
  m.def("supported_cpu_targets", &supported_cpu_targets);
  m.def("version", [] { return std::string(version()); });

  bind_tile(m.def_submodule("tile", "the tile layer (private: use tilerope.pypto)"));
}
