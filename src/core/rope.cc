// rope_apply: validation at the boundary, then the CPU plan. Nothing is written until every
// argument has been checked.

#include "tilerope/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>

#include "core/enum_names.h"
#include "core/overlap.h"
#include "core/rope_plan.h"
#include "core/view_check.h"
#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope_config.h"

namespace tilerope {

namespace {
constexpr detail::enum_name<rope_style> style_names[] = {{rope_style::neox, "neox"},
                                                         {rope_style::gptj, "gptj"}};
constexpr detail::enum_name<mrope_layout> mrope_layout_names[] = {
    {mrope_layout::chunked, "chunked"}, {mrope_layout::interleaved, "interleaved"}};
constexpr detail::enum_name<rope_output_layout> output_layout_names[] = {
    {rope_output_layout::as_input, "as_input"},
    {rope_output_layout::split_half, "split_half"},
    {rope_output_layout::as_input, "interleaved", true},
    {rope_output_layout::split_half, "split-half", true}};
constexpr detail::enum_name<qk_norm_rounding> rounding_names[] = {
    {qk_norm_rounding::fp32_once, "fp32_once"}, {qk_norm_rounding::hf_qwen3, "hf_qwen3"}};
}  // namespace

std::string_view to_string(rope_style s) { return detail::name_of(style_names, s); }

rope_style rope_style_from_string(std::string_view name) {
  return detail::value_named(style_names, name, "style");
}

rope_positions rope_positions::from_ids(const tensor_view& ids) {
  rope_positions p;
  p.from = source::ids;
  p.ids = ids;
  return p;
}

rope_positions rope_positions::from_offset(std::int64_t start) {
  rope_positions p;
  p.from = source::offset;
  p.start = start;
  return p;
}

rope_positions rope_positions::from_axes(const tensor_view& ids,
                                         std::vector<int> axis_of_frequency) {
  rope_positions p;
  p.from = source::axes;
  p.ids = ids;
  p.axis_of_frequency = std::move(axis_of_frequency);
  return p;
}

std::string_view to_string(mrope_layout l) { return detail::name_of(mrope_layout_names, l); }

mrope_layout mrope_layout_from_string(std::string_view name) {
  return detail::value_named(mrope_layout_names, name, "mrope layout");
}

std::vector<int> mrope_axis_map(const std::array<int, 3>& section, mrope_layout layout) {
  // Each entry at most head_dim/2 of the largest head_dim a config may give.
  constexpr int max_entry = rope_config::max_head_dim / 2;
  for (int s : section) {
    if (s < 0 || s > max_entry) {
      throw error("mrope_section [" + std::to_string(section[0]) + ", " +
                  std::to_string(section[1]) + ", " + std::to_string(section[2]) +
                  "] entries must be in [0, " + std::to_string(max_entry) + "]");
    }
  }
  const int n = section[0] + section[1] + section[2];
  std::vector<int> axis(static_cast<std::size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    if (layout == mrope_layout::chunked) {
      axis[i] = i < section[0] ? 0 : i < section[0] + section[1] ? 1 : 2;
    } else {
      axis[i] = (i % 3 == 1 && i < 3 * section[1]) ? 1 : (i % 3 == 2 && i < 3 * section[2]) ? 2 : 0;
    }
  }
  return axis;
}

vision_2d_frequencies qwen2vl_vision_frequencies(int head_dim, double theta) {
  if (head_dim <= 0 || head_dim % 4 != 0) {
    throw error("head_dim (" + std::to_string(head_dim) +
                ") must be a positive multiple of 4 for 2D vision RoPE");
  }
  const std::vector<double> per_axis = rope_inv_freq(head_dim / 2, theta);  // head_dim/4 of them
  vision_2d_frequencies f;
  for (int axis = 0; axis < 2; ++axis) {
    for (double v : per_axis) {
      f.inv_freq.push_back(v);
      f.axis_of_frequency.push_back(axis);
    }
  }
  return f;
}

rope_angles rope_angles::from_table(const tensor_view& cos, const tensor_view& sin) {
  rope_angles a;
  a.from = source::table;
  a.cos = cos;
  a.sin = sin;
  return a;
}

rope_angles rope_angles::from_theta(double theta, angle_precision precision) {
  if (!std::isfinite(theta) || !(theta > 0)) {
    throw error("theta (" + std::to_string(theta) + ") must be finite and > 0");
  }
  rope_angles a;
  a.from = source::inv_freq;
  a.theta = theta;
  a.precision = precision;
  return a;
}

rope_angles rope_angles::from_inv_freq(std::vector<double> inv_freq, angle_precision precision) {
  rope_angles a;
  a.from = source::inv_freq;
  a.inv_freq = std::move(inv_freq);
  a.precision = precision;
  return a;
}

rope_angles rope_angles::from_frequencies(const rope_frequencies& f, angle_precision precision) {
  if (!std::isfinite(f.attention_scaling) || !(f.attention_scaling > 0)) {
    throw error("attention_scaling (" + std::to_string(f.attention_scaling) +
                ") must be finite and > 0");
  }
  rope_angles a = from_inv_freq(f.inv_freq, precision);
  a.attention_scaling = f.attention_scaling;
  return a;
}

rope_angles rope_angles::from_token_rows(const tensor_view& cos, const tensor_view& sin,
                                         std::vector<int> axis_of_frequency) {
  rope_angles a;
  a.from = source::token_rows;
  a.cos = cos;
  a.sin = sin;
  a.axis_of_frequency = std::move(axis_of_frequency);
  return a;
}

std::string_view to_string(rope_output_layout l) { return detail::name_of(output_layout_names, l); }

rope_output_layout rope_output_layout_from_string(std::string_view name) {
  return detail::value_named(output_layout_names, name, "output layout");
}

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

std::string describe(const char* name, const tensor_view& v) {
  return std::string(name) + " " + v.shape_string();
}

void check_data(const char* name, const tensor_view& v) {
  detail::check_view(name, v);
  if (v.data == nullptr && v.numel() > 0) {
    throw error(std::string(name) + " has null data but shape " + v.shape_string());
  }
}

void check_last_contiguous(const char* name, const tensor_view& v) {
  if (v.rank > 0 && v.shape[v.rank - 1] > 1 && v.strides[v.rank - 1] != 1) {
    throw error(std::string(name) + " last dim must be contiguous (stride 1), got strides " +
                v.strides_string());
  }
}

// q or k (or an output of the same shape): rank 3 [T, H, D] or rank 4 [B, S, H, D].
void check_x(const char* name, const tensor_view& v) {
  detail::check_view(name, v);
  if (v.rank != 3 && v.rank != 4) {
    throw error(std::string(name) + " must have rank 3 [T, H, D] or 4 [B, S, H, D], got rank " +
                num(v.rank) + " " + v.shape_string());
  }
  if (!is_floating(v.type)) {
    throw error(std::string(name) + " dtype (" + std::string(to_string(v.type)) +
                ") must be f32, f16 or bf16");
  }
  check_last_contiguous(name, v);
  check_data(name, v);
}

void check_same_dtype(const char* name, const tensor_view& v, const tensor_view& q,
                      const char* q_name = "q") {
  if (v.type != q.type) {
    throw error(std::string(name) + " dtype (" + std::string(to_string(v.type)) + ") must match " +
                q_name + " dtype (" + std::string(to_string(q.type)) + ")");
  }
}

void check_same_shape(const char* name, const tensor_view& v, const char* of,
                      const tensor_view& x) {
  bool same = v.rank == x.rank;
  for (int i = 0; same && i < v.rank; ++i) same = v.shape[i] == x.shape[i];
  if (!same) {
    throw error(std::string(name) + " shape " + v.shape_string() + " must equal " + of + " shape " +
                x.shape_string());
  }
}

// The names errors give the four x tensors: q, k, q_out, k_out for a forward; the backward's
// dq_out, dk_out, dq, dk.
struct x_names {
  const char* q = "q";
  const char* k = "k";
  const char* q_out = "q_out";
  const char* k_out = "k_out";
};

void check_k(const tensor_view& k, const tensor_view& q, const x_names& n) {
  check_x(n.k, k);
  check_same_dtype(n.k, k, q, n.q);
  if (k.rank != q.rank) {
    throw error(std::string(n.k) + " rank (" + num(k.rank) + ") " + k.shape_string() +
                " must equal " + n.q + " rank (" + num(q.rank) + ") " + q.shape_string());
  }
  for (int i = 0; i + 2 < q.rank; ++i) {
    if (k.shape[i] != q.shape[i]) {
      throw error(std::string(n.k) + " token dims " + k.shape_string() + " must match " + n.q +
                  " " + q.shape_string() + " in every dim but heads");
    }
  }
  if (k.shape[k.rank - 1] != q.shape[q.rank - 1]) {
    throw error(std::string(n.k) + " head_dim (" + num(k.shape[k.rank - 1]) + ") must equal " +
                n.q + " head_dim (" + num(q.shape[q.rank - 1]) + ")");
  }
}

struct token_dims {
  std::int64_t batch, seq;
};

// Checks positions and returns the largest position used (-1 when there are no tokens).
std::int64_t check_positions(const rope_positions& p, const tensor_view& q, token_dims t,
                             std::int64_t half) {
  if (p.from == rope_positions::source::offset) {
    if (p.start < 0) throw error("position offset (" + num(p.start) + ") must be >= 0");
    if (t.seq == 0 || t.batch == 0) return -1;
    std::int64_t last = 0;
    if (__builtin_add_overflow(p.start, t.seq - 1, &last)) {
      throw error("position offset (" + num(p.start) + ") + " + num(t.seq) +
                  " tokens overflows int64");
    }
    return last;
  }
  const tensor_view& ids = p.ids;
  detail::check_view("positions", ids);
  if (ids.type != dtype::i32 && ids.type != dtype::i64) {
    throw error("positions dtype (" + std::string(to_string(ids.type)) + ") must be i32 or i64");
  }
  const bool rank4 = q.rank == 4;
  const bool axes = p.from == rope_positions::source::axes;
  if (axes) {
    if (rank4)
      throw error("multi-axis positions need q of rank 3 [T, H, D], got " + q.shape_string());
    if (ids.rank != 2 || ids.shape[1] != t.seq || ids.shape[0] < 1) {
      throw error("positions shape " + ids.shape_string() + " must be [A, " + num(t.seq) +
                  "] (A axes, one position per token and axis) for q " + q.shape_string());
    }
    if (static_cast<std::int64_t>(p.axis_of_frequency.size()) != half) {
      throw error("axis_of_frequency has " +
                  num(static_cast<std::int64_t>(p.axis_of_frequency.size())) +
                  " entries; rotary_dim/2 (" + num(half) + ") are needed");
    }
    for (std::size_t i = 0; i < p.axis_of_frequency.size(); ++i) {
      if (p.axis_of_frequency[i] < 0 || p.axis_of_frequency[i] >= ids.shape[0]) {
        throw error("axis_of_frequency[" + num(static_cast<std::int64_t>(i)) + "] (" +
                    num(p.axis_of_frequency[i]) + ") must lie in [0, " + num(ids.shape[0]) + ")");
      }
    }
  }
  const bool shape_ok =
      axes || (ids.rank == 1 && ids.shape[0] == t.seq) ||
      (rank4 && ids.rank == 2 && ids.shape[0] == t.batch && ids.shape[1] == t.seq);
  if (!shape_ok) {
    const std::string seq = num(t.seq), batch = num(t.batch);
    const std::string want =
        rank4 ? "[" + seq + "] or [" + batch + ", " + seq + "]" : "[" + seq + "]";
    throw error("positions shape " + ids.shape_string() + " must be " + want + " for q " +
                q.shape_string() + (rank4 ? "" : " (one position per token, T = " + seq + ")"));
  }
  check_last_contiguous("positions", ids);
  check_data("positions", ids);
  std::int64_t largest = -1;
  const std::int64_t rows = ids.rank == 2 ? ids.shape[0] : 1;
  const std::int64_t row_stride = ids.rank == 2 ? ids.strides[0] : 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t s = 0; s < t.seq; ++s) {
      const std::int64_t at = r * row_stride + s;
      const std::int64_t v = ids.type == dtype::i32
                                 ? static_cast<const std::int32_t*>(ids.data)[at]
                                 : static_cast<const std::int64_t*>(ids.data)[at];
      if (v < 0) {
        throw error("positions[" + (ids.rank == 2 ? num(r) + ", " : "") + num(s) + "] (" + num(v) +
                    ") must be >= 0");
      }
      largest = std::max(largest, v);
    }
  }
  return largest;
}

