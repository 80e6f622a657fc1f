// Layout ops: view, assemble, reshape (windows onto global memory), and concat, deinterleave /
// gathermask, interleave, expand_clone (elements moved, none computed).
//
// PyPTO's rules:
// - view / assemble: in bounds on the valid region (a tail view may reach past a tensor's end);
//   elements past valid_shape read as 0 and assemble writes only the valid region; same rank.
// - no view of a kernel output (reading it before it is written), and so no assemble into a
//   tensor the kernel views (a cycle); assemble takes the output's dtype (cast first).
// - concat: 2..128 inputs, same dtype and rank, other dims equal, the concat dim fully valid
//   (the hardware copies whole blocks: a partial concat dim would leave a hole).
// - deinterleave / gathermask (mode 1 even, 2 odd): an even last dim, which halves;
//   interleave, their inverse: even and odd of one shape and dtype.
// - expand_clone: x broadcasts (NumPy rules) to exactly the shape asked for.
// - reshape: same element count, over a fully valid view of row-major contiguous memory.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "tile/tile_internal.h"
#include "tilerope/error.h"
#include "tilerope/tile.h"

namespace tilerope::tile {

namespace detail {

void eval_tensor_view(const node& n, const region& r, float* out) {
  const std::size_t rank = r.ext.size();
  const std::int64_t inner = r.ext[rank - 1];
  const auto es = static_cast<std::int64_t>(size_of(n.type));
  for_each_row(r, [&](std::int64_t o, const dims4& idx) {
    bool row_valid = true;
    std::int64_t at = 0;
    for (std::size_t i = 0; i + 1 < rank; ++i) {
      const std::int64_t g = r.off[i] + idx[i];
      row_valid = row_valid && g < n.valid[i];
      at += g * n.strides[i];
    }
    const std::int64_t first = r.off[rank - 1];
    const std::int64_t count =
        row_valid ? std::clamp<std::int64_t>(n.valid[rank - 1] - first, 0, inner) : 0;
    const unsigned char* src = n.base + (at + first * n.strides[rank - 1]) * es;
    float* dst = out + o;
    switch (n.type) {
      case dtype::f32:
        std::memcpy(dst, src, static_cast<std::size_t>(count) * 4);
        break;
      case dtype::f16: {
        const auto* h = reinterpret_cast<const std::uint16_t*>(src);
        for (std::int64_t j = 0; j < count; ++j) dst[j] = f16_bits_to_f32(h[j]);
        break;
      }
      default: {
        const auto* b = reinterpret_cast<const std::uint16_t*>(src);
        for (std::int64_t j = 0; j < count; ++j) dst[j] = bf16_bits_to_f32(b[j]);
      }
    }
    std::fill(dst + count, dst + inner, 0.0f);
  });
}

// Elements of r past n's valid shape are zero; the rest come from in[0] at offsets.
void eval_slice(const node& n, const region& r, float* out) {
  const bool dry = current_kernel->dry;
  const node& src = *n.in[0];
  region inner = r;
  bool full = true;
  for (std::size_t i = 0; i < r.ext.size(); ++i) {
    const std::int64_t valid_ext = std::clamp<std::int64_t>(n.valid[i] - r.off[i], 0, r.ext[i]);
    full = full && valid_ext == r.ext[i];
    inner.ext[i] = valid_ext;
    inner.off[i] = r.off[i] + n.offsets[i];
  }
  if (full) return eval(src, inner, out);
  if (!dry) std::fill(out, out + r.size(), 0.0f);
  if (inner.size() == 0) return;
  ub_buffer tmp(src, inner);
  eval(src, inner, tmp.data());
  if (dry) return;
  const std::int64_t w = inner.ext.back();
  for_each_row(inner, [&](std::int64_t o, const dims4& idx) {
    std::int64_t at = 0, mul = 1;
    for (std::size_t i = r.ext.size(); i-- > 0;) {
      at += (i + 1 == r.ext.size() ? 0 : idx[i]) * mul;
      mul *= r.ext[i];
    }
    std::memcpy(out + at, tmp.data() + o, static_cast<std::size_t>(w) * 4);
  });
}

void eval_concat(const node& n, const region& r, float* out) {
  const std::size_t d = static_cast<std::size_t>(n.dim);
  std::int64_t start = 0;
  for (const auto& part : n.in) {
    const std::int64_t len = part->shape[d];
    const std::int64_t lo = std::max(start, r.off[d]),
                       hi = std::min(start + len, r.off[d] + r.ext[d]);
    if (lo < hi) {
      region pr = r;
      pr.off[d] = lo - start;
      pr.ext[d] = hi - lo;
      ub_buffer buf(*part, pr);
      eval(*part, pr, buf.data());
      if (!current_kernel->dry) {
        std::int64_t outer = 1, inner = 1;
        for (std::size_t i = 0; i < d; ++i) outer *= r.ext[i];
        for (std::size_t i = d + 1; i < r.ext.size(); ++i) inner *= r.ext[i];
        for (std::int64_t o = 0; o < outer; ++o) {
          std::memcpy(out + (o * r.ext[d] + (lo - r.off[d])) * inner,
                      buf.data() + o * pr.ext[d] * inner,
                      static_cast<std::size_t>(pr.ext[d] * inner) * 4);
        }
      }
    }
    start += len;
  }
}

void eval_gather(const node& n, const region& r, float* out) {
  const std::int64_t size = r.size();
  const node& x = *n.in[0];
  region xr = r;
  xr.off.back() = 2 * r.off.back();
  xr.ext.back() = std::min(2 * r.ext.back(), x.shape.back() - xr.off.back());
  ub_buffer buf(x, xr);
  eval(x, xr, buf.data());
  if (current_kernel->dry) return;
  const std::int64_t w = r.ext.back(), xw = xr.ext.back();
  for (std::int64_t row = 0; row < size / w; ++row)
    for (std::int64_t j = 0; j < w; ++j) {
      const std::int64_t k = 2 * j + n.parity;
      out[row * w + j] = k < xw ? buf.data()[row * xw + k] : 0.0f;
    }
}

void eval_interleave(const node& n, const region& r, float* out) {
  const std::int64_t size = r.size();
  const std::int64_t o = r.off.back(), e = r.ext.back();
  region ra = r, rb = r;
  ra.off.back() = (o + 1) / 2;
  ra.ext.back() = (o + e + 1) / 2 - ra.off.back();
  rb.off.back() = o / 2;
  rb.ext.back() = (o + e) / 2 - rb.off.back();
  ub_buffer a(*n.in[0], ra);
  if (ra.size()) eval(*n.in[0], ra, a.data());
  ub_buffer b(*n.in[1], rb);
  if (rb.size()) eval(*n.in[1], rb, b.data());
  if (current_kernel->dry) return;
  const std::int64_t wa = ra.ext.back(), wb = rb.ext.back();
  for (std::int64_t row = 0; row < size / e; ++row)
    for (std::int64_t j = 0; j < e; ++j) {
      const std::int64_t g = o + j;
      out[row * e + j] = g % 2 == 0 ? a.data()[row * wa + g / 2 - ra.off.back()]
                                    : b.data()[row * wb + (g - 1) / 2 - rb.off.back()];
    }
}

void eval_expand(const node& n, const region& r, float* out) {
  const node& x = *n.in[0];
  const region xr = broadcast_region(x, n, r);
  ub_buffer buf(x, xr);
  eval(x, xr, buf.data());
  if (current_kernel->dry) return;
  for_each_broadcast(r, xr, [&](std::int64_t o, std::int64_t i) { out[o] = buf.data()[i]; });
}

}  // namespace detail

using detail::dims4;
using detail::input_node;
using detail::kernel_context;
using detail::make_op;
using detail::op_kind;
using detail::region;
using detail::require_kernel;
using detail::str;

namespace {

// `what` is called only to word an error: this runs for every view of every iteration.
template <class What>
void check_window(const What& what, const shape_t& source, const shape_t& shape,
                  const shape_t& offsets, const shape_t& valid) {
  const auto desc = [&] {
    return what() + " with shape " + str(shape) + " at offsets " + str(offsets) + " (valid " +
           str(valid) + ") of " + str(source);
  };
  if (shape.size() != source.size() || offsets.size() != source.size() ||
      valid.size() != source.size()) {
    throw error(desc() + ": ranks differ");
  }
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) throw error(desc() + ": dims must be > 0");
    if (valid[i] < 0 || valid[i] > shape[i])
      throw error(desc() + ": valid_shape must lie in [0, shape]");
    if (offsets[i] < 0 || offsets[i] + valid[i] > source[i])
      throw error(desc() + " is out of bounds");
  }
}

}  // namespace

