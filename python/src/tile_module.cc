// tilerope._C.tile: the tile layer for tilerope.pypto. Tensors are DLPack arrays (no copy); a
// kernel body is a Python callable that run_kernel calls twice, with the GIL held (the
// checking pass, then the executing pass). tilerope::error becomes ValueError.

#include "tile_module.h"

#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "arrays.h"
#include "tilerope/dtype.h"
#include "tilerope/error.h"
#include "tilerope/tile.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tilerope::python {
namespace {

using tile::shape_t;
using tile::value;
using optional_shape = std::optional<shape_t>;

tile::cast_mode cast_mode_of(std::string_view name) {
  for (auto m : {tile::cast_mode::rint, tile::cast_mode::round, tile::cast_mode::floor,
                 tile::cast_mode::ceil, tile::cast_mode::trunc}) {
    if (tile::to_string(m) == name) return m;
  }
  throw error("cast mode '" + std::string(name) +
              "' is not one of rint, round, floor, ceil, trunc");
}

nb::dict report_of(const tile::kernel_report& r) {
  nb::dict d;
  d["name"] = r.name;
  d["peak_ub_bytes"] = r.peak_ub_bytes;
  d["ub_budget_bytes"] = r.ub_budget_bytes;
  d["tiles"] = r.tiles;
  d["assembles"] = r.assembles;
  nb::list chunks;
  for (const auto& c : r.chunks) chunks.append(nb::make_tuple(c.begin, c.end, c.factor));
  d["chunks"] = chunks;
  d["seconds"] = r.seconds;
  return d;
}

}  // namespace

void bind_tile(nb::module_ m) {
  nb::class_<tile::tensor>(m, "Tensor", "a kernel parameter: a CPU array, f32 / f16 / bf16")
      .def(
          "__init__",
          [](tile::tensor* t, const std::string& name, const array& a) {
            new (t) tile::tensor(name, view_of(a, name.c_str()));
          },
          "name"_a, "array"_a)
      .def_prop_ro("name", &tile::tensor::name)
      .def_prop_ro("shape", &tile::tensor::shape)
      .def_prop_ro("dtype", [](const tile::tensor& t) { return std::string(to_string(t.type())); });

  nb::class_<value>(m, "Value", "a tile-program value: a view or the result of ops")
      .def_prop_ro("shape", &value::shape)
      .def_prop_ro("valid_shape", &value::valid_shape)
      .def_prop_ro("dtype", [](const value& v) { return std::string(to_string(v.type())); });

  m.def(
      "view_tensor",
      nb::overload_cast<const tile::tensor&, const shape_t&, const shape_t&, const optional_shape&>(
          &tile::view),
      "t"_a, "shape"_a, "offsets"_a, "valid_shape"_a.none() = nb::none());
  m.def("view_value",
        nb::overload_cast<const value&, const shape_t&, const shape_t&, const optional_shape&>(
            &tile::view),
        "v"_a, "shape"_a, "offsets"_a, "valid_shape"_a.none() = nb::none());
  m.def("assemble", &tile::assemble, "src"_a, "offsets"_a, "out"_a);

  m.def("neg", &tile::neg);
  m.def("rsqrt", &tile::rsqrt);
  m.def("add", nb::overload_cast<const value&, const value&>(&tile::add));
  m.def("sub", nb::overload_cast<const value&, const value&>(&tile::sub));
  m.def("mul", nb::overload_cast<const value&, const value&>(&tile::mul));
  m.def("div", nb::overload_cast<const value&, const value&>(&tile::div));
  m.def("add_scalar", nb::overload_cast<const value&, double>(&tile::add));
  m.def("sub_scalar", nb::overload_cast<const value&, double>(&tile::sub));
  m.def("mul_scalar", nb::overload_cast<const value&, double>(&tile::mul));
  m.def("div_scalar", nb::overload_cast<const value&, double>(&tile::div));
  m.def("rdiv_scalar", nb::overload_cast<double, const value&>(&tile::div));
  m.def("sum", &tile::sum, "x"_a, "dim"_a, "keepdim"_a);
  m.def("amax", &tile::amax, "x"_a, "dim"_a, "keepdim"_a);
  m.def(
      "cast",
      [](const value& x, std::string_view to, std::string_view mode) {
        return tile::cast(x, dtype_from_string(to), cast_mode_of(mode));
      },
      "x"_a, "dtype"_a, "mode"_a);
  m.def("concat", &tile::concat, "xs"_a, "dim"_a);
  m.def("deinterleave", &tile::deinterleave, "x"_a);
  m.def("interleave", &tile::interleave, "even"_a, "odd"_a);
  m.def("gathermask", &tile::gathermask, "x"_a, "mode"_a);
  m.def("expand_clone", &tile::expand_clone, "x"_a, "shape"_a);
  m.def("reshape", &tile::reshape, "x"_a, "shape"_a);
  m.def("set_vec_tile_shapes", &tile::set_vec_tile_shapes, "dims"_a);

  m.def(
      "loop_chunks",
      [](std::int64_t start, std::int64_t stop, std::int64_t step,
         const std::vector<std::int64_t>& unroll) {
        std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> out;
        for (const auto& c : tile::loop_chunks(start, stop, step, unroll))
          out.emplace_back(c.begin, c.end, c.factor);
        return out;
      },
      "start"_a, "stop"_a, "step"_a, "unroll_list"_a);
  nb::class_<tile::loop_scope>(m, "LoopScope", "a loop the caller iterates")
      .def(nb::init<std::int64_t, std::int64_t, std::int64_t, std::string_view,
                    const std::vector<std::int64_t>&>(),
           "start"_a, "stop"_a, "step"_a, "name"_a, "unroll_list"_a)
      .def_prop_ro("chunks",
                   [](const tile::loop_scope& s) {
                     std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> out;
                     for (const auto& c : s.chunks()) out.emplace_back(c.begin, c.end, c.factor);
                     return out;
                   })
      .def("begin_chunk", &tile::loop_scope::begin_chunk, "k"_a)
      .def("close", &tile::loop_scope::close);

  m.def(
      "run_kernel",
      [](std::string_view name, const std::vector<tile::tensor>& params,
         const std::function<void()>& body, std::size_t ub_bytes) {
        return report_of(tile::run_kernel(name, params, body, tile::kernel_options{ub_bytes}));
      },
      "name"_a, "params"_a, "body"_a, "ub_bytes"_a);
}

}  // namespace tilerope::python
