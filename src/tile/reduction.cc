// Reductions: sum and amax over one dim.
//
// PyPTO's rules: the dim is one of the input's (negative counts from the end); the output keeps
// it with size 1 (keepdim) or drops it, and keeps the input's valid shape in the other dims.
// With keepdim the tile has the reduced dim, and the input is read in chunks of the tile's
// extent along it, so that a UB buffer holds one tile of the input rather than the whole dim.
// Elements past the valid shape read as 0, which a sum may add; amax takes the valid ones only.

#include <algorithm>
#include <limits>
#include <string>

#include "tile/tile_internal.h"
#include "tilerope/tile.h"

namespace tilerope::tile {

namespace detail {

void eval_reduce(const node& n, const region& r, float* out) {
  const bool is_max = n.kind == op_kind::amax;
  const bool dry = current_kernel->dry;
  const std::int64_t size = r.size();
  const node& x = *n.in[0];
  const std::size_t d = static_cast<std::size_t>(n.dim);
  // the input region: r with the reduced dim (re)inserted, taken in chunks of the tile
  region in_r;
  for (std::size_t i = 0, j = 0; i < x.shape.size(); ++i) {
    if (i == d) {
      in_r.off.push_back(0);
      in_r.ext.push_back(x.shape[d]);
      if (n.keepdim) ++j;
    } else {
      in_r.off.push_back(r.off[j]);
      in_r.ext.push_back(r.ext[j]);
      ++j;
    }
  }
  const std::int64_t extent = is_max ? x.valid[d] : x.shape[d];
  const std::int64_t chunk = n.keepdim ? std::min(n.tile[d], extent) : extent;
  if (!dry) std::fill(out, out + size, is_max ? -std::numeric_limits<float>::infinity() : 0.0f);
  for (std::int64_t start = 0; start < extent; start += chunk) {
    region part = in_r;
    part.off[d] = start;
    part.ext[d] = std::min(chunk, extent - start);
    ub_buffer buf(x, part);
    eval(x, part, buf.data());
    if (dry) continue;
    std::int64_t outer = 1, inner = 1;
    for (std::size_t i = 0; i < d; ++i) outer *= part.ext[i];
    for (std::size_t i = d + 1; i < part.ext.size(); ++i) inner *= part.ext[i];
    const std::int64_t len = part.ext[d];
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t k = 0; k < len; ++k)
        for (std::int64_t i = 0; i < inner; ++i) {
          float& acc = out[o * inner + i];
          const float v = buf.data()[(o * len + k) * inner + i];
          acc = is_max ? (v > acc || v != v ? v : acc) : acc + v;
        }
  }
  if (!dry) round_buffer(n.type, out, size);
}

}  // namespace detail

namespace {

value reduce(detail::op_kind kind, const char* op, const value& x, int dim, bool keepdim) {
  const auto& xn = detail::input_node(x, op);
  const int d = detail::normalize_dim(op, dim, xn->shape.size());
  shape_t shape, valid;
  for (std::size_t i = 0; i < xn->shape.size(); ++i) {
    if (static_cast<int>(i) == d) {
      if (keepdim) shape.push_back(1), valid.push_back(1);
    } else {
      shape.push_back(xn->shape[i]);
      valid.push_back(xn->valid[i]);
    }
  }
  auto n = detail::make_op(kind, op, xn->type, shape, valid, {xn});
  n->dim = d;
  n->keepdim = keepdim;
  return value(n);
}

}  // namespace

value sum(const value& x, int dim, bool keepdim) {
  return reduce(detail::op_kind::sum, "sum", x, dim, keepdim);
}

value amax(const value& x, int dim, bool keepdim) {
  return reduce(detail::op_kind::amax, "amax", x, dim, keepdim);
}

}  // namespace tilerope::tile