// ---- windows onto global memory ------------------------------------------------------------

value view(const tensor& t, const shape_t& shape, const shape_t& offsets,
           const std::optional<shape_t>& valid_shape) {
  kernel_context& c = require_kernel("view");
  if (!t.state) throw error("view: the tensor is empty");
  tensor_state& s = *t.state;
  if (s.role == tensor_state::role::unregistered) {
    throw error("view of '" + s.name + "': the tensor is not an input or output of kernel '" +
                c.name + "'");
  }
  if (s.role == tensor_state::role::param) s.role = tensor_state::role::input;
  if (s.role == tensor_state::role::output) {
    throw error(s.assembled ? "view of output '" + s.name +
                                  "' after assembling into it: viewing and "
                                  "assembling one tensor in a kernel is a cycle"
                            : "view of output '" + s.name +
                                  "': reading a kernel output before it is written");
  }
  const shape_t valid = valid_shape.value_or(shape);
  check_window([&] { return "view of '" + s.name + "'"; }, s.shape, shape, offsets, valid);
  auto n = std::make_shared<node>();
  n->kind = op_kind::leaf;
  n->op = "view";
  n->type = s.memory.type;
  n->shape = shape;
  n->valid = valid;
  n->t = t.state;
  n->strides.assign(s.memory.strides.begin(), s.memory.strides.begin() + s.memory.rank);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < offsets.size(); ++i) at += offsets[i] * n->strides[i];
  n->base = static_cast<const unsigned char*>(s.memory.data) +
            at * static_cast<std::int64_t>(size_of(n->type));
  return value(n);
}

