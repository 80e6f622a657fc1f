// The tile-layer executor: runs a kernel body twice (a checking pass that moves no data, then
// the executing pass), evaluates op graphs one tile at a time in a UB of fixed capacity, and
// keeps the kernel state: the registered tensors, the tile shape in force, the loops.
//
// The rules every op keeps live here: a tile shape set, tile rank <= 4, dims > 0, tile rank
// equal to the op's output rank, last tile dim * sizeof(dtype) a multiple of 32 bytes, and the
// UB budget (ub_buffer, tile_internal.h); tensors of rank 1..4, f32 / f16 / bf16, last dim
// contiguous; only the innermost loop may be unrolled.

#include <algorithm>
#include <chrono>
#include <string>

#include "core/overlap.h"
#include "tile/tile_internal.h"
#include "tilerope/error.h"
#include "tilerope/tile.h"

namespace tilerope::tile {

namespace detail {

thread_local constinit kernel_context* current_kernel = nullptr;

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

kernel_context& require_kernel(const char* op) {
  if (current_kernel == nullptr) {
    throw error(std::string("tile op '") + op + "' called outside a kernel (use run_kernel)");
  }
  return *current_kernel;
}

namespace {

void check_tile_for_op(const node& n) {
  kernel_context& c = *current_kernel;
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

}  // namespace

void check_op_rank(const char* op, const shape_t& s) {
  if (s.empty() || s.size() > static_cast<std::size_t>(max_tile_rank)) {
    throw error(std::string("op '") + op + "': rank " + std::to_string(s.size()) + " " + str(s) +
                " is outside 1..4");
  }
}

std::shared_ptr<node> make_op(op_kind kind, const char* op, dtype type, shape_t shape,
                              shape_t valid, std::vector<std::shared_ptr<node>> in) {
  require_kernel(op);
  auto n = std::make_shared<node>();
  n->kind = kind;
  n->op = op;
  n->type = type;
  n->shape = std::move(shape);
  n->valid = std::move(valid);
  n->in = std::move(in);
  check_op_rank(op, n->shape);
  check_tile_for_op(*n);
  n->tile = *current_kernel->tile;
  return n;
}

const std::shared_ptr<node>& input_node(const value& v, const char* op) {
  if (!v.graph()) throw error(std::string("op '") + op + "': an input value is empty");
  return v.graph();
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

void eval(const node& n, const region& r, float* out) {
  switch (n.kind) {
    case op_kind::leaf:
      if (!current_kernel->dry) eval_tensor_view(n, r, out);
      return;
    case op_kind::slice:
      return eval_slice(n, r, out);
    case op_kind::neg:
    case op_kind::rsqrt:
    case op_kind::add_scalar:
    case op_kind::mul_scalar:
    case op_kind::div_scalar:
    case op_kind::rdiv_scalar:
      return eval_unary(n, r, out);
    case op_kind::add:
    case op_kind::sub:
    case op_kind::mul:
    case op_kind::div:
      return eval_binary(n, r, out);
    case op_kind::sum:
    case op_kind::amax:
      return eval_reduce(n, r, out);
    case op_kind::cast:
      return eval_cast(n, r, out);
    case op_kind::concat:
      return eval_concat(n, r, out);
    case op_kind::gather:
      return eval_gather(n, r, out);
    case op_kind::interleave:
      return eval_interleave(n, r, out);
    case op_kind::expand:
      return eval_expand(n, r, out);
  }
}

void eval_tiles(const node& n, const std::function<void(const region&, const float*)>& store) {
  kernel_context& c = *current_kernel;
  // Tiles over the valid region, of the tile shape the root op was created with (a bare view
  // has none: the one in force, else the whole view).
  const std::size_t rank = n.shape.size();
  shape_t tile = n.tile;
  if (tile.size() != rank) tile = c.tile && c.tile->size() == rank ? *c.tile : n.shape;
  region r{dims4(rank, 0), dims4(rank, 0)};
  dims4 starts(rank, 0);
  for (std::size_t i = 0; i < rank; ++i) {
    if (n.valid[i] == 0) return;
  }
  while (true) {
    for (std::size_t i = 0; i < rank; ++i) {
      r.off[i] = starts[i];
      r.ext[i] = std::min(tile[i], n.valid[i] - starts[i]);
    }
    {
      ub_buffer buf(n, r);
      eval(n, r, buf.data());
      ++c.report->tiles;
      // the checking pass walks every tile, moving no data
      if (!c.dry) store(r, buf.data());
    }
    std::size_t i = rank;
    while (i-- > 0) {
      starts[i] += tile[i];
      if (starts[i] < n.valid[i]) break;
      starts[i] = 0;
    }
    if (i == static_cast<std::size_t>(-1)) return;
  }
}

}  // namespace detail

using detail::current_kernel;
using detail::kernel_context;
using detail::max_tile_rank;
using detail::require_kernel;
using detail::str;

// ---- tensors and values --------------------------------------------------------------------

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

// ---- kernel state: tile shape, loops -------------------------------------------------------

void set_vec_tile_shapes(const shape_t& dims) {
  kernel_context& c = require_kernel("set_vec_tile_shapes");
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

loop_scope::loop_scope(std::int64_t start, std::int64_t stop, std::int64_t step,
                       std::string_view name, const std::vector<std::int64_t>& unroll_list) {
  kernel_context& c = require_kernel("loop");
  if (!c.unrolled_loops.empty()) {
    throw error("loop '" + std::string(name) + "' is nested in loop '" + c.unrolled_loops.back() +
                "', which is unrolled: only the innermost loop may be unrolled");
  }
  chunks_ = loop_chunks(start, stop, step, unroll_list);
  unrolled_ = std::any_of(unroll_list.begin(), unroll_list.end(), [](auto f) { return f > 1; });
  if (unrolled_) c.unrolled_loops.emplace_back(name);
  kernel_serial_ = c.serial;
}

void loop_scope::begin_chunk(std::size_t k) {
  kernel_context& c = require_kernel("loop");
  if (k >= chunks_.size() || c.serial != kernel_serial_) {
    throw error("loop: chunk " + std::to_string(k) + " is not one of the loop's " +
                std::to_string(chunks_.size()) + " chunks, or its kernel pass has ended");
  }
  c.report->chunks.push_back(chunks_[k]);
}

void loop_scope::close() {
  if (unrolled_ && current_kernel != nullptr && current_kernel->serial == kernel_serial_ &&
      !current_kernel->unrolled_loops.empty()) {
    current_kernel->unrolled_loops.pop_back();
  }
  unrolled_ = false;
}

void loop(std::int64_t start, std::int64_t stop, std::int64_t step, std::string_view name,
          const std::vector<std::int64_t>& unroll_list,
          const std::function<void(std::int64_t)>& body) {
  loop_scope scope(start, stop, step, name, unroll_list);
  for (std::size_t k = 0; k < scope.chunks().size(); ++k) {
    scope.begin_chunk(k);
    const loop_chunk& ch = scope.chunks()[k];
    for (std::int64_t i = ch.begin; i < ch.end; i += step) body(i);
  }
}

// ---- the two passes ------------------------------------------------------------------------

namespace {

thread_local std::uint64_t next_serial = 0;

// Inputs and outputs that share memory: reading a tile after another tile wrote it.
void check_no_shared_memory(std::string_view name, const std::vector<tensor>& all) {
  const auto role_name = [](const tensor_state& t) {
    return t.role == tensor_state::role::input ? "input '" : "output '";
  };
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      const tensor_state& a = *all[i].state;
      const tensor_state& b = *all[j].state;
      if (all[i].state == all[j].state) continue;
      if (a.role != tensor_state::role::output && b.role != tensor_state::role::output)
        continue;  // reads may share
      if ((a.role != tensor_state::role::input && a.role != tensor_state::role::output) ||
          (b.role != tensor_state::role::input && b.role != tensor_state::role::output))
        continue;
      if (::tilerope::detail::views_share_memory(a.memory, b.memory)) {
        throw error("kernel '" + std::string(name) + "': " + role_name(a) + a.name + "' and " +
                    role_name(b) + b.name +
                    "' share memory; a kernel's outputs may not overlap its other tensors");
      }
    }
  }
}

// The two passes over a kernel's tensors: `inputs` and `outputs` by role, `params` by use.
kernel_report run_passes(std::string_view name, const std::vector<tensor>& inputs,
                         const std::vector<tensor>& outputs, const std::vector<tensor>& params,
                         const std::function<void()>& body, const kernel_options& options) {
  if (current_kernel != nullptr)
    throw error("run_kernel '" + std::string(name) + "': kernels do not nest");
  if (options.ub_bytes < detail::vector_alignment) {
    throw error("kernel '" + std::string(name) + "': UB of " + std::to_string(options.ub_bytes) +
                " bytes is too small");
  }
  kernel_report report;
  kernel_context c;
  c.name = name;
  c.ub_budget = options.ub_bytes;
  c.arena.resize(options.ub_bytes / 2 + 64);
  for (const auto& [list, what] : {std::pair{&inputs, "an input"}, std::pair{&outputs, "an output"},
                                   std::pair{&params, "a"}}) {
    for (const auto& t : *list) {
      if (!t.state) throw error("kernel '" + std::string(name) + "': " + what + " tensor is empty");
    }
  }
  std::vector<tensor> all;
  for (const auto* list : {&inputs, &outputs, &params})
    all.insert(all.end(), list->begin(), list->end());
  struct scope {
    kernel_context* prev;
    const std::vector<tensor>& all;
    ~scope() {
      current_kernel = prev;
      for (const auto& t : all) {
        t.state->role = tensor_state::role::unregistered;
        t.state->by_use = false;
      }
    }
  } restore{current_kernel, all};
  current_kernel = &c;
  double seconds = 0;
  for (const bool dry : {true, false}) {
    for (const auto& t : inputs) t.state->role = tensor_state::role::input;
    for (const auto& t : outputs) t.state->role = tensor_state::role::output;
    for (const auto& t : params) {
      t.state->role = tensor_state::role::param;
      t.state->by_use = true;
    }
    for (const auto& t : all) t.state->assembled = false;
    c.dry = dry;
    c.serial = ++next_serial;
    c.tile.reset();
    c.ub_live = 0;
    c.arena_top = 0;
    c.unrolled_loops.clear();
    report = kernel_report{};
    c.report = &report;
    const auto t0 = std::chrono::steady_clock::now();
    body();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dry) check_no_shared_memory(name, all);
  }
  report.name = name;
  report.peak_ub_bytes = c.ub_peak;
  report.ub_budget_bytes = c.ub_budget;
  report.seconds = seconds;
  return report;
}

}  // namespace

kernel_report run_kernel(std::string_view name, const std::vector<tensor>& inputs,
                         const std::vector<tensor>& outputs, const std::function<void()>& body,
                         const kernel_options& options) {
  return run_passes(name, inputs, outputs, {}, body, options);
}

kernel_report run_kernel(std::string_view name, const std::vector<tensor>& params,
                         const std::function<void()>& body, const kernel_options& options) {
  return run_passes(name, {}, {}, params, body, options);
}

}  // namespace tilerope::tile
