// Casts between f32, f16 and bf16.
//
// PyPTO's rules: the target dtype is f32, f16 or bf16; fp32 -> bf16 / fp16 rounds to nearest,
// ties to even (rint) unless another mode is asked for (round, floor, ceil, trunc);
// bf16 / fp16 -> fp32 is exact. Shape and valid shape pass through.

#include <algorithm>
#include <cmath>
#include <string>

#include "core/enum_names.h"
#include "tile/tile_internal.h"
#include "tilerope/error.h"
#include "tilerope/tile.h"

namespace tilerope::tile {

namespace detail {

namespace {

// The value v rounded to dtype t with a directed or nearest mode (f16: 11 significant bits,
// bf16: 8, f32: 24), through fp64 so that each mode rounds exactly once.
float cast_value(float v, dtype t, cast_mode mode) {
  if (mode == cast_mode::rint || !std::isfinite(v) || v == 0) return round_to_type(t, v);
  const int bits = t == dtype::f16 ? 11 : t == dtype::bf16 ? 8 : 24;
  const int min_exp = t == dtype::f16 ? -14 : -126;  // smallest normal exponent
  int e = 0;
  std::frexp(static_cast<double>(v), &e);  // |v| in [2^(e-1), 2^e)
  const double step = std::ldexp(1.0, std::max(e - 1, min_exp) - (bits - 1));
  const double q = static_cast<double>(v) / step;
  double r = 0;
  switch (mode) {
    case cast_mode::round:
      r = std::round(q);
      break;
    case cast_mode::floor:
      r = std::floor(q);
      break;
    case cast_mode::ceil:
      r = std::ceil(q);
      break;
    case cast_mode::trunc:
      r = std::trunc(q);
      break;
    case cast_mode::rint:
      r = std::nearbyint(q);
      break;
  }
  return round_to_type(t, static_cast<float>(r * step));  // exact: r*step is representable
}

}  // namespace

void eval_cast(const node& n, const region& r, float* out) {
  const std::int64_t size = r.size();
  ub_buffer a(*n.in[0], r);
  eval(*n.in[0], r, a.data());
  if (current_kernel->dry) return;
  for (std::int64_t i = 0; i < size; ++i) out[i] = cast_value(a.data()[i], n.type, n.mode);
}

}  // namespace detail

namespace {
constexpr ::tilerope::detail::enum_name<cast_mode> cast_mode_names[] = {
    {cast_mode::rint, "rint"},
    {cast_mode::round, "round"},
    {cast_mode::floor, "floor"},
    {cast_mode::ceil, "ceil"},
    {cast_mode::trunc, "trunc"}};
}  // namespace

std::string_view to_string(cast_mode m) { return ::tilerope::detail::name_of(cast_mode_names, m); }

value cast(const value& x, dtype to, cast_mode mode) {
  const auto& xn = detail::input_node(x, "cast");
  if (!is_floating(to))
    throw error("op 'cast': target dtype " + std::string(to_string(to)) +
                " is not f32, f16 or bf16");
  auto n = detail::make_op(detail::op_kind::cast, "cast", to, xn->shape, xn->valid, {xn});
  n->mode = mode;
  return value(n);
}

}  // namespace tilerope::tile