value view(const value& v, const shape_t& shape, const shape_t& offsets,
           const std::optional<shape_t>& valid_shape) {
  require_kernel("view");
  const auto& src = input_node(v, "view");
  const shape_t requested = valid_shape.value_or(shape);
  // A window past the source's valid region reads zeros: clip valid to it.
  shape_t valid = requested;
  for (std::size_t i = 0; i < valid.size() && i < src->valid.size() && i < offsets.size(); ++i) {
    valid[i] = std::min(valid[i], std::max<std::int64_t>(0, src->valid[i] - offsets[i]));
  }
  check_window([&] { return "view of a " + str(src->shape) + " value"; }, src->shape, shape,
               offsets, requested);
  auto n = std::make_shared<node>();
  n->type = src->type;
  n->shape = shape;
  n->valid = valid;
  if (src->kind == op_kind::leaf) {  // a view of a view: fold into one window of the tensor
    *n = *src;
    n->shape = shape;
    n->valid = valid;
    std::int64_t at = 0;
    for (std::size_t i = 0; i < offsets.size(); ++i) at += offsets[i] * n->strides[i];
    n->base = src->base + at * static_cast<std::int64_t>(size_of(n->type));
    return value(n);
  }
  n->kind = op_kind::slice;
  n->op = "view";
  n->offsets = offsets;
  n->in = {src};
  return value(n);
}