void check_table(const rope_angles& a, std::int64_t half) {
  for (const auto& [name, t] : {std::pair<const char*, const tensor_view&>{"cos", a.cos},
                                std::pair<const char*, const tensor_view&>{"sin", a.sin}}) {
    detail::check_view(name, t);
    if (t.rank != 2) {
      throw error(std::string(name) + " table must have rank 2 [max_pos, rotary_dim/2], got " +
                  t.shape_string());
    }
    if (!is_floating(t.type)) {
      throw error(std::string(name) + " table dtype (" + std::string(to_string(t.type)) +
                  ") must be f32, f16 or bf16");
    }
    if (t.shape[1] != half) {
      throw error(std::string(name) + " table width (" + num(t.shape[1]) +
                  ") must be rotary_dim/2 (" + num(half) + ")");
    }
    check_last_contiguous(name, t);
    check_data(name, t);
  }
  if (a.sin.type != a.cos.type || a.sin.shape[0] != a.cos.shape[0] ||
      a.sin.strides[0] != a.cos.strides[0]) {
    throw error("sin table " + a.sin.shape_string() + " " + std::string(to_string(a.sin.type)) +
                " strides " + a.sin.strides_string() + " must match cos table " +
                a.cos.shape_string() + " " + std::string(to_string(a.cos.type)) + " strides " +
                a.cos.strides_string());
  }
}

