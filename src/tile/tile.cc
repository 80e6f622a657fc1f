// The tile-layer executor: lazy op graphs evaluated one tile at a time in a bounded UB.

#include "tilerope/tile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "tilerope/error.h"

namespace tilerope::tile {

namespace {

constexpr int max_tile_rank = 4;
constexpr std::size_t vector_alignment = 32;  // bytes: a tile row is a multiple of this

std::string str(const shape_t& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::int64_t numel(const shape_t& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

float round_to_type(dtype t, float v) {
  if (t == dtype::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  if (t == dtype::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  return v;
}

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

std::string_view to_string(cast_mode m) {
  switch (m) {
    case cast_mode::rint:
      return "rint";
    case cast_mode::round:
      return "round";
    case cast_mode::floor:
      return "floor";
    case cast_mode::ceil:
      return "ceil";
    case cast_mode::trunc:
      return "trunc";
  }
  return "?";
}

// ---- state ---------------------------------------------------------------------------------

struct tensor_state {
  std::string name;
  tensor_view memory;
  shape_t shape;
  enum class role { unregistered, input, output } role = role::unregistered;
  bool assembled = false;
};

enum class op_kind {
  leaf,
  slice,
  neg,
  add,
  sub,
  mul,
  div,
  add_scalar,
  mul_scalar,
  rsqrt,
  sum,
  cast,
  concat,
  gather,
  interleave,
  expand
};

struct node {
  op_kind kind = op_kind::leaf;
  std::string op;
  dtype type = dtype::f32;
  shape_t shape, valid, tile;
  std::vector<std::shared_ptr<node>> in;
  // leaf: the tensor, the address of element [0, ...] of this view, strides in elements
  std::shared_ptr<tensor_state> t;
  const unsigned char* base = nullptr;
  shape_t strides;
  shape_t offsets;  // slice: offsets into in[0]
  double scalar = 0;
  int dim = 0;
  bool keepdim = true;
  int parity = 0;
  cast_mode mode = cast_mode::rint;
};

namespace {

struct kernel_context {
  std::string name;
  bool dry = false;
  std::size_t ub_budget = 0, ub_live = 0, ub_peak = 0;
  std::optional<shape_t> tile;
  std::vector<std::string> unrolled_loops;  // enclosing loops with a factor > 1
  std::vector<float> arena;
  std::size_t arena_top = 0;
  kernel_report* report = nullptr;
};

thread_local kernel_context* current = nullptr;

kernel_context& ctx(const char* op) {
  if (current == nullptr) {
    throw error(std::string("tile op '") + op + "' called outside a kernel (use run_kernel)");
  }
  return *current;
}

// A tile buffer in the UB: accounted at the element size of its dtype, stored as fp32.

// Up to four dims without a heap allocation: regions are made for every tile of every op.
struct dims4 {
  std::int64_t v[max_tile_rank] = {};
  std::size_t n = 0;
  dims4() = default;
  dims4(std::size_t count, std::int64_t value) : n(count) {
    for (std::size_t i = 0; i < n; ++i) v[i] = value;
  }
  std::size_t size() const { return n; }
  std::int64_t& operator[](std::size_t i) { return v[i]; }
  std::int64_t operator[](std::size_t i) const { return v[i]; }
  std::int64_t& back() { return v[n - 1]; }
  std::int64_t back() const { return v[n - 1]; }
  void push_back(std::int64_t x) { v[n++] = x; }
  bool operator==(const dims4& o) const {
    if (n != o.n) return false;
    for (std::size_t i = 0; i < n; ++i)
      if (v[i] != o.v[i]) return false;
    return true;
  }
};

// A rectangular region of a node's output: offsets and extents per dim.
struct region {
  dims4 off, ext;
  std::int64_t size() const {
    std::int64_t s = 1;
    for (std::size_t i = 0; i < ext.size(); ++i) s *= ext[i];
    return s;
  }
};

class ub_buffer {
 public:
  // A tile of node n over region r (the error names the tile actually taken).
  ub_buffer(const node& n, const region& r) {
    kernel_context& c = *current;
    const std::int64_t elements = r.size();
    bytes_ = static_cast<std::size_t>(elements) * size_of(n.type);
    if (c.ub_live + bytes_ > c.ub_budget) {
      throw error("UB overflow in kernel '" + c.name + "': op '" + n.op + "' with tile " +
                  str(shape_t(r.ext.v, r.ext.v + r.ext.size())) + " needs " +
                  std::to_string(bytes_) + " bytes more with " + std::to_string(c.ub_live) +
                  " live; the UB holds " + std::to_string(c.ub_budget) + " bytes");
    }
    c.ub_live += bytes_;
    c.ub_peak = std::max(c.ub_peak, c.ub_live);
    start_ = c.arena_top;
    // Live bytes <= budget and every element takes >= 2 bytes: the arena (budget / 2 floats)
    // never runs out, and it never moves (callers hold pointers into it).
    c.arena_top += static_cast<std::size_t>(elements);
  }
  ~ub_buffer() {
    current->ub_live -= bytes_;
    current->arena_top = start_;
  }
  ub_buffer(const ub_buffer&) = delete;
  ub_buffer& operator=(const ub_buffer&) = delete;
  float* data() const { return current->arena.data() + start_; }

 private:
  std::size_t bytes_ = 0, start_ = 0;
};

void check_tile_for_op(const node& n) {
  kernel_context& c = *current;
  if (!c.tile) throw error("op '" + n.op + "': no tile shape set (call set_vec_tile_shapes first)");
  const shape_t& t = *c.tile;
  if (t.size() != n.shape.size()) {
    throw error("op '" + n.op + "': tile shape " + str(t) + " has rank " +
                std::to_string(t.size()) + " but the op's output " + str(n.shape) + " has rank " +
                std::to_string(n.shape.size()));
  }
  const std::size_t row_bytes = static_cast<std::size_t>(t.back()) * size_of(n.type);
  if (row_bytes % vector_alignment != 0) {
    throw error("op '" + n.op + "': tile shape " + str(t) + " last dim (" +
                std::to_string(t.back()) + ") * sizeof(" + std::string(to_string(n.type)) +
                ") = " + std::to_string(row_bytes) + " bytes is not a multiple of 32 bytes");
  }
}

void check_op_rank(const char* op, const shape_t& s) {
  if (s.empty() || s.size() > static_cast<std::size_t>(max_tile_rank)) {
    throw error(std::string("op '") + op + "': rank " + std::to_string(s.size()) + " " + str(s) +
                " is outside 1..4");
  }
}

std::shared_ptr<node> make_op(op_kind kind, const char* op, dtype type, shape_t shape,
                              shape_t valid, std::vector<std::shared_ptr<node>> in) {
  ctx(op);
  auto n = std::make_shared<node>();
  n->kind = kind;
  n->op = op;
  n->type = type;
  n->shape = std::move(shape);
  n->valid = std::move(valid);
  n->in = std::move(in);
  check_op_rank(op, n->shape);
  check_tile_for_op(*n);
  n->tile = *current->tile;
  return n;
}

const std::shared_ptr<node>& need(const value& v, const char* op) {
  if (!v.graph()) throw error(std::string("op '") + op + "': an input value is empty");
  return v.graph();
}

// ---- evaluation ----------------------------------------------------------------------------

void eval(const node& n, const region& r, float* out);

// Region of an input broadcast to the output region r: dims of size 1 stay [0, 1).
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

// Index into a buffer of region `s` (an input, broadcast) for each element of region r.
template <class Fn>
void for_each_broadcast(const region& r, const region& s, Fn fn) {
  const std::size_t rank = r.ext.size(), lead = rank - s.ext.size();
  dims4 stride(rank, 0);
  std::int64_t acc = 1;
  for (std::size_t i = s.ext.size(); i-- > 0;) {
    stride[i + lead] = s.ext[i] == 1 && r.ext[i + lead] != 1 ? 0 : acc;
    acc *= s.ext[i];
  }
  dims4 idx(rank, 0);
  const std::int64_t total = r.size();
  const std::int64_t inner = r.ext[rank - 1], inner_stride = stride[rank - 1];
  for (std::int64_t o = 0; o < total; o += inner) {
    std::int64_t base = 0;
    for (std::size_t i = 0; i + 1 < rank; ++i) base += idx[i] * stride[i];
    for (std::int64_t j = 0; j < inner; ++j) fn(o + j, base + j * inner_stride);
    for (std::size_t i = rank - 1; i-- > 0;) {
      if (++idx[i] < r.ext[i]) break;
      idx[i] = 0;
    }
  }
}

void round_buffer(dtype t, float* p, std::int64_t n) {
  if (t == dtype::f32) return;
  for (std::int64_t i = 0; i < n; ++i) p[i] = round_to_type(t, p[i]);
}

// Rows of a region: calls fn(row_offset_in_buffer, index of the row's first element).
template <class Fn>
void for_each_row(const region& r, Fn fn) {
  const std::size_t rank = r.ext.size();
  dims4 idx(rank, 0);
  const std::int64_t inner = r.ext[rank - 1];
  const std::int64_t total = r.size();
  for (std::int64_t o = 0; o < total; o += inner) {
    fn(o, idx);
    for (std::size_t i = rank - 1; i-- > 0;) {
      if (++idx[i] < r.ext[i]) break;
      idx[i] = 0;
    }
  }
}

void load_leaf(const node& n, const region& r, float* out) {
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
  if (!current->dry) std::fill(out, out + r.size(), 0.0f);
  if (inner.size() == 0) return;
  ub_buffer tmp(src, inner);
  eval(src, inner, tmp.data());
  if (current->dry) return;
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

void eval(const node& n, const region& r, float* out) {
  const bool dry = current->dry;
  const std::int64_t size = r.size();
  switch (n.kind) {
    case op_kind::leaf:
      if (!dry) load_leaf(n, r, out);
      return;
    case op_kind::slice:
      return eval_slice(n, r, out);
    case op_kind::neg:
    case op_kind::rsqrt:
    case op_kind::add_scalar:
    case op_kind::mul_scalar: {
      ub_buffer a(*n.in[0], r);
      eval(*n.in[0], r, a.data());
      if (dry) return;
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
      return round_buffer(n.type, out, size);
    }
    case op_kind::add:
    case op_kind::sub:
    case op_kind::mul:
    case op_kind::div: {
      const node& an = *n.in[0];
      const node& bn = *n.in[1];
      const region ra = broadcast_region(an, n, r), rb = broadcast_region(bn, n, r);
      ub_buffer a(an, ra);
      eval(an, ra, a.data());
      ub_buffer b(bn, rb);
      eval(bn, rb, b.data());
      if (dry) return;
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
      return round_buffer(n.type, out, size);
    }
    case op_kind::sum: {
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
      const std::int64_t chunk = n.keepdim ? std::min(n.tile[d], x.shape[d]) : x.shape[d];
      if (!dry) std::fill(out, out + size, 0.0f);
      for (std::int64_t start = 0; start < x.shape[d]; start += chunk) {
        region part = in_r;
        part.off[d] = start;
        part.ext[d] = std::min(chunk, x.shape[d] - start);
        ub_buffer buf(x, part);
        eval(x, part, buf.data());
        if (dry) continue;
        std::int64_t outer = 1, inner = 1;
        for (std::size_t i = 0; i < d; ++i) outer *= part.ext[i];
        for (std::size_t i = d + 1; i < part.ext.size(); ++i) inner *= part.ext[i];
        const std::int64_t len = part.ext[d];
        for (std::int64_t o = 0; o < outer; ++o)
          for (std::int64_t k = 0; k < len; ++k)
            for (std::int64_t i = 0; i < inner; ++i)
              out[o * inner + i] += buf.data()[(o * len + k) * inner + i];
      }
      if (!dry) round_buffer(n.type, out, size);
      return;
    }
    case op_kind::cast: {
      ub_buffer a(*n.in[0], r);
      eval(*n.in[0], r, a.data());
      if (dry) return;
      for (std::int64_t i = 0; i < size; ++i) out[i] = cast_value(a.data()[i], n.type, n.mode);
      return;
    }
    case op_kind::concat: {
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
          if (!dry) {
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
      return;
    }
    case op_kind::gather: {
      const node& x = *n.in[0];
      region xr = r;
      xr.off.back() = 2 * r.off.back();
      xr.ext.back() = std::min(2 * r.ext.back(), x.shape.back() - xr.off.back());
      ub_buffer buf(x, xr);
      eval(x, xr, buf.data());
      if (dry) return;
      const std::int64_t w = r.ext.back(), xw = xr.ext.back();
      for (std::int64_t row = 0; row < size / w; ++row)
        for (std::int64_t j = 0; j < w; ++j) {
          const std::int64_t k = 2 * j + n.parity;
          out[row * w + j] = k < xw ? buf.data()[row * xw + k] : 0.0f;
        }
      return;
    }
    case op_kind::interleave: {
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
      if (dry) return;
      const std::int64_t wa = ra.ext.back(), wb = rb.ext.back();
      for (std::int64_t row = 0; row < size / e; ++row)
        for (std::int64_t j = 0; j < e; ++j) {
          const std::int64_t g = o + j;
          out[row * e + j] = g % 2 == 0 ? a.data()[row * wa + g / 2 - ra.off.back()]
                                        : b.data()[row * wb + (g - 1) / 2 - rb.off.back()];
        }
      return;
    }
    case op_kind::expand: {
      const node& x = *n.in[0];
      const region xr = broadcast_region(x, n, r);
      ub_buffer buf(x, xr);
      eval(x, xr, buf.data());
      if (dry) return;
      for_each_broadcast(r, xr, [&](std::int64_t o, std::int64_t i) { out[o] = buf.data()[i]; });
      return;
    }
  }
}

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
  const auto& an = need(a, op);
  const auto& bn = need(b, op);
  if (an->type != bn->type) {
    throw error(std::string("op '") + op + "': dtypes differ (" + std::string(to_string(an->type)) +
                " and " + std::string(to_string(bn->type)) + "); cast one first");
  }
  shape_t shape = broadcast_shapes(op, an->shape, bn->shape);
  shape_t valid = broadcast_valid(*an, *bn, shape);
  return value(make_op(kind, op, an->type, std::move(shape), std::move(valid), {an, bn}));
}

value unary(op_kind kind, const char* op, const value& x, double scalar = 0) {
  const auto& xn = need(x, op);
  auto n = make_op(kind, op, xn->type, xn->shape, xn->valid, {xn});
  n->scalar = scalar;
  return value(n);
}

int normalize_dim(const char* op, int dim, std::size_t rank) {
  const int r = static_cast<int>(rank);
  const int d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r) {
    throw error(std::string("op '") + op + "': dim " + std::to_string(dim) + " is outside rank " +
                std::to_string(r));
  }
  return d;
}

}  // namespace

// ---- the API -------------------------------------------------------------------------------

tensor::tensor(std::string name, const tensor_view& memory)
    : state(std::make_shared<tensor_state>()) {
  if (memory.rank < 1 || memory.rank > max_tile_rank) {
    throw error("tile tensor '" + name + "' must have rank 1..4, got " + memory.shape_string());
  }
  if (!is_floating(memory.type)) {
    throw error("tile tensor '" + name + "' dtype (" + std::string(to_string(memory.type)) +
                ") must be f32, f16 or bf16");
  }
  if (memory.strides[memory.rank - 1] != 1 && memory.shape[memory.rank - 1] > 1) {
    throw error("tile tensor '" + name + "' last dim must be contiguous, strides " +
                memory.strides_string());
  }
  if (memory.data == nullptr && memory.numel() > 0)
    throw error("tile tensor '" + name + "' has null data");
  state->name = std::move(name);
  state->memory = memory;
  state->shape.assign(memory.shape.begin(), memory.shape.begin() + memory.rank);
}
const std::string& tensor::name() const { return state->name; }
const shape_t& tensor::shape() const { return state->shape; }
dtype tensor::type() const { return state->memory.type; }

const shape_t& value::shape() const { return node_->shape; }
const shape_t& value::valid_shape() const { return node_->valid; }
dtype value::type() const { return node_->type; }

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

value view(const tensor& t, const shape_t& shape, const shape_t& offsets,
           const std::optional<shape_t>& valid_shape) {
  kernel_context& c = ctx("view");
  if (!t.state) throw error("view: the tensor is empty");
  tensor_state& s = *t.state;
  if (s.role == tensor_state::role::unregistered) {
    throw error("view of '" + s.name + "': the tensor is not an input or output of kernel '" +
                c.name + "'");
  }
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
  ctx("view");
  const auto& src = need(v, "view");
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
  kernel_context& c = ctx("assemble");
  const auto& n = need(src, "assemble");
  if (!out.state) throw error("assemble: the output tensor is empty");
  tensor_state& s = *out.state;
  // Only outputs are assembled into, and outputs are never viewed (view rejects them): a
  // view/assemble cycle cannot form.
  if (s.role != tensor_state::role::output) {
    throw error("assemble into '" + s.name + "': it is not an output of kernel '" + c.name + "'");
  }
  if (n->type != s.memory.type) {
    throw error("assemble of a " + std::string(to_string(n->type)) + " value into " +
                std::string(to_string(s.memory.type)) + " tensor '" + s.name + "': cast it first");
  }
  check_window([&] { return "assemble into '" + s.name + "'"; }, s.shape, n->shape, offsets,
               n->valid);
  s.assembled = true;
  ++c.report->assembles;

  // Tiles over the valid region, of the tile shape the root op was created with.
  const std::size_t rank = n->shape.size();
  shape_t tile = n->tile;
  if (tile.size() != rank) tile = c.tile && c.tile->size() == rank ? *c.tile : n->shape;
  region r{dims4(rank, 0), dims4(rank, 0)};
  dims4 starts(rank, 0);
  const auto es = static_cast<std::int64_t>(size_of(s.memory.type));
  for (std::size_t i = 0; i < rank; ++i) {
    if (n->valid[i] == 0) return;
  }
  while (true) {
    for (std::size_t i = 0; i < rank; ++i) {
      r.off[i] = starts[i];
      r.ext[i] = std::min(tile[i], n->valid[i] - starts[i]);
    }
    {
      ub_buffer buf(*n, r);
      eval(*n, r, buf.data());
      ++c.report->tiles;
      // the checking pass walks every tile, moving no data
      if (!c.dry) {
        const std::int64_t inner = r.ext[rank - 1];
        for_each_row(r, [&](std::int64_t o, const dims4& idx) {
          std::int64_t at = 0;
          for (std::size_t i = 0; i < rank; ++i) {
            at += (offsets[i] + r.off[i] + (i + 1 < rank ? idx[i] : 0)) * s.memory.strides[i];
          }
          unsigned char* dst = static_cast<unsigned char*>(s.memory.data) + at * es;
          const float* from = buf.data() + o;
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
      }
    }
    std::size_t i = rank;
    while (i-- > 0) {
      starts[i] += tile[i];
      if (starts[i] < n->valid[i]) break;
      starts[i] = 0;
    }
    if (i == static_cast<std::size_t>(-1)) return;
  }
}

value neg(const value& x) { return unary(op_kind::neg, "neg", x); }
value rsqrt(const value& x) { return unary(op_kind::rsqrt, "rsqrt", x); }
value add(const value& a, double s) { return unary(op_kind::add_scalar, "add", a, s); }
value mul(const value& a, double s) { return unary(op_kind::mul_scalar, "mul", a, s); }
value add(const value& a, const value& b) { return binary(op_kind::add, "add", a, b); }
value sub(const value& a, const value& b) { return binary(op_kind::sub, "sub", a, b); }
value mul(const value& a, const value& b) { return binary(op_kind::mul, "mul", a, b); }
value div(const value& a, const value& b) { return binary(op_kind::div, "div", a, b); }

value sum(const value& x, int dim, bool keepdim) {
  const auto& xn = need(x, "sum");
  const int d = normalize_dim("sum", dim, xn->shape.size());
  shape_t shape, valid;
  for (std::size_t i = 0; i < xn->shape.size(); ++i) {
    if (static_cast<int>(i) == d) {
      if (keepdim) shape.push_back(1), valid.push_back(1);
    } else {
      shape.push_back(xn->shape[i]);
      valid.push_back(xn->valid[i]);
    }
  }
  auto n = make_op(op_kind::sum, "sum", xn->type, shape, valid, {xn});
  n->dim = d;
  n->keepdim = keepdim;
  return value(n);
}

value cast(const value& x, dtype to, cast_mode mode) {
  const auto& xn = need(x, "cast");
  if (!is_floating(to))
    throw error("op 'cast': target dtype " + std::string(to_string(to)) +
                " is not f32, f16 or bf16");
  auto n = make_op(op_kind::cast, "cast", to, xn->shape, xn->valid, {xn});
  n->mode = mode;
  return value(n);
}

value concat(const std::vector<value>& xs, int dim) {
  ctx("concat");
  if (xs.size() < 2 || xs.size() > 128) {
    throw error("op 'concat': " + std::to_string(xs.size()) + " inputs; concat takes 2..128");
  }
  const auto& first = need(xs[0], "concat");
  const int d = normalize_dim("concat", dim, first->shape.size());
  shape_t shape = first->shape, valid = first->valid;
  shape[d] = 0;
  valid[d] = 0;
  std::vector<std::shared_ptr<node>> in;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const auto& x = need(xs[k], "concat");
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
value gather(const value& x, int parity, const char* op) {
  const auto& xn = need(x, op);
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
  const auto& a = need(even, "interleave");
  const auto& b = need(odd, "interleave");
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
  const auto& xn = need(x, "expand_clone");
  const shape_t b = broadcast_shapes("expand_clone", xn->shape, shape);
  if (b != shape)
    throw error("op 'expand_clone': " + str(xn->shape) + " does not expand to " + str(shape));
  shape_t valid = shape;
  const std::size_t lead = shape.size() - xn->shape.size();
  for (std::size_t i = 0; i < xn->shape.size(); ++i) {
    if (xn->shape[i] != 1) valid[i + lead] = xn->valid[i];
  }
  return value(make_op(op_kind::expand, "expand_clone", xn->type, shape, valid, {xn}));
}

value reshape(const value& x, const shape_t& shape) {
  ctx("reshape");
  const auto& xn = need(x, "reshape");
  check_op_rank("reshape", shape);
  if (numel(shape) != numel(xn->shape)) {
    throw error("op 'reshape': " + str(xn->shape) + " has " + std::to_string(numel(xn->shape)) +
                " elements, " + str(shape) + " has " + std::to_string(numel(shape)));
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

void set_vec_tile_shapes(const shape_t& dims) {
  kernel_context& c = ctx("set_vec_tile_shapes");
  if (dims.empty() || dims.size() > static_cast<std::size_t>(max_tile_rank)) {
    throw error("set_vec_tile_shapes" + str(dims) + ": a tile has 1..4 dims, got " +
                std::to_string(dims.size()));
  }
  for (auto d : dims) {
    if (d <= 0) throw error("set_vec_tile_shapes" + str(dims) + ": every dim must be > 0");
  }
  c.tile = dims;
}

std::vector<loop_chunk> loop_chunks(std::int64_t start, std::int64_t stop, std::int64_t step,
                                    std::vector<std::int64_t> unroll_list) {
  if (step <= 0) throw error("loop: step (" + std::to_string(step) + ") must be > 0");
  for (auto f : unroll_list) {
    if (f < 1) throw error("loop: unroll factor (" + std::to_string(f) + ") must be >= 1");
  }
  unroll_list.push_back(1);
  std::sort(unroll_list.begin(), unroll_list.end(), std::greater<>());
  unroll_list.erase(std::unique(unroll_list.begin(), unroll_list.end()), unroll_list.end());
  std::vector<loop_chunk> chunks;
  std::int64_t nstart = start;
  // In iterations: trips = ceil((stop - nstart) / step), so that with step > 1 the last,
  // partial step still runs (for step 1 this is exactly left = (stop - nstart) % nstep).
  for (std::int64_t p : unroll_list) {
    if (nstart >= stop) break;
    const std::int64_t trips = (stop - nstart + step - 1) / step;
    const std::int64_t left = trips % p;
    const std::int64_t end = left == 0 ? stop : nstart + (trips - left) * step;
    if (end > nstart) chunks.push_back({nstart, end, p});
    nstart = end;
  }
  return chunks;
}

void loop(std::int64_t start, std::int64_t stop, std::int64_t step, std::string_view name,
          const std::vector<std::int64_t>& unroll_list,
          const std::function<void(std::int64_t)>& body) {
  kernel_context& c = ctx("loop");
  if (!c.unrolled_loops.empty()) {
    throw error("loop '" + std::string(name) + "' is nested in loop '" + c.unrolled_loops.back() +
                "', which is unrolled: only the innermost loop may be unrolled");
  }
  const auto chunks = loop_chunks(start, stop, step, unroll_list);
  const bool unrolled =
      std::any_of(unroll_list.begin(), unroll_list.end(), [](auto f) { return f > 1; });
  if (unrolled) c.unrolled_loops.emplace_back(name);
  struct pop {
    kernel_context& c;
    bool on;
    ~pop() {
      if (on) c.unrolled_loops.pop_back();
    }
  } guard{c, unrolled};
  for (const auto& ch : chunks) {
    c.report->chunks.push_back(ch);
    for (std::int64_t i = ch.begin; i < ch.end; i += step) body(i);
  }
}

kernel_report run_kernel(std::string_view name, const std::vector<tensor>& inputs,
                         const std::vector<tensor>& outputs, const std::function<void()>& body,
                         const kernel_options& options) {
  if (current != nullptr)
    throw error("run_kernel '" + std::string(name) + "': kernels do not nest");
  if (options.ub_bytes < vector_alignment) {
    throw error("kernel '" + std::string(name) + "': UB of " + std::to_string(options.ub_bytes) +
                " bytes is too small");
  }
  kernel_report report;
  kernel_context c;
  c.name = name;
  c.ub_budget = options.ub_bytes;
  c.arena.resize(options.ub_bytes / 2 + 64);
  for (const auto& t : inputs) {
    if (!t.state) throw error("kernel '" + std::string(name) + "': an input tensor is empty");
  }
  for (const auto& t : outputs) {
    if (!t.state) throw error("kernel '" + std::string(name) + "': an output tensor is empty");
  }
  struct scope {
    kernel_context* prev;
    const std::vector<tensor>& inputs;
    const std::vector<tensor>& outputs;
    ~scope() {
      current = prev;
      for (const auto* list : {&inputs, &outputs}) {
        for (const auto& t : *list) t.state->role = tensor_state::role::unregistered;
      }
    }
  } restore{current, inputs, outputs};
  current = &c;
  double seconds = 0;
  for (const bool dry : {true, false}) {
    for (const auto& t : inputs) t.state->role = tensor_state::role::input;
    for (const auto& t : outputs) t.state->role = tensor_state::role::output;
    for (const auto* list : {&inputs, &outputs}) {
      for (const auto& t : *list) t.state->assembled = false;
    }
    c.dry = dry;
    c.tile.reset();
    c.ub_live = 0;
    c.arena_top = 0;
    report = kernel_report{};
    c.report = &report;
    const auto t0 = std::chrono::steady_clock::now();
    body();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  report.name = name;
  report.peak_ub_bytes = c.ub_peak;
  report.ub_budget_bytes = c.ub_budget;
  report.seconds = seconds;
  return report;
}

}  // namespace tilerope::tile
