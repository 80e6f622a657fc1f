#pragma once
// What the tile layer's files share: the op graph (node), the kernel being run, the UB
// buffers tiles live in, regions of an op's output, and each op family's tile evaluation.
//
// A value is a graph of nodes. eval(n, r, out) computes region r of node n into the UB buffer
// `out` (fp32, row-major over r's extents), asking its inputs for the regions it needs in
// buffers of their own. In the checking pass (`dry`) the same calls run and take the same UB,
// but no element is computed or moved.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tilerope/dtype.h"
#include "tilerope/error.h"
#include "tilerope/tensor.h"
#include "tilerope/tile.h"

namespace tilerope::tile {

namespace detail {

constexpr int max_tile_rank = 4;
constexpr std::size_t vector_alignment = 32;  // bytes: a tile row is a multiple of this

enum class op_kind {
  leaf,   // a view of a tensor: reads global memory
  slice,  // a view of a value
  neg,
  add,
  sub,
  mul,
  div,
  add_scalar,
  mul_scalar,
  div_scalar,   // x / s
  rdiv_scalar,  // s / x
  rsqrt,
  sum,
  amax,
  cast,
  concat,
  gather,
  interleave,
  expand
};

}  // namespace detail

struct tensor_state {
  std::string name;
  tensor_view memory;
  shape_t shape;
  // param: a parameter of a kernel whose roles come from use (an input once viewed, an output
  // once assembled into)
  enum class role { unregistered, param, input, output } role = role::unregistered;
  bool assembled = false;
  bool by_use = false;  // its role came from use
};

struct node {
  detail::op_kind kind = detail::op_kind::leaf;
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

namespace detail {

std::string str(const shape_t& s);
std::int64_t numel(const shape_t& s);

inline float round_to_type(dtype t, float v) {
  if (t == dtype::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  if (t == dtype::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  return v;
}

inline void round_buffer(dtype t, float* p, std::int64_t n) {
  if (t == dtype::f32) return;
  for (std::int64_t i = 0; i < n; ++i) p[i] = round_to_type(t, p[i]);
}

// ---- the kernel being run ------------------------------------------------------------------

struct kernel_context {
  std::string name;
  bool dry = false;  // the checking pass: every rule and every UB buffer, no data moved
  std::size_t ub_budget = 0, ub_live = 0, ub_peak = 0;
  std::optional<shape_t> tile;
  std::vector<std::string> unrolled_loops;  // enclosing loops with a factor > 1
  std::uint64_t serial = 0;                 // unique per pass of run_kernel
  std::vector<float> arena;
  std::size_t arena_top = 0;
  kernel_report* report = nullptr;
};

// Set by run_kernel for the duration of the body; constinit, so that no TLS wrapper call is
// paid on each access from the other files.
extern thread_local constinit kernel_context* current_kernel;

// The running kernel; outside one, an error naming `op`.
kernel_context& require_kernel(const char* op);

// ---- regions and UB buffers ----------------------------------------------------------------

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

// A tile buffer in the UB: accounted at the element size of its dtype, stored as fp32. Buffers
// are freed in reverse order of their making (they are scoped), so the arena is a stack.
class ub_buffer {
 public:
  // A tile of node n over region r (the error names the tile actually taken).
  ub_buffer(const node& n, const region& r) {
    kernel_context& c = *current_kernel;
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
    current_kernel->ub_live -= bytes_;
    current_kernel->arena_top = start_;
  }
  ub_buffer(const ub_buffer&) = delete;
  ub_buffer& operator=(const ub_buffer&) = delete;
  float* data() const { return current_kernel->arena.data() + start_; }

 private:
  std::size_t bytes_ = 0, start_ = 0;
};

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

// ---- broadcasting (elementwise ops and expand_clone) ---------------------------------------

// The NumPy broadcast of shapes a and b; an error naming `op` if they do not broadcast.
shape_t broadcast_shapes(const char* op, const shape_t& a, const shape_t& b);

// Region of an input broadcast to the output region r: dims of size 1 stay [0, 1).
region broadcast_region(const node& in, const node& out, const region& r);

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

// ---- building ops (executor.cc) ------------------------------------------------------------

// The node behind an op's input; an error naming `op` if the value is empty.
const std::shared_ptr<node>& input_node(const value& v, const char* op);

// An op node with the tile shape in force; checks its rank and that tile shape.
std::shared_ptr<node> make_op(op_kind kind, const char* op, dtype type, shape_t shape,
                              shape_t valid, std::vector<std::shared_ptr<node>> in);

// An op's output rank must be 1..4, the vector unit's most.
void check_op_rank(const char* op, const shape_t& s);

// dim (negative counts from the end) as an index into a shape of `rank` dims.
int normalize_dim(const char* op, int dim, std::size_t rank);

// ---- evaluating ops --------------------------------------------------------------------------

// Region r of node n into out, by n's kind (executor.cc).
void eval(const node& n, const region& r, float* out);

// The tiles of n's valid region, each evaluated into a UB buffer and handed to store (in the
// executing pass only) with its region (executor.cc).
void eval_tiles(const node& n, const std::function<void(const region&, const float*)>& store);

// elementwise.cc
void eval_unary(const node& n, const region& r, float* out);
void eval_binary(const node& n, const region& r, float* out);
// reduction.cc
void eval_reduce(const node& n, const region& r, float* out);
// cast.cc
void eval_cast(const node& n, const region& r, float* out);
// layout.cc
void eval_tensor_view(const node& n, const region& r, float* out);
void eval_slice(const node& n, const region& r, float* out);
void eval_concat(const node& n, const region& r, float* out);
void eval_gather(const node& n, const region& r, float* out);
void eval_interleave(const node& n, const region& r, float* out);
void eval_expand(const node& n, const region& r, float* out);

}  // namespace detail

}  // namespace tilerope::tile
