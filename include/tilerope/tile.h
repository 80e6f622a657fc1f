#pragma once
/// \file tile.h
/// A tile-programming layer after PyPTO's vector API, executed on the CPU tile by tile.
///
/// A kernel body views global tensors, composes tile ops into values, and writes results
/// with assemble. Values are lazy: assemble evaluates its source one tile at a time (the tile
/// shape is the one set by set_vec_tile_shapes when the op was created) in an on-chip
/// unified buffer (UB) of fixed capacity, so no whole-view intermediate exists beyond what a
/// tile holds. The skeleton of the article reads, in C++:
///
///     loop(0, batch, 1, "batch", {1}, [&](std::int64_t i) {
///       value a_s = view(a, {1, S, D}, {i, 0, 0});                      // (1, S, D)
///       value cos_s = view(cos, {1, S, D}, {i, 0, 0});                  // (1, S, D)
///       value sin_s = view(sin, {1, S, D}, {i, 0, 0});                  // (1, S, D)
///       set_vec_tile_shapes({1, S, D});
///       value neg_a2 = neg(view(a_s, {1, S, half}, {0, 0, half}));      // (1, S, D/2)
///       value a1 = view(a_s, {1, S, half}, {0, 0, 0});                  // (1, S, D/2)
///       value rot = concat({neg_a2, a1}, -1);                           // (1, S, D)
///       value r = add(mul(a_s, cos_s), mul(rot, sin_s));                // (1, S, D)
///       assemble(r, {i, 0, 0}, out);
///     });
///
/// Rules, each a tilerope::error naming the op and the values (docs/tile-layer.md says why):
/// tile rank <= 4, dims > 0, rank equal to the op's output rank, last dim * sizeof(dtype) a
/// multiple of 32 bytes; the UB budget; concat of 2..128 inputs of one dtype and rank with
/// equal other dims and a fully valid concat dim; views and assembles in bounds; no assemble
/// into a tensor the kernel views (a cycle); one dtype in add/sub/mul/div; no reading of a
/// kernel output. A kernel body runs twice: a checking pass that moves no data (every rule,
/// and the UB need of each assemble's largest tile), then the executing pass, so an invalid
/// program writes nothing.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tilerope/dtype.h"
#include "tilerope/tensor.h"

namespace tilerope::tile {

using shape_t = std::vector<std::int64_t>;

struct tensor_state;
struct node;

/// A tensor in global memory (a user buffer, f32 / f16 / bf16, rank 1..4), registered with a
/// kernel as an input or an output.
class tensor {
 public:
  tensor() = default;
  tensor(std::string name, const tensor_view& memory);
  const std::string& name() const;
  const shape_t& shape() const;
  dtype type() const;
  std::shared_ptr<tensor_state> state;
};

/// A tile-program value: a view or the result of ops. It holds no data.
class value {
 public:
  value() = default;
  explicit value(std::shared_ptr<node> n) : node_(std::move(n)) {}
  const shape_t& shape() const;
  const shape_t& valid_shape() const;
  dtype type() const;
  const std::shared_ptr<node>& graph() const { return node_; }

