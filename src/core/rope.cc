// rope_apply: validation at the boundary, then the CPU plan. Nothing is written until every
// argument has been checked.

#include "tilerope/rope.h"

#include <cmath>
#include <string>

#include "core/overlap.h"
#include "cpu/rope_plan.h"
#include "tilerope/error.h"

namespace tilerope {

std::string_view to_string(rope_style s) { return s == rope_style::neox ? "neox" : "gptj"; }

rope_style rope_style_from_string(std::string_view name) {
  if (name == "neox") return rope_style::neox;
  if (name == "gptj") return rope_style::gptj;
  throw error("style '" + std::string(name) + "' is not one of neox, gptj");
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

std::string_view to_string(mrope_layout l) {
  return l == mrope_layout::chunked ? "chunked" : "interleaved";
}

mrope_layout mrope_layout_from_string(std::string_view name) {
  if (name == "chunked") return mrope_layout::chunked;
  if (name == "interleaved") return mrope_layout::interleaved;
  throw error("mrope layout '" + std::string(name) + "' is not one of chunked, interleaved");
}

std::vector<int> mrope_axis_map(const std::array<int, 3>& section, mrope_layout layout) {
  for (int s : section) {
    if (s < 0) {
      throw error("mrope_section [" + std::to_string(section[0]) + ", " +
                  std::to_string(section[1]) + ", " + std::to_string(section[2]) +
                  "] must not be negative");
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

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

std::string describe(const char* name, const tensor_view& v) {
  return std::string(name) + " " + v.shape_string();
}

void check_data(const char* name, const tensor_view& v) {
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

void check_same_dtype(const char* name, const tensor_view& v, const tensor_view& q) {
  if (v.type != q.type) {
    throw error(std::string(name) + " dtype (" + std::string(to_string(v.type)) +
                ") must match q dtype (" + std::string(to_string(q.type)) + ")");
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

void check_k(const tensor_view& k, const tensor_view& q) {
  check_x("k", k);
  check_same_dtype("k", k, q);
  if (k.rank != q.rank) {
    throw error("k rank (" + num(k.rank) + ") " + k.shape_string() + " must equal q rank (" +
                num(q.rank) + ") " + q.shape_string());
  }
  for (int i = 0; i + 2 < q.rank; ++i) {
    if (k.shape[i] != q.shape[i]) {
      throw error("k token dims " + k.shape_string() + " must match q " + q.shape_string() +
                  " in every dim but heads");
    }
  }
  if (k.shape[k.rank - 1] != q.shape[q.rank - 1]) {
    throw error("k head_dim (" + num(k.shape[k.rank - 1]) + ") must equal q head_dim (" +
                num(q.shape[q.rank - 1]) + ")");
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
    return t.seq > 0 && t.batch > 0 ? p.start + t.seq - 1 : -1;
  }
  const tensor_view& ids = p.ids;
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
    const std::string want =
        rank4 ? "[" + num(t.seq) + "] or [" + num(t.batch) + ", " + num(t.seq) + "]"
              : "[" + num(t.seq) + "]";
    throw error("positions shape " + ids.shape_string() + " must be " + want + " for q " +
                q.shape_string() +
                (rank4 ? "" : " (one position per token, T = " + num(t.seq) + ")"));
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
};

void check_overlaps(const rope_tensors& x, const rope_positions& p, const rope_angles& a) {
  const tensor_view& q_w = x.q_out ? *x.q_out : x.q;
  const tensor_view* k_w = x.k ? (x.k_out ? &*x.k_out : &*x.k) : nullptr;
  // fixed arrays: this runs on every call, decode included
  named_view written[2] = {{x.q_out ? "q_out" : "q (in place)", &q_w}, {"", nullptr}};
  std::size_t n_written = 1;
  if (k_w) written[n_written++] = {x.k_out ? "k_out" : "k (in place)", k_w};
  named_view read[5];
  std::size_t n_read = 0;
  read[n_read++] = {"q", &x.q};
  if (x.k) read[n_read++] = {"k", &*x.k};
  if (p.from != rope_positions::source::offset) read[n_read++] = {"positions", &p.ids};
  if (a.from == rope_angles::source::table) {
    read[n_read++] = {"cos", &a.cos};
    read[n_read++] = {"sin", &a.sin};
  }
  for (std::size_t i = 0; i < n_written; ++i) {
    const auto& w = written[i];
    if (detail::view_overlaps_itself(*w.view)) {
      throw error(std::string(w.name) + " " + w.view->shape_string() + " with strides " +
                  w.view->strides_string() + " addresses some elements more than once");
    }
  }
  for (std::size_t i = 0; i < n_written; ++i) {
    const auto& w = written[i];
    const tensor_view& own_input = i == 0 ? x.q : *x.k;
    for (std::size_t j = 0; j < n_read; ++j) {
      const auto& r = read[j];
      if (r.view == &own_input && detail::same_view(*w.view, own_input)) continue;
      if (detail::views_share_memory(*w.view, *r.view)) {
        throw error(describe(w.name, *w.view) + " overlaps " + describe(r.name, *r.view) +
                    "; an output may only be exactly its own input (in place)");
      }
    }
  }
  if (n_written == 2 && detail::views_share_memory(*written[0].view, *written[1].view)) {
    throw error(describe(written[0].name, *written[0].view) + " overlaps " +
                describe(written[1].name, *written[1].view));
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

}  // namespace

void rope_apply(rope_style style, const rope_tensors& x, const rope_positions& positions,
                const rope_angles& angles, const rope_options& options) {
  if (style != rope_style::neox && style != rope_style::gptj) {
    throw error("style (" + num(static_cast<int>(style)) + ") is not a rope_style");
  }
  const tensor_view& q = x.q;
  check_x("q", q);
  if (x.k) check_k(*x.k, q);
  if (x.k_out && !x.k) throw error("k_out is given but k is not");
  if (x.q_out) {
    check_x("q_out", *x.q_out);
    check_same_dtype("q_out", *x.q_out, q);
    check_same_shape("q_out", *x.q_out, "q", q);
  }
  if (x.k_out) {
    check_x("k_out", *x.k_out);
    check_same_dtype("k_out", *x.k_out, q);
    check_same_shape("k_out", *x.k_out, "k", *x.k);
  }
  const std::int64_t head_dim = q.shape[q.rank - 1];
  const std::int64_t rotary_dim = options.rotary_dim == 0 ? head_dim : options.rotary_dim;
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    throw error("rotary_dim (" + num(rotary_dim) + ") must be even, > 0 and <= head_dim (" +
                num(head_dim) + ")");
  }
  const std::int64_t half = rotary_dim / 2;
  const token_dims t = q.rank == 4 ? token_dims{q.shape[0], q.shape[1]} : token_dims{1, q.shape[0]};
  const std::int64_t largest = check_positions(positions, q, t, half);

  detail::rope_plan plan;
  std::vector<double> inv_freq;
  std::vector<float> inv_freq_f32;
  if (angles.from == rope_angles::source::table) {
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
    if (angles.theta != 0) {
      inv_freq = rope_inv_freq(static_cast<int>(rotary_dim), angles.theta);
      if (angles.precision == angle_precision::hf_compat) {
        inv_freq_f32 = rope_inv_freq_hf(static_cast<int>(rotary_dim), angles.theta);
      }
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
      inv_freq = angles.inv_freq;
      for (double f : inv_freq) inv_freq_f32.push_back(static_cast<float>(f));
    }
    plan.inv_freq = inv_freq.data();
    plan.inv_freq_f32 = inv_freq_f32.data();
    plan.precision = angles.precision;
  }
  check_overlaps(x, positions, angles);

  plan.style = style;
  plan.backward = options.backward;
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
    plan.axis_of_frequency = positions.axis_of_frequency.data();
    plan.ids_s = 1;
  } else if (positions.from == rope_positions::source::ids) {
    plan.ids = positions.ids.data;
    plan.ids_type = positions.ids.type;
    plan.ids_b = positions.ids.rank == 2 ? positions.ids.strides[0] : 0;
    plan.ids_s = 1;
  } else {
    plan.start = positions.start;
  }
  detail::run_rope_cpu(plan);
}

}  // namespace tilerope