struct named_view {
  const char* name;
  const tensor_view* view;
  const tensor_view* own_input;  // written views: the input it may exactly be (in place)
  detail::byte_span span;        // its bytes' extent, found once
};

// The views one call writes and reads. Fixed arrays: this runs on every call, decode included.
struct operand_list {
  named_view written[4];
  std::size_t n_written = 0;
  named_view read[10];
  std::size_t n_read = 0;
  void write(const char* name, const tensor_view& v, const tensor_view* own = nullptr) {
    written[n_written++] = {name, &v, own, detail::byte_extent(v)};
  }
  void read_from(const char* name, const tensor_view& v) {
    read[n_read++] = {name, &v, nullptr, detail::byte_extent(v)};
  }
};

// Whether two operands share a byte: exact, after the test of their extents.
bool operands_overlap(const named_view& a, const named_view& b) {
  return detail::spans_meet(a.span, b.span) && detail::views_share_memory(*a.view, *b.view);
}

void check_overlaps(const operand_list& ops) {
  for (std::size_t i = 0; i < ops.n_written; ++i) {
    const auto& w = ops.written[i];
    if (detail::view_overlaps_itself(*w.view)) {
      throw error(std::string(w.name) + " " + w.view->shape_string() + " with strides " +
                  w.view->strides_string() + " addresses some elements more than once");
    }
  }
  for (std::size_t i = 0; i < ops.n_written; ++i) {
    const auto& w = ops.written[i];
    for (std::size_t j = 0; j < ops.n_read; ++j) {
      const auto& r = ops.read[j];
      if (r.view == w.own_input && detail::same_view(*w.view, *r.view)) continue;
      if (operands_overlap(w, r)) {
        throw error(describe(w.name, *w.view) + " overlaps " + describe(r.name, *r.view) +
                    "; an output may only be exactly its own input (in place)");
      }
    }
    for (std::size_t j = i + 1; j < ops.n_written; ++j) {
      const auto& o = ops.written[j];
      if (operands_overlap(w, o)) {
        throw error(describe(w.name, *w.view) + " overlaps " + describe(o.name, *o.view));
      }
    }
  }
}

