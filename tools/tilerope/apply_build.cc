#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "apply_call.h"
#include "tilerope/error.h"

namespace tilerope::cli {

namespace {

// The largest table the CLI builds (cos and sin together); past it, --table none is the way.
constexpr std::int64_t max_table_bytes = std::int64_t{4} << 30;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The dtype of a float file: f4 -> f32, f2 -> f16, u2 -> bf16 (only with --dtype bf16).
dtype float_dtype(const npy_array& a, const std::string& path, std::optional<dtype> forced) {
  if (a.descr == "<f2") return dtype::f16;
  if (a.descr == "<u2") {
    if (forced != dtype::bf16) {
      throw error(path + ": dtype '<u2' is read as bf16 bits only with --dtype bf16");
    }
    return dtype::bf16;
  }
  return dtype::f32;
}

// The dtype q or k holds, checked against --dtype.
dtype x_dtype(const npy_array& a, const std::string& path, std::optional<dtype> forced) {
  const dtype t = float_dtype(a, path, forced);
  if (forced && *forced != t) {
    throw error(path + ": holds " + std::string(to_string(t)) + " ('" + a.descr +
                "') but --dtype is " + std::string(to_string(*forced)));
  }
  return t;
}

// The rope_apply view of a q or k file: thd [T, H, D] as it is, bshd [B, S, H, D] as it is,
// bhsd [B, H, S, D] as shape {B, S, H, D} with strides {H*S*D, D, S*D, 1}.
tensor_view x_view(void* data, dtype t, const std::vector<std::int64_t>& s,
                   const std::string& layout, const std::string& path, const char* role) {
  const std::size_t rank = layout == "thd" ? 3 : 4;
  if (s.size() != rank) {
    throw error(path + ": " + role + " shape " + shape_text(s) + " has rank " +
                std::to_string(s.size()) + "; --layout " + layout + " needs " +
                (layout == "thd"    ? "[T, H, D]"
                 : layout == "bshd" ? "[B, S, H, D]"
                                    : "[B, H, S, D]"));
  }
  if (layout != "bhsd") return tensor_view::contiguous(data, t, s);
  const std::int64_t b = s[0], h = s[1], seq = s[2], d = s[3];
  return tensor_view(data, t, {b, seq, h, d}, {h * seq * d, d, seq * d, 1});
}

// Rows a cos/sin table needs for these positions, validating what sizing it depends on
// (non-negative positions, no overflow); rope_apply checks everything else.
std::int64_t table_rows(const rope_positions& p, const tensor_view& q) {
  const std::int64_t batch = q.rank == 4 ? q.shape[0] : 1;
  const std::int64_t tokens = q.shape[q.rank == 4 ? 1 : 0];
  if (p.from == rope_positions::source::offset) {
    if (p.start < 0) throw error("position offset (" + std::to_string(p.start) + ") must be >= 0");
    if (batch == 0 || tokens == 0) return 0;
    std::int64_t rows = 0;
    if (__builtin_add_overflow(p.start, tokens, &rows)) {
      throw error("position offset (" + std::to_string(p.start) + ") + " + std::to_string(tokens) +
                  " tokens overflows int64");
    }
    return rows;
  }
  const tensor_view& ids = p.ids;
  const std::int64_t n = ids.numel();
  const std::int64_t last = ids.rank > 0 ? ids.shape[ids.rank - 1] : 1;
  std::int64_t largest = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t v = ids.type == dtype::i32 ? static_cast<const std::int32_t*>(ids.data)[i]
                                                  : static_cast<const std::int64_t*>(ids.data)[i];
    if (v < 0) {
      const std::string at = ids.rank == 2
                                 ? std::to_string(i / last) + ", " + std::to_string(i % last)
                                 : std::to_string(i);
      throw error("positions[" + at + "] (" + std::to_string(v) + ") must be >= 0");
    }
    largest = std::max(largest, v);
  }
  if (largest == std::numeric_limits<std::int64_t>::max()) {
    throw error("position " + std::to_string(largest) + " is too large for a table");
  }
  return largest + 1;
}

std::string section_text(const std::array<int, 3>& s) {
  return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
         "]";
}

// A per-token cos or sin file: its shape must be one of `tokens` followed by a width of
// rotary_dim or rotary_dim/2.
void check_rows_shape(const std::string& path, const char* flag, const npy_array& a,
                      const std::vector<std::vector<std::int64_t>>& tokens, std::int64_t rotary,
                      const std::string& what, apply_variant v) {
  for (const auto& t : tokens) {
    if (a.shape.size() == t.size() + 1 && std::equal(t.begin(), t.end(), a.shape.begin()) &&
        (a.shape.back() == rotary || a.shape.back() == rotary / 2)) {
      return;
    }
  }
  std::string want;
  for (const auto& t : tokens) {
    for (const std::int64_t w : {rotary, rotary / 2}) {
      auto e = t;
      e.push_back(w);
      want += (want.empty() ? "" : " or ") + shape_text(e);
    }
  }
  throw error(path + ": " + flag + " shape " + shape_text(a.shape) + " must be " + want + " (" +
              what + "; rotary_dim " + std::to_string(rotary) +
              " or rotary_dim/2 wide) for --variant " + name_of(v));
}

// A norm weight file: [D], float32, float16 or bf16 bits (with --dtype bf16).
tensor_view weight_view(npy_array& w, const std::string& path, const char* flag,
                        std::optional<dtype> forced, std::int64_t head_dim) {
  const dtype t = float_dtype(w, path, forced);
  if (w.shape.size() != 1 || w.shape[0] != head_dim) {
    throw error(path + ": " + flag + " shape " + shape_text(w.shape) + " must be [D] = [" +
                std::to_string(head_dim) + "] (q head_dim)");
  }
  return tensor_view::contiguous(w.data.data(), t, w.shape);
}

// q and k with their out-of-place buffers and views; the config, checked against q's
// head_dim; rotary_dim from the config or the flag.
void read_inputs(const apply_request& r, apply_call& call) {
  const apply_args& a = r.args;
  if (a.given("--config")) call.config = rope_config::from_hf_json(a.config);
  call.q = read_npy(a.q, npy_content::floats);
  const npy_array& q = call.q;
  const dtype t = x_dtype(q, a.q, r.forced_dtype);
  if (!a.k.empty()) call.k = read_npy(a.k, npy_content::floats);
  const std::optional<npy_array>& k = call.k;
  call.q_out.resize(q.data.size());
  call.k_out.resize(k ? k->data.size() : 0);
  rope_tensors& x = call.x;
  x.q = x_view(call.q.data.data(), t, q.shape, r.layout, a.q, "q");
  x.q_out = x_view(call.q_out.data(), t, q.shape, r.layout, a.q, "q");
  if (k) {
    const dtype kt = x_dtype(*k, a.k, r.forced_dtype);  // rope_apply reports a k dtype unlike q's
    x.k = x_view(call.k->data.data(), kt, k->shape, r.layout, a.k, "k");
    x.k_out = x_view(call.k_out.data(), kt, k->shape, r.layout, a.k, "k");
  }
  call.head_dim = x.q.shape[x.q.rank - 1];
  call.tokens = x.q.shape[x.q.rank == 4 ? 1 : 0];
  call.options = r.options;
  if (call.config) {
    if (call.config->head_dim != call.head_dim) {
      throw error(a.config + ": head_dim (" + std::to_string(call.config->head_dim) +
                  ") differs from q head_dim (" + std::to_string(call.head_dim) + ", " + a.q + " " +
                  shape_text(q.shape) + ")");
    }
    call.options.rotary_dim = call.config->effective_rotary_dim();
  } else {
    call.options.rotary_dim = a.rotary_dim;
  }
  call.rotary = call.options.rotary_dim ? call.options.rotary_dim : call.head_dim;
}

// MRoPE: the axis of each frequency, by --section or the config's mrope_section, whose sum
// must be rotary_dim/2.
void set_mrope_axes(const apply_request& r, apply_call& call) {
  if (r.variant != apply_variant::mrope) return;
  const apply_args& a = r.args;
  const std::optional<rope_config>& config = call.config;
  std::optional<std::array<int, 3>> section = r.section;
  const bool from_config = !section && config && config->mrope_section;
  if (!section && !from_config) {
    throw error("--variant mrope needs --section T,H,W" +
                std::string(config ? " (" + a.config + " has no mrope_section)"
                                   : " (or a --config with mrope_section)"));
  }
  if (from_config) section = config->mrope_section;
  const mrope_layout l = a.given("--section-layout") || !config ? r.section_layout
                         : config->mrope_interleaved            ? mrope_layout::interleaved
                                                                : mrope_layout::chunked;
  const std::int64_t sum = std::int64_t{(*section)[0]} + (*section)[1] + (*section)[2];
  if (2 * sum != call.rotary) {
    throw error((from_config ? a.config + ": mrope_section " : "--section ") +
                section_text(*section) + " sums to " + std::to_string(sum) +
                "; it must be rotary_dim/2 (" + std::to_string(call.rotary / 2) + ")");
  }
  call.mrope_axes = mrope_axis_map(*section, l);
}

// Positions: as given for rope, qk-norm-rope and interleave; [S, 2] -> [2, S] for vision;
// [3, T] for mrope. None with --cos/--sin.
void set_positions(const apply_request& r, apply_call& call) {
  const apply_args& a = r.args;
  if (r.rows) return;
  if (a.given("--offset")) call.positions = rope_positions::from_offset(a.offset);
  if (!a.given("--positions")) return;
  call.ids = read_npy(a.positions, npy_content::integers);
  const npy_array& ids = call.ids;
  const std::int64_t tokens = call.tokens, head_dim = call.head_dim;
  const dtype it = ids.descr == "<i4" ? dtype::i32 : dtype::i64;
  if (r.variant == apply_variant::vision) {
    if (ids.shape.size() != 2 || ids.shape[0] != tokens || ids.shape[1] != 2) {
      throw error(a.positions + ": positions shape " + shape_text(ids.shape) +
                  " must be [S, 2] = [" + std::to_string(tokens) +
                  ", 2] (row, col of each patch) for --variant vision");
    }
    const std::size_t es = size_of(it);
    call.ids_by_axis.resize(ids.data.size());
    for (std::int64_t s = 0; s < tokens; ++s) {
      for (std::int64_t axis = 0; axis < 2; ++axis) {
        const unsigned char* from = ids.data.data() + (s * 2 + axis) * es;
        const std::int64_t id = it == dtype::i32 ? *reinterpret_cast<const std::int32_t*>(from)
                                                 : *reinterpret_cast<const std::int64_t*>(from);
        if (id < 0) {
          throw error(a.positions + ": positions[" + std::to_string(s) + ", " +
                      std::to_string(axis) + "] (" + std::to_string(id) + ") must be >= 0");
        }
        std::copy(from, from + es, call.ids_by_axis.data() + (axis * tokens + s) * es);
      }
    }
    if (head_dim % 4 != 0) {
      throw error(a.q + ": q head_dim (" + std::to_string(head_dim) + ", shape " +
                  shape_text(call.q.shape) +
                  ") must be a multiple of 4 for --variant vision with --positions (head_dim/4 "
                  "frequencies per axis)");
    }
    call.vision_freqs = qwen2vl_vision_frequencies(static_cast<int>(head_dim), a.theta);
    call.positions =
        rope_positions::from_axes(tensor_view::contiguous(call.ids_by_axis.data(), it, {2, tokens}),
                                  call.vision_freqs->axis_of_frequency);
  } else if (r.variant == apply_variant::mrope) {
    if (ids.shape.size() != 2 || ids.shape[0] != 3 || ids.shape[1] != tokens) {
      throw error(a.positions + ": positions shape " + shape_text(ids.shape) +
                  " must be [3, T] = [3, " + std::to_string(tokens) +
                  "] (temporal, height, width of each token) for --variant mrope");
    }
    call.positions = rope_positions::from_axes(
        tensor_view::contiguous(call.ids.data.data(), it, ids.shape), call.mrope_axes);
  } else {
    call.positions =
        rope_positions::from_ids(tensor_view::contiguous(call.ids.data.data(), it, ids.shape));
  }
}

// Angles: per-token rows (--cos/--sin), or computed from --theta / --config, looked up in a
// table or not.
void set_angles(const apply_request& r, apply_call& call) {
  const apply_args& a = r.args;
  const std::int64_t tokens = call.tokens, rotary = call.rotary;
  const rope_tensors& x = call.x;
  if (r.rows) {
    call.cos_rows = read_npy(a.cos, npy_content::floats);
    call.sin_rows = read_npy(a.sin, npy_content::floats);
    const npy_array &cos_rows = call.cos_rows, &sin_rows = call.sin_rows;
    const dtype ct = float_dtype(cos_rows, a.cos, r.forced_dtype);
    const dtype st = float_dtype(sin_rows, a.sin, r.forced_dtype);
    std::vector<std::vector<std::int64_t>> token_shapes;
    std::string what = "one row per token";
    if (r.variant == apply_variant::mrope) {
      token_shapes = {{3, tokens}};
      what = "a plane per axis (temporal, height, width), one row per token";
    } else if (x.q.rank == 3) {
      token_shapes = {{tokens}};
      if (r.variant == apply_variant::vision) what = "one row per patch";
    } else {
      token_shapes = {{tokens}, {x.q.shape[0], tokens}};
      what = "one row per token, shared by the batch or per batch";
    }
    check_rows_shape(a.cos, "--cos", cos_rows, token_shapes, rotary, what, r.variant);
    if (sin_rows.shape != cos_rows.shape || st != ct) {
      throw error(a.sin + ": --sin " + shape_text(sin_rows.shape) + " " +
                  std::string(to_string(st)) + " must match --cos " + a.cos + " " +
                  shape_text(cos_rows.shape) + " " + std::string(to_string(ct)));
    }
    call.angles = rope_angles::from_token_rows(
        tensor_view::contiguous(call.cos_rows.data.data(), ct, cos_rows.shape),
        tensor_view::contiguous(call.sin_rows.data.data(), st, sin_rows.shape), call.mrope_axes);
    return;
  }
  // Explicit frequencies (a config's, the vision tower's); plain --theta otherwise.
  const std::optional<rope_config>& config = call.config;
  std::optional<rope_frequencies> freqs;
  if (config) freqs = config->frequencies(table_rows(call.positions, x.q));
  if (call.vision_freqs) freqs = rope_frequencies{call.vision_freqs->inv_freq, 1.0};
  if (r.table == "none") {
    call.angles = freqs ? rope_angles::from_frequencies(*freqs, r.precision)
                        : rope_angles::from_theta(a.theta, r.precision);
    return;
  }
  if (freqs && r.precision == angle_precision::hf_compat) {
    throw error("--precision hf_compat with --table builds the table from --theta; with " +
                std::string(config ? "--config" : "--variant vision") +
                " leave out --table or --precision");
  }
  const std::int64_t table_len = table_rows(call.positions, x.q);
  const dtype table_type = r.table == "x" ? x.q.type : dtype::f32;
  const std::int64_t row_bytes = 2 * (rotary / 2) * static_cast<std::int64_t>(size_of(table_type));
  if (row_bytes > 0 && table_len > max_table_bytes / row_bytes) {
    throw error("--table " + r.table + ": positions up to " + std::to_string(table_len - 1) +
                " need a cos/sin table of " + std::to_string(table_len) +
                " rows, over the 4 GiB this program builds; use --table none");
  }
  call.tables = freqs ? make_rope_table(table_len, *freqs, table_type)
                      : make_rope_table(table_len, static_cast<int>(rotary), a.theta, table_type,
                                        r.precision);
  call.angles = rope_angles::from_table(call.tables.cos, call.tables.sin);
}

// qk-norm-rope: the RMSNorm weights; with --backward, the gradients of the outputs (shaped
// and typed as q and k) and float32 [D] buffers for the weight gradients.
void read_norm_inputs(const apply_request& r, apply_call& call) {
  call.norm = r.norm;
  if (r.variant != apply_variant::qk_norm_rope) return;
  const apply_args& a = r.args;
  const std::optional<dtype> forced = r.forced_dtype;
  const std::int64_t head_dim = call.head_dim;
  const bool k = call.k.has_value();
  call.q_weight = read_npy(a.q_weight, npy_content::floats);
  call.norm.q_weight = weight_view(call.q_weight, a.q_weight, "--q-weight", forced, head_dim);
  if (k) {
    call.k_weight = read_npy(a.k_weight, npy_content::floats);
    call.norm.k_weight = weight_view(call.k_weight, a.k_weight, "--k-weight", forced, head_dim);
  }
  if (!r.norm_backward) return;
  const auto grad_view = [&](npy_array& g, const std::string& path, const char* flag,
                             const npy_array& of, const std::string& of_path, const char* role) {
    const dtype gt = x_dtype(g, path, forced);
    const dtype want = float_dtype(of, of_path, forced);
    if (g.shape != of.shape || gt != want) {
      throw error(path + ": " + flag + " " + shape_text(g.shape) + " " +
                  std::string(to_string(gt)) + " must match --" + role + " " + of_path + " " +
                  shape_text(of.shape) + " " + std::string(to_string(want)));
    }
    return x_view(g.data.data(), gt, g.shape, r.layout, path, role);
  };
  qk_norm_rope_grad_tensors& g = call.grads;
  call.grad_q = read_npy(a.grad_q, npy_content::floats);
  g.q = call.x.q;
  g.dq_out = grad_view(call.grad_q, a.grad_q, "--grad-q", call.q, a.q, "q");
  g.dq = call.x.q_out;
  call.q_weight_grad.resize(static_cast<std::size_t>(head_dim));
  g.dq_weight = tensor_view::contiguous(call.q_weight_grad.data(), dtype::f32, {head_dim});
  if (k) {
    call.grad_k = read_npy(a.grad_k, npy_content::floats);
    g.k = call.x.k;
    g.dk_out = grad_view(call.grad_k, a.grad_k, "--grad-k", *call.k, a.k, "k");
    g.dk = call.x.k_out;
    call.k_weight_grad.resize(static_cast<std::size_t>(head_dim));
    g.dk_weight = tensor_view::contiguous(call.k_weight_grad.data(), dtype::f32, {head_dim});
  }
}

}  // namespace

void build_apply_call(const apply_request& r, apply_call& call) {
  read_inputs(r, call);
  set_mrope_axes(r, call);
  set_positions(r, call);
  set_angles(r, call);
  read_norm_inputs(r, call);
}

}  // namespace tilerope::cli