void assemble(const value& src, const shape_t& offsets, tensor& out) {
  kernel_context& c = require_kernel("assemble");
  const auto& n = input_node(src, "assemble");
  if (!out.state) throw error("assemble: the output tensor is empty");
  tensor_state& s = *out.state;
  // Only outputs are assembled into, and outputs are never viewed (view rejects them): a
  // view/assemble cycle cannot form.
  if (s.role == tensor_state::role::param) s.role = tensor_state::role::output;
  if (s.role != tensor_state::role::output) {
    throw error(s.by_use && s.role == tensor_state::role::input
                    ? "assemble into '" + s.name +
                          "' after viewing it: viewing and assembling one tensor in a kernel "
                          "is a cycle"
                    : "assemble into '" + s.name + "': it is not an output of kernel '" + c.name +
                          "'");
  }
  if (n->type != s.memory.type) {
    throw error("assemble of a " + std::string(to_string(n->type)) + " value into " +
                std::string(to_string(s.memory.type)) + " tensor '" + s.name + "': cast it first");
  }
  check_window([&] { return "assemble into '" + s.name + "'"; }, s.shape, n->shape, offsets,
               n->valid);
  s.assembled = true;
  ++c.report->assembles;

  const std::size_t rank = n->shape.size();
  const auto es = static_cast<std::int64_t>(size_of(s.memory.type));
  detail::eval_tiles(*n, [&](const region& r, const float* tile) {
    const std::int64_t inner = r.ext[rank - 1];
    detail::for_each_row(r, [&](std::int64_t o, const dims4& idx) {
      std::int64_t at = 0;
      for (std::size_t i = 0; i < rank; ++i) {
        at += (offsets[i] + r.off[i] + (i + 1 < rank ? idx[i] : 0)) * s.memory.strides[i];
      }
      unsigned char* dst = static_cast<unsigned char*>(s.memory.data) + at * es;
      const float* from = tile + o;
      switch (s.memory.type) {
        case dtype::f32:
          std::memcpy(dst, from, static_cast<std::size_t>(inner) * 4);
          break;
        case dtype::f16: {
          auto* h = reinterpret_cast<std::uint16_t*>(dst);
          for (std::int64_t j = 0; j < inner; ++j) h[j] = f32_to_f16_bits(from[j]);
          break;
        }
        default: {
          auto* b = reinterpret_cast<std::uint16_t*>(dst);
          for (std::int64_t j = 0; j < inner; ++j) b[j] = f32_to_bf16_bits(from[j]);
        }
      }
    });
  });
}

value reshape(const value& x, const shape_t& shape) {
  require_kernel("reshape");
  const auto& xn = input_node(x, "reshape");
  detail::check_op_rank("reshape", shape);
  if (detail::numel(shape) != detail::numel(xn->shape)) {
    throw error("op 'reshape': " + str(xn->shape) + " has " +
                std::to_string(detail::numel(xn->shape)) + " elements, " + str(shape) + " has " +
                std::to_string(detail::numel(shape)));
  }
  bool contiguous = xn->kind == op_kind::leaf && xn->valid == xn->shape;
  std::int64_t expect = 1;
  for (std::size_t i = xn->shape.size(); contiguous && i-- > 0;) {
    if (xn->shape[i] > 1 && xn->strides[i] != expect) contiguous = false;
    expect *= xn->shape[i];
  }
  if (!contiguous) {
    throw error("op 'reshape': " + str(xn->shape) +
                " must be a fully valid view of contiguous memory");
  }
  auto n = std::make_shared<node>(*xn);
  n->shape = shape;
  n->valid = shape;
  n->strides.assign(shape.size(), 1);
  for (std::size_t i = shape.size() - 1; i-- > 0;) n->strides[i] = n->strides[i + 1] * shape[i + 1];
  return value(n);
}

// ---- moving elements between tiles ---------------------------------------------------------