// The inputs every rotation reads besides x: positions and angle tensors.
void read_positions_and_angles(operand_list& ops, const rope_positions& p, const rope_angles& a) {
  if (p.from == rope_positions::source::ids || p.from == rope_positions::source::axes) {
    ops.read_from("positions", p.ids);
  }
  if (a.from != rope_angles::source::inv_freq) {
    ops.read_from("cos", a.cos);
    ops.read_from("sin", a.sin);
  }
}

void set_block(detail::head_block& b, const tensor_view& in, const tensor_view& out) {
  const bool r4 = in.rank == 4;
  b.in = in.data;
  b.out = out.data;
  b.heads = in.shape[in.rank - 2];
  b.in_b = r4 ? in.strides[0] : 0;
  b.in_s = in.strides[r4 ? 1 : 0];
  b.in_h = in.strides[in.rank - 2];
  b.out_b = r4 ? out.strides[0] : 0;
  b.out_s = out.strides[r4 ? 1 : 0];
  b.out_h = out.strides[out.rank - 2];
}

// Per-token rows: [T, w] / [A, T, w] for rank-3 x; [S, w], [B, S, w] / [A, S, w], [A, B, S, w]
// for rank-4 x; w = rotary_dim or rotary_dim / 2.
void check_token_rows(const rope_angles& a, const tensor_view& q, token_dims t, std::int64_t half,
                      detail::rope_plan& plan) {
  const bool planes = !a.axis_of_frequency.empty();
  const bool rank4 = q.rank == 4;
  const tensor_view& c = a.cos;
  detail::check_view("cos", c);
  detail::check_view("sin", a.sin);
  const int lead = planes ? 1 : 0;
  const int token_rank = c.rank - lead - 1;  // 1: [T] or [S]; 2: [B, S]
  const std::string want =
      std::string(planes ? "[A, " : "[") +
      (rank4 ? "S, w] or " + std::string(planes ? "[A, " : "[") + "B, S, w]" : "T, w]") +
      " with T = " + num(t.seq) +
      (rank4 ? " (B = " + num(t.batch) + ", S = " + num(t.seq) + ")" : "") +
      " and w = rotary_dim (" + num(2 * half) + ") or rotary_dim/2 (" + num(half) + ")";
  bool ok = token_rank == 1 || (rank4 && token_rank == 2);
  if (ok) {
    ok = c.shape[c.rank - 2] == t.seq && (token_rank == 1 || c.shape[lead] == t.batch);
    const std::int64_t w = c.shape[c.rank - 1];
    ok = ok && (w == half || w == 2 * half);
  }
  if (!ok) {
    throw error("cos rows " + c.shape_string() + " must be " + want + " for q " + q.shape_string());
  }
  if (!is_floating(c.type)) {
    throw error("cos rows dtype (" + std::string(to_string(c.type)) + ") must be f32, f16 or bf16");
  }
  const tensor_view& s = a.sin;
  bool same = s.rank == c.rank && s.type == c.type;
  for (int i = 0; same && i < c.rank; ++i)
    same = s.shape[i] == c.shape[i] && s.strides[i] == c.strides[i];
  if (!same) {
    throw error("sin rows " + s.shape_string() + " " + std::string(to_string(s.type)) +
                " strides " + s.strides_string() + " must match cos rows " + c.shape_string() +
                " " + std::string(to_string(c.type)) + " strides " + c.strides_string());
  }
  check_last_contiguous("cos", c);
  check_last_contiguous("sin", s);
  check_data("cos", c);
  check_data("sin", s);
  if (planes) {
    if (static_cast<std::int64_t>(a.axis_of_frequency.size()) != half) {
      throw error("axis_of_frequency has " +
                  num(static_cast<std::int64_t>(a.axis_of_frequency.size())) +
                  " entries; rotary_dim/2 (" + num(half) + ") are needed");
    }
    for (std::size_t i = 0; i < a.axis_of_frequency.size(); ++i) {
      if (a.axis_of_frequency[i] < 0 || a.axis_of_frequency[i] >= c.shape[0]) {
        throw error("axis_of_frequency[" + num(static_cast<std::int64_t>(i)) + "] (" +
                    num(a.axis_of_frequency[i]) + ") must lie in [0, " + num(c.shape[0]) +
                    ") (the planes of cos " + c.shape_string() + ")");
      }
    }
    plan.axis_of_frequency = a.axis_of_frequency.data();
    plan.rows_plane = c.strides[0];
  }
  plan.rows_cos = c.data;
  plan.rows_sin = s.data;
  plan.rows_type = c.type;
  plan.rows_width = c.shape[c.rank - 1];
  plan.rows_s = c.strides[c.rank - 2];
  plan.rows_b = token_rank == 2 ? c.strides[lead] : 0;
}

