// Elementwise ops: neg, rsqrt, add, sub, mul, div, and add / sub / mul / div with a scalar.
//
// PyPTO's rules: shapes broadcast as NumPy's do (a dim of 1 stretches), 1..4 dims (make_op);
// add / sub / mul / div take one dtype for both inputs (the vector unit has no mixed-type
// arithmetic: cast first).
// A result is valid where both inputs are (the smaller valid shape), and on f16 / bf16 it is
// rounded to that dtype, as the hardware would.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tile/tile_internal.h"
#include "tilerope/error.h"
#include "tilerope/tile.h"

namespace tilerope::tile {

namespace detail {

shape_t broadcast_shapes(const char* op, const shape_t& a, const shape_t& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  shape_t out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t x = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    const std::int64_t y = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    if (x != y && x != 1 && y != 1) {
      throw error(std::string("op '") + op + "': shapes " + str(a) + " and " + str(b) +
                  " do not broadcast");
    }
    out[i] = std::max(x, y);
  }
  return out;
}

region broadcast_region(const node& in, const node& out, const region& r) {
  region s;
  const std::size_t lead = out.shape.size() - in.shape.size();
  for (std::size_t i = 0; i < in.shape.size(); ++i) {
    const bool stretched = in.shape[i] == 1 && out.shape[i + lead] != 1;
    s.off.push_back(stretched ? 0 : r.off[i + lead]);
    s.ext.push_back(stretched ? 1 : r.ext[i + lead]);
  }
  return s;
}

void eval_unary(const node& n, const region& r, float* out) {
  const std::int64_t size = r.size();
  ub_buffer a(*n.in[0], r);
  eval(*n.in[0], r, a.data());
  if (current_kernel->dry) return;
  const float* x = a.data();
  const auto s = static_cast<float>(n.scalar);
  if (n.kind == op_kind::neg)
    for (std::int64_t i = 0; i < size; ++i) out[i] = -x[i];
  if (n.kind == op_kind::rsqrt)
    for (std::int64_t i = 0; i < size; ++i) out[i] = 1.0f / std::sqrt(x[i]);
  if (n.kind == op_kind::add_scalar)
    for (std::int64_t i = 0; i < size; ++i) out[i] = x[i] + s;
  if (n.kind == op_kind::mul_scalar)
    for (std::int64_t i = 0; i < size; ++i) out[i] = x[i] * s;
  if (n.kind == op_kind::div_scalar)
    for (std::int64_t i = 0; i < size; ++i) out[i] = x[i] / s;
  if (n.kind == op_kind::rdiv_scalar)
    for (std::int64_t i = 0; i < size; ++i) out[i] = s / x[i];
  round_buffer(n.type, out, size);
}

void eval_binary(const node& n, const region& r, float* out) {
  const std::int64_t size = r.size();
  const node& an = *n.in[0];
  const node& bn = *n.in[1];
  const region ra = broadcast_region(an, n, r), rb = broadcast_region(bn, n, r);
  ub_buffer a(an, ra);
  eval(an, ra, a.data());
  ub_buffer b(bn, rb);
  eval(bn, rb, b.data());
  if (current_kernel->dry) return;
  const float* x = a.data();
  const float* y = b.data();
  const bool plain = ra.ext == r.ext && rb.ext == r.ext;
  auto apply = [&](auto f) {
    if (plain) {
      for (std::int64_t i = 0; i < size; ++i) out[i] = f(x[i], y[i]);
    } else {
      std::vector<std::int64_t> ia(static_cast<std::size_t>(size));
      for_each_broadcast(r, ra, [&](std::int64_t o, std::int64_t i) { ia[o] = i; });
      for_each_broadcast(r, rb,
                         [&](std::int64_t o, std::int64_t i) { out[o] = f(x[ia[o]], y[i]); });
    }
  };
  switch (n.kind) {
    case op_kind::add:
      apply([](float p, float q) { return p + q; });
      break;
    case op_kind::sub:
      apply([](float p, float q) { return p - q; });
      break;
    case op_kind::mul:
      apply([](float p, float q) { return p * q; });
      break;
    default:
      apply([](float p, float q) { return p / q; });
  }
  round_buffer(n.type, out, size);
}

}  // namespace detail

using detail::input_node;
using detail::make_op;
using detail::op_kind;

namespace {

// Valid where both inputs are; a stretched dim of 1 limits nothing.
shape_t broadcast_valid(const node& a, const node& b, const shape_t& shape) {
  shape_t v = shape;
  for (const node* n : {&a, &b}) {
    const std::size_t lead = shape.size() - n->shape.size();
    for (std::size_t i = 0; i < n->shape.size(); ++i) {
      if (n->shape[i] != 1) v[i + lead] = std::min(v[i + lead], n->valid[i]);
    }
  }
  return v;
}

value binary(op_kind kind, const char* op, const value& a, const value& b) {
  const auto& an = input_node(a, op);
  const auto& bn = input_node(b, op);
  if (an->type != bn->type) {
    throw error(std::string("op '") + op + "': dtypes differ (" + std::string(to_string(an->type)) +
                " and " + std::string(to_string(bn->type)) + "); cast one first");
  }
  shape_t shape = detail::broadcast_shapes(op, an->shape, bn->shape);
  shape_t valid = broadcast_valid(*an, *bn, shape);
  return value(make_op(kind, op, an->type, std::move(shape), std::move(valid), {an, bn}));
}

value unary(op_kind kind, const char* op, const value& x, double scalar = 0) {
  const auto& xn = input_node(x, op);
  auto n = make_op(kind, op, xn->type, xn->shape, xn->valid, {xn});
  n->scalar = scalar;
  return value(n);
}

}  // namespace

value neg(const value& x) { return unary(op_kind::neg, "neg", x); }
value rsqrt(const value& x) { return unary(op_kind::rsqrt, "rsqrt", x); }
value add(const value& a, double s) { return unary(op_kind::add_scalar, "add", a, s); }
value sub(const value& a, double s) { return unary(op_kind::add_scalar, "sub", a, -s); }
value mul(const value& a, double s) { return unary(op_kind::mul_scalar, "mul", a, s); }
value div(const value& a, double s) { return unary(op_kind::div_scalar, "div", a, s); }
value div(double s, const value& b) { return unary(op_kind::rdiv_scalar, "div", b, s); }
value add(const value& a, const value& b) { return binary(op_kind::add, "add", a, b); }
value sub(const value& a, const value& b) { return binary(op_kind::sub, "sub", a, b); }
value mul(const value& a, const value& b) { return binary(op_kind::mul, "mul", a, b); }
value div(const value& a, const value& b) { return binary(op_kind::div, "div", a, b); }

}  // namespace tilerope::tile