value concat(const std::vector<value>& xs, int dim) {
  require_kernel("concat");
  if (xs.size() < 2 || xs.size() > 128) {
    throw error("op 'concat': " + std::to_string(xs.size()) + " inputs; concat takes 2..128");
  }
  const auto& first = input_node(xs[0], "concat");
  const int d = detail::normalize_dim("concat", dim, first->shape.size());
  shape_t shape = first->shape, valid = first->valid;
  shape[d] = 0;
  valid[d] = 0;
  std::vector<std::shared_ptr<node>> in;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const auto& x = input_node(xs[k], "concat");
    if (x->type != first->type) {
      throw error("op 'concat': input " + std::to_string(k) + " is " +
                  std::string(to_string(x->type)) + ", input 0 is " +
                  std::string(to_string(first->type)));
    }
    if (x->shape.size() != first->shape.size()) {
      throw error("op 'concat': input " + std::to_string(k) + " " + str(x->shape) +
                  " and input 0 " + str(first->shape) + " differ in rank");
    }
    for (std::size_t i = 0; i < x->shape.size(); ++i) {
      if (static_cast<int>(i) != d && x->shape[i] != first->shape[i]) {
        throw error("op 'concat': input " + std::to_string(k) + " " + str(x->shape) +
                    " and input 0 " + str(first->shape) + " differ in dim " + std::to_string(i) +
                    " (not the concat dim " + std::to_string(d) + ")");
      }
      if (static_cast<int>(i) != d) valid[i] = std::min(valid[i], x->valid[i]);
    }
    if (x->valid[d] != x->shape[d]) {
      throw error("op 'concat': input " + std::to_string(k) + " is valid for " +
                  std::to_string(x->valid[d]) + " of " + std::to_string(x->shape[d]) +
                  " along the concat dim " + std::to_string(d) + "; it must be fully valid");
    }
    shape[d] += x->shape[d];
    valid[d] += x->shape[d];
    in.push_back(x);
  }
  auto n = make_op(op_kind::concat, "concat", first->type, shape, valid, in);
  n->dim = d;
  return value(n);
}

namespace {

// The even (parity 0) or odd (parity 1) elements of x's last dim.
value gather(const value& x, int parity, const char* op) {
  const auto& xn = input_node(x, op);
  if (xn->shape.back() % 2 != 0) {
    throw error(std::string("op '") + op + "': last dim " + std::to_string(xn->shape.back()) +
                " must be even");
  }
  shape_t shape = xn->shape, valid = xn->valid;
  shape.back() /= 2;
  valid.back() = (valid.back() + (parity == 0 ? 1 : 0)) / 2;
  auto n = make_op(op_kind::gather, op, xn->type, shape, valid, {xn});
  n->parity = parity;
  return value(n);
}

}  // namespace

std::pair<value, value> deinterleave(const value& x) {
  return {gather(x, 0, "deinterleave"), gather(x, 1, "deinterleave")};
}

value interleave(const value& even, const value& odd) {
  const auto& a = input_node(even, "interleave");
  const auto& b = input_node(odd, "interleave");
  if (a->shape != b->shape || a->type != b->type) {
    throw error("op 'interleave': inputs " + str(a->shape) + " " + std::string(to_string(a->type)) +
                " and " + str(b->shape) + " " + std::string(to_string(b->type)) +
                " must match in shape and dtype");
  }
  shape_t shape = a->shape, valid = a->valid;
  shape.back() *= 2;
  for (std::size_t i = 0; i < valid.size(); ++i) valid[i] = std::min(valid[i], b->valid[i]);
  valid.back() *= 2;
  return value(make_op(op_kind::interleave, "interleave", a->type, shape, valid, {a, b}));
}

value gathermask(const value& x, int mode) {
  if (mode != 1 && mode != 2)
    throw error("op 'gathermask': mode " + std::to_string(mode) + " is not 1 (even) or 2 (odd)");
  return gather(x, mode - 1, "gathermask");
}

value expand_clone(const value& x, const shape_t& shape) {
  const auto& xn = input_node(x, "expand_clone");
  const shape_t b = detail::broadcast_shapes("expand_clone", xn->shape, shape);
  if (b != shape)
    throw error("op 'expand_clone': " + str(xn->shape) + " does not expand to " + str(shape));
  shape_t valid = shape;
  const std::size_t lead = shape.size() - xn->shape.size();
  for (std::size_t i = 0; i < xn->shape.size(); ++i) {
    if (xn->shape[i] != 1) valid[i + lead] = xn->valid[i];
  }
  return value(make_op(op_kind::expand, "expand_clone", xn->type, shape, valid, {xn}));
}

}  // namespace tilerope::tile