// What a plan points into, owned for the length of the call.
struct plan_storage {
  std::vector<double> inv_freq;
  std::vector<float> inv_freq_f32;
};

// Validates a rotation of x (everything but overlaps) and fills the plan.
void plan_rotation(rope_style style, const rope_tensors& x, const rope_positions& positions,
                   const rope_angles& angles, const rope_options& options, detail::rope_plan& plan,
                   plan_storage& st, const x_names& n = {}) {
  if (style != rope_style::neox && style != rope_style::gptj) {
    throw error("style (" + num(static_cast<int>(style)) + ") is not a rope_style");
  }
  if (options.output_layout != rope_output_layout::as_input &&
      options.output_layout != rope_output_layout::split_half) {
    throw error("output_layout (" + num(static_cast<int>(options.output_layout)) +
                ") is not a rope_output_layout");
  }
  if (options.num_threads < 0 || options.num_threads > 4096) {
    throw error("num_threads (" + num(options.num_threads) + ") must be in [0, 4096]");
  }
  const tensor_view& q = x.q;
  check_x(n.q, q);
  if (x.k) check_k(*x.k, q, n);
  if (x.k_out && !x.k) {
    throw error(std::string(n.k_out) + " is given but " + n.k + " is not");
  }
  if (x.q_out) {
    check_x(n.q_out, *x.q_out);
    check_same_dtype(n.q_out, *x.q_out, q, n.q);
    check_same_shape(n.q_out, *x.q_out, n.q, q);
  }
  if (x.k_out) {
    check_x(n.k_out, *x.k_out);
    check_same_dtype(n.k_out, *x.k_out, q, n.q);
    check_same_shape(n.k_out, *x.k_out, n.k, *x.k);
  }
  const std::int64_t head_dim = q.shape[q.rank - 1];
  const std::int64_t rotary_dim = options.rotary_dim == 0 ? head_dim : options.rotary_dim;
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    throw error("rotary_dim (" + num(rotary_dim) + ") must be even, > 0 and <= head_dim (" +
                num(head_dim) + ")");
  }
  const std::int64_t half = rotary_dim / 2;
  const token_dims t = q.rank == 4 ? token_dims{q.shape[0], q.shape[1]} : token_dims{1, q.shape[0]};
  const bool rows = angles.from == rope_angles::source::token_rows;
  const bool no_positions = positions.from == rope_positions::source::none;
  if (rows != no_positions) {
    throw error(rows ? "angles from_token_rows carry one row per token: pass rope_positions::none()"
                     : "rope_positions::none() needs angles from_token_rows (rows per token)");
  }
  const std::int64_t largest = rows ? -1 : check_positions(positions, q, t, half);

  if (angles.from == rope_angles::source::token_rows) {
    check_token_rows(angles, q, t, half, plan);
  } else if (angles.from == rope_angles::source::table) {
    check_table(angles, half);
    const std::int64_t max_pos = angles.cos.shape[0];
    if (largest >= max_pos) {
      throw error("position " + num(largest) + " is outside the cos/sin table of " + num(max_pos) +
                  " rows [0, " + num(max_pos) + ")");
    }
    plan.cos = angles.cos.data;
    plan.sin = angles.sin.data;
    plan.table_type = angles.cos.type;
    plan.table_row = angles.cos.strides[0];
  } else {
    if (angles.precision != angle_precision::accurate &&
        angles.precision != angle_precision::hf_compat) {
      throw error("angle precision (" + num(static_cast<int>(angles.precision)) +
                  ") is not an angle_precision");
    }
    if (!std::isfinite(angles.attention_scaling) || !(angles.attention_scaling > 0)) {
      throw error("attention_scaling (" + std::to_string(angles.attention_scaling) +
                  ") must be finite and > 0");
    }
    if (angles.theta != 0) {
      // the frequencies of this thread's last (rotary_dim, theta, precision), kept: a decode
      // step calls with the same ones layer after layer, and their r/2 pow() calls took longer
      // than a token's rotation (Intel, rope-neox bf16 in place, 32 + 8 heads of 128, T = 1, min
      // ns per element: 0.241-0.246 to 0.113-0.114, where a table takes 0.098-0.103)
      thread_local struct {
        std::int64_t rotary_dim = 0;
        double theta = 0;
        angle_precision precision = angle_precision::accurate;
        std::vector<double> inv_freq;
        std::vector<float> inv_freq_f32;
      } last;
      if (last.rotary_dim != rotary_dim || last.theta != angles.theta ||
          last.precision != angles.precision) {
        last.rotary_dim = 0;  // until both are computed (rope_inv_freq may throw)
        last.inv_freq = rope_inv_freq(static_cast<int>(rotary_dim), angles.theta);
        last.inv_freq_f32.clear();
        if (angles.precision == angle_precision::hf_compat) {
          last.inv_freq_f32 = rope_inv_freq_hf(static_cast<int>(rotary_dim), angles.theta);
        }
        last.rotary_dim = rotary_dim;
        last.theta = angles.theta;
        last.precision = angles.precision;
      }
      // read in place: the plan lives for this call, and only this thread's next call changes them
      plan.inv_freq = last.inv_freq.data();
      plan.inv_freq_f32 = last.inv_freq_f32.data();
    } else {
      if (static_cast<std::int64_t>(angles.inv_freq.size()) != half) {
        throw error("inv_freq has " + num(static_cast<std::int64_t>(angles.inv_freq.size())) +
                    " entries; rotary_dim/2 (" + num(half) + ") are needed");
      }
      for (std::size_t i = 0; i < angles.inv_freq.size(); ++i) {
        if (!std::isfinite(angles.inv_freq[i])) {
          throw error("inv_freq[" + num(static_cast<std::int64_t>(i)) + "] (" +
                      std::to_string(angles.inv_freq[i]) + ") must be finite");
        }
      }
      st.inv_freq = angles.inv_freq;
      for (double f : st.inv_freq) st.inv_freq_f32.push_back(static_cast<float>(f));
      plan.inv_freq = st.inv_freq.data();
      plan.inv_freq_f32 = st.inv_freq_f32.data();
    }
    plan.precision = angles.precision;
    plan.attention_scaling = angles.attention_scaling;
  }

  plan.style = style;
  plan.backward = options.backward;
  plan.threads = options.num_threads;
  // forward: neox reads and writes halves, gptj adjacent pairs unless the output is split-half
  const detail::pairs in =
      style == rope_style::neox ? detail::pairs::halves : detail::pairs::adjacent;
  const detail::pairs out =
      options.output_layout == rope_output_layout::split_half ? detail::pairs::halves : in;
  plan.in_pairs = options.backward ? out : in;
  plan.out_pairs = options.backward ? in : out;
  plan.table_pairs = out;
  plan.x_type = q.type;
  plan.batch = t.batch;
  plan.seq = t.seq;
  plan.head_dim = head_dim;
  plan.rotary_dim = rotary_dim;
  set_block(plan.blocks[0], q, x.q_out ? *x.q_out : q);
  plan.num_blocks = 1;
  if (x.k) {
    set_block(plan.blocks[1], *x.k, x.k_out ? *x.k_out : *x.k);
    plan.num_blocks = 2;
  }
  if (positions.from == rope_positions::source::axes) {
    plan.ids = positions.ids.data;
    plan.ids_type = positions.ids.type;
    plan.ids_axis = positions.ids.strides[0];
    plan.num_axes = positions.ids.shape[0];
    plan.axis_of_frequency = positions.axis_of_frequency.data();
    plan.ids_s = 1;
  } else if (positions.from == rope_positions::source::ids) {
    plan.ids = positions.ids.data;
    plan.ids_type = positions.ids.type;
    plan.ids_b = positions.ids.rank == 2 ? positions.ids.strides[0] : 0;
    plan.ids_s = 1;
  } else if (positions.from == rope_positions::source::offset) {
    plan.start = positions.start;
  }
}