 private:
  std::shared_ptr<node> node_;
};

/// A window of t (or of a value): `shape` static, elements past `valid_shape` (default
/// shape) read as 0. offsets + valid_shape must lie inside the source.
value view(const tensor& t, const shape_t& shape, const shape_t& offsets,
           const std::optional<shape_t>& valid_shape = std::nullopt);
value view(const value& v, const shape_t& shape, const shape_t& offsets,
           const std::optional<shape_t>& valid_shape = std::nullopt);

/// Writes the valid region of src into out at offsets (same rank; the valid region must lie
/// inside out). out must be a kernel output that the kernel does not view.
void assemble(const value& src, const shape_t& offsets, tensor& out);

/// Elementwise, broadcasting as NumPy does (a dim of 1 stretches); one dtype for both inputs.
/// On f16 / bf16 values each op rounds its result to that dtype, as the hardware would.
value neg(const value& x);
value add(const value& a, const value& b);
value sub(const value& a, const value& b);
value mul(const value& a, const value& b);
value div(const value& a, const value& b);
value add(const value& a, double s);  ///< a + s
value sub(const value& a, double s);  ///< a - s
value mul(const value& a, double s);  ///< a * s
value div(const value& a, double s);  ///< a / s
value div(double s, const value& b);  ///< s / b
value rsqrt(const value& x);          ///< 1 / sqrt(x)
/// Sum over `dim` (negative counts from the end); keepdim leaves it with size 1.
value sum(const value& x, int dim, bool keepdim = true);
/// Largest element over `dim`, of the valid ones along it; keepdim as sum.
value amax(const value& x, int dim, bool keepdim = true);

/// Rounding of cast: rint = to nearest, ties to even (the default, as PyTorch's .to()).
enum class cast_mode { rint, round, floor, ceil, trunc };
std::string_view to_string(cast_mode m);
value cast(const value& x, dtype to, cast_mode mode = cast_mode::rint);

/// Joins 2..128 values of one dtype and rank along dim; other dims equal; each input fully
/// valid along dim.
value concat(const std::vector<value>& xs, int dim);
/// out0[..., k] = x[..., 2k], out1[..., k] = x[..., 2k+1]: the last dim halves.
std::pair<value, value> deinterleave(const value& x);
/// The inverse of deinterleave: out[..., 2k] = even[..., k], out[..., 2k+1] = odd[..., k].
/// (tilerope's addition to PyPTO's list: it writes the GPT-J interleaved layout without a
/// strided assemble.)
value interleave(const value& even, const value& odd);
/// mode 1: the even elements of the last dim, mode 2: the odd ones (as deinterleave).
value gathermask(const value& x, int mode);
/// Materialises the broadcast of x to `shape`.
value expand_clone(const value& x, const shape_t& shape);
/// Same elements in a new shape; x must be a fully valid view of row-major contiguous memory.
value reshape(const value& x, const shape_t& shape);

/// Sets the tile shape of the ops created after it (kernel state, as in PyPTO).
void set_vec_tile_shapes(const shape_t& dims);

/// One unrolled stretch of a loop: indices [begin, end) in chunks of `factor` iterations.
struct loop_chunk {
  std::int64_t begin, end, factor;
};
/// The stretches of loop(start, stop, step, unroll_list): factors sorted descending,
/// de-duplicated, 1 added; for each factor p: nstep = step * p,
/// left = (stop - nstart) % nstep, run [nstart, stop - left) by nstep, nstart = stop - left.
/// (Counted in iterations, so that with step > 1 a last partial step is kept.)
std::vector<loop_chunk> loop_chunks(std::int64_t start, std::int64_t stop, std::int64_t step,
                                    std::vector<std::int64_t> unroll_list);
/// Runs body(i) for i = start, start + step, ... < stop (step-1 semantics within chunks).
/// Only the innermost loop may be unrolled (a factor > 1 in unroll_list). Like the whole
/// kernel body, it runs once in the checking pass and once in the executing pass.
void loop(std::int64_t start, std::int64_t stop, std::int64_t step, std::string_view name,
          const std::vector<std::int64_t>& unroll_list,
          const std::function<void(std::int64_t)>& body);

/// A loop entered by a front end that iterates itself (Python's `for i in pypto.loop(...)`):
/// made on entry (the unroll rule is checked, the stretches recorded in the report), ended by
/// close() or the destructor. Closing it after its kernel has ended does nothing.
class loop_scope {
 public:
  loop_scope(std::int64_t start, std::int64_t stop, std::int64_t step, std::string_view name,
             const std::vector<std::int64_t>& unroll_list);
  ~loop_scope() { close(); }
  loop_scope(const loop_scope&) = delete;
  loop_scope& operator=(const loop_scope&) = delete;
  const std::vector<loop_chunk>& chunks() const { return chunks_; }
  /// Records chunk k in the kernel's report as its iterations begin.
  void begin_chunk(std::size_t k);
  void close();

 private:
  std::vector<loop_chunk> chunks_;
  std::uint64_t kernel_serial_ = 0;  // the run_kernel pass it belongs to
  bool unrolled_ = false;
};

struct kernel_options {
  std::size_t ub_bytes = 192 * 1024;  ///< the unified buffer's capacity
};

struct kernel_report {
  std::string name;
  std::size_t peak_ub_bytes = 0;    ///< the most UB bytes live at once
  std::size_t ub_budget_bytes = 0;  ///< the capacity it ran under
  std::int64_t tiles = 0;           ///< tiles assembled
  std::int64_t assembles = 0;
  std::vector<loop_chunk> chunks;  ///< every loop's stretches, in order
  double seconds = 0;              ///< the executing pass
};

/// Runs a kernel body over its tensors: a checking pass, then the executing pass. Inputs and
/// outputs must not share memory.
kernel_report run_kernel(std::string_view name, const std::vector<tensor>& inputs,
                         const std::vector<tensor>& outputs, const std::function<void()>& body,
                         const kernel_options& options = {});
/// The same, with roles taken from use, as PyPTO's kernels (all tensors are parameters): a
/// tensor the body views is an input, one it assembles into an output; viewing and assembling
/// one tensor is a cycle. A tensor the body neither views nor assembles is left untouched.
kernel_report run_kernel(std::string_view name, const std::vector<tensor>& params,
                         const std::function<void()>& body, const kernel_options& options = {});

}  // namespace tilerope::tile