// The rotation's own operands: q and k read, their outputs written.
void add_rotation_operands(operand_list& ops, const rope_tensors& x) {
  ops.read_from("q", x.q);
  if (x.k) ops.read_from("k", *x.k);
  ops.write(x.q_out ? "q_out" : "q (in place)", x.q_out ? *x.q_out : x.q, &x.q);
  if (x.k) ops.write(x.k_out ? "k_out" : "k (in place)", x.k_out ? *x.k_out : *x.k, &*x.k);
}

// A norm weight: [head_dim], f32, f16 or bf16.
void check_weight(const char* name, const tensor_view& w, std::int64_t head_dim) {
  detail::check_view(name, w);
  if (w.rank != 1 || w.shape[0] != head_dim) {
    throw error(std::string(name) + " shape " + w.shape_string() + " must be [head_dim] = [" +
                num(head_dim) + "]");
  }
  if (!is_floating(w.type)) {
    throw error(std::string(name) + " dtype (" + std::string(to_string(w.type)) +
                ") must be f32, f16 or bf16");
  }
  check_last_contiguous(name, w);
  check_data(name, w);
}

// The normalisation's parameters, checked against x (k present or not) and set on the plan.
void plan_norm(const qk_norm& norm, bool has_k, detail::rope_plan& plan) {
  if (!std::isfinite(norm.eps) || norm.eps < 0) {
    throw error("eps (" + std::to_string(norm.eps) + ") must be finite and >= 0");
  }
  // the mean of squares and eps are added in fp32, as HF's RMSNorm does
  if (norm.eps != 0 && !(norm.eps >= 0x1p-126 && norm.eps <= 0x1.fffffep127)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", norm.eps);
    throw error(std::string("eps (") + text +
                ") must be 0 or a normal fp32 value, in [1.18e-38, 3.4e38]");
  }
  if (norm.rounding != qk_norm_rounding::fp32_once && norm.rounding != qk_norm_rounding::hf_qwen3) {
    throw error("rounding (" + num(static_cast<int>(norm.rounding)) +
                ") is not a qk_norm_rounding");
  }
  if (has_k != norm.k_weight.has_value()) {
    throw error(has_k ? "k_weight is required when k is given" : "k_weight is given but k is not");
  }
  if (norm.rounding == qk_norm_rounding::hf_qwen3 &&
      (plan.in_pairs != detail::pairs::halves || plan.out_pairs != detail::pairs::halves)) {
    throw error("rounding hf_qwen3 is Qwen3's rotate_half evaluation order: it needs style neox");
  }
  const tensor_view* given[2] = {&norm.q_weight, has_k ? &*norm.k_weight : nullptr};
  for (int k = 0; k < plan.num_blocks; ++k) {
    check_weight(k == 0 ? "q_weight" : "k_weight", *given[k], plan.head_dim);
    plan.weights[k] = *given[k];
  }
  plan.qk_norm = true;
  plan.eps = static_cast<float>(norm.eps);
  plan.hf_rounding = norm.rounding == qk_norm_rounding::hf_qwen3;
}

void add_weight_operands(operand_list& ops, const qk_norm& norm) {
  ops.read_from("q_weight", norm.q_weight);
  if (norm.k_weight) ops.read_from("k_weight", *norm.k_weight);
}

}  // namespace

rope_positions rope_positions::none() {
  rope_positions p;
  p.from = source::none;
  return p;
}

void rope_apply(rope_style style, const rope_tensors& x, const rope_positions& positions,
                const rope_angles& angles, const rope_options& options) {
  detail::rope_plan plan;
  plan_storage st;
  plan_rotation(style, x, positions, angles, options, plan, st);
  operand_list ops;
  add_rotation_operands(ops, x);
  read_positions_and_angles(ops, positions, angles);
  check_overlaps(ops);
  detail::run_plan(plan);
}

void rope_apply(rope_style style, const rope_tensors& x, const rope_angles& angles,
                const rope_options& options) {
  rope_apply(style, x, rope_positions::none(), angles, options);
}

std::string_view to_string(qk_norm_rounding r) { return detail::name_of(rounding_names, r); }

qk_norm_rounding qk_norm_rounding_from_string(std::string_view name) {
  return detail::value_named(rounding_names, name, "qk-norm rounding");
}

void qk_norm_rope_apply(rope_style style, const rope_tensors& x, const rope_positions& positions,
                        const rope_angles& angles, const qk_norm& norm,
                        const rope_options& options) {
  if (options.backward) {
    throw error("qk_norm_rope_apply computes the forward; use qk_norm_rope_backward for gradients");
  }
  detail::rope_plan plan;
  plan_storage st;
  plan_rotation(style, x, positions, angles, options, plan, st);
  plan_norm(norm, x.k.has_value(), plan);
  operand_list ops;
  add_rotation_operands(ops, x);
  read_positions_and_angles(ops, positions, angles);
  add_weight_operands(ops, norm);
  check_overlaps(ops);
  detail::run_plan(plan);
}

void qk_norm_rope_backward(rope_style style, const qk_norm_rope_grad_tensors& g,
                           const rope_positions& positions, const rope_angles& angles,
                           const qk_norm& norm, const rope_options& options) {
  if (options.backward) {
    throw error("options.backward must be false for qk_norm_rope_backward (it is the backward)");
  }
  if (norm.rounding != qk_norm_rounding::fp32_once) {
    throw error("qk_norm_rope_backward is the gradient of the fp32_once rounding; rounding is " +
                std::string(to_string(norm.rounding)));
  }
  const bool has_k = g.k.has_value();
  if (g.dk_out.has_value() != has_k || g.dk_weight.has_value() != has_k || (g.dk && !has_k)) {
    throw error(std::string("k, dk_out and dk_weight go together: k is ") +
                (has_k ? "given" : "absent") + ", dk_out " + (g.dk_out ? "given" : "absent") +
                ", dk_weight " + (g.dk_weight ? "given" : "absent") + ", dk " +
                (g.dk ? "given" : "absent"));
  }
  // the rotation's view of the gradients: dy in, dx out
  rope_tensors r;
  r.q = g.dq_out;
  r.k = g.dk_out;
  r.q_out = g.dq;
  r.k_out = g.dk;
  rope_options back = options;
  back.backward = true;
  detail::rope_plan plan;
  plan_storage st;
  plan_rotation(style, r, positions, angles, back, plan, st, {"dq_out", "dk_out", "dq", "dk"});
  plan_norm(norm, has_k, plan);
  const std::int64_t D = plan.head_dim;
  const std::pair<const char*, const tensor_view*> inputs[2] = {{"q", &g.q},
                                                                {"k", has_k ? &*g.k : nullptr}};
  const std::pair<const char*, const tensor_view*> weights[2] = {
      {"dq_weight", &g.dq_weight}, {"dk_weight", has_k ? &*g.dk_weight : nullptr}};
  for (int k = 0; k < plan.num_blocks; ++k) {
    const tensor_view& xin = *inputs[k].second;
    const tensor_view& dy = k == 0 ? g.dq_out : *g.dk_out;
    check_x(inputs[k].first, xin);
    check_same_dtype(inputs[k].first, xin, dy, k == 0 ? "dq_out" : "dk_out");
    check_same_shape(inputs[k].first, xin, k == 0 ? "dq_out" : "dk_out", dy);
    const tensor_view& w = *weights[k].second;
    detail::check_view(weights[k].first, w);
    if (w.rank != 1 || w.shape[0] != D || w.type != dtype::f32) {
      throw error(std::string(weights[k].first) + " " + w.shape_string() + " " +
                  std::string(to_string(w.type)) + " must be [head_dim] = [" + num(D) + "] f32");
    }
    check_last_contiguous(weights[k].first, w);
    check_data(weights[k].first, w);
    const bool r4 = xin.rank == 4;
    detail::head_block& b = plan.blocks[k];
    b.x = xin.data;
    b.x_b = r4 ? xin.strides[0] : 0;
    b.x_s = xin.strides[r4 ? 1 : 0];
    b.x_h = xin.strides[xin.rank - 2];
    plan.weight_grads[k] = w;
  }
  operand_list ops;
  ops.read_from("dq_out", g.dq_out);
  if (has_k) ops.read_from("dk_out", *g.dk_out);
  ops.read_from("q", g.q);
  if (has_k) ops.read_from("k", *g.k);
  ops.write(g.dq ? "dq" : "dq (over dq_out)", g.dq ? *g.dq : g.dq_out, &g.dq_out);
  if (has_k) ops.write(g.dk ? "dk" : "dk (over dk_out)", g.dk ? *g.dk : *g.dk_out, &*g.dk_out);
  ops.write("dq_weight", g.dq_weight);
  if (has_k) ops.write("dk_weight", *g.dk_weight);
  read_positions_and_angles(ops, positions, angles);
  add_weight_operands(ops, norm);
  check_overlaps(ops);
  detail::run_plan(plan);
}

}  // namespace tilerope
