#include "apply.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "npy.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/rope.h"

namespace tilerope::cli {

namespace {

struct apply_options {
  std::string q, k, positions, style, layout = "thd", dtype_name, table = "none";
  std::string precision = "accurate", out_q, out_k;
  std::optional<std::int64_t> offset;
  double theta = 0;
  int rotary_dim = 0;
  bool backward = false;
};

dtype dtype_of(const npy_array& a, const std::string& path, const std::string& forced) {
  dtype t;
  if (a.descr == "<f4")
    t = dtype::f32;
  else if (a.descr == "<f2")
    t = dtype::f16;
  else if (a.descr == "<u2") {
    if (forced != "bf16")
      throw error(path + ": dtype '<u2' is read as bf16 only with --dtype bf16");
    t = dtype::bf16;
  } else {
    throw error(path + ": dtype '" + a.descr +
                "' is not supported for q/k (f4, f2, u2 with --dtype bf16)");
  }
  if (!forced.empty() && dtype_from_string(forced) != t) {
    throw error(path + ": holds " + std::string(to_string(t)) + " but --dtype is " + forced);
  }
  return t;
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The rope_apply view of an x file in the given layout (rank 3 thd, rank 4 bshd / bhsd).
tensor_view x_view(void* data, dtype t, const std::vector<std::int64_t>& s,
                   const std::string& layout, const std::string& what) {
  if (layout == "thd") {
    if (s.size() != 3)
      throw error(what + " must be [T, H, D] for --layout thd, got " + shape_str(s));
    return tensor_view::contiguous(data, t, {s[0], s[1], s[2]});
  }
  if (s.size() != 4) {
    throw error(what + " must have rank 4 for --layout " + layout + ", got " + shape_str(s));
  }
  if (layout == "bshd") return tensor_view::contiguous(data, t, {s[0], s[1], s[2], s[3]});
  // bhsd file [B, H, S, D] as {B, S, H, D}
  const std::int64_t B = s[0], H = s[1], S = s[2], D = s[3];
  return tensor_view(data, t, {B, S, H, D}, {H * S * D, D, S * D, 1});
}

void run_apply(const apply_options& o) {
  if (o.layout != "thd" && o.layout != "bshd" && o.layout != "bhsd") {
    throw error("--layout '" + o.layout + "' is not one of thd, bshd, bhsd");
  }
  if (o.positions.empty() == !o.offset.has_value()) {
    throw error("give exactly one of --positions P.npy and --offset N");
  }
  if (o.k.empty() != o.out_k.empty()) throw error("--k and --out-k go together");
  if (o.table != "none" && o.table != "f32" && o.table != "x") {
    throw error("--table '" + o.table + "' is not one of none, f32, x");
  }
  const rope_style style = rope_style_from_string(o.style);
  const angle_precision precision = angle_precision_from_string(o.precision);
  if (!o.dtype_name.empty()) dtype_from_string(o.dtype_name);

  npy_array q = read_npy(o.q);
  const dtype t = dtype_of(q, o.q, o.dtype_name);
  std::optional<npy_array> k;
  if (!o.k.empty()) {
    k = read_npy(o.k);
    const dtype kt =
        dtype_of(*k, o.k, o.dtype_name.empty() && t == dtype::bf16 ? "bf16" : o.dtype_name);
    if (kt != t) {
      throw error("k dtype (" + std::string(to_string(kt)) + ") must match q dtype (" +
                  std::string(to_string(t)) + ")");
    }
  }
  std::vector<unsigned char> q_out(q.data.size()), k_out(k ? k->data.size() : 0);
  rope_tensors x;
  x.q = x_view(q.data.data(), t, q.shape, o.layout, "q " + o.q);
  x.q_out = x_view(q_out.data(), t, q.shape, o.layout, "q " + o.q);
  if (k) {
    x.k = x_view(k->data.data(), t, k->shape, o.layout, "k " + o.k);
    x.k_out = x_view(k_out.data(), t, k->shape, o.layout, "k " + o.k);
  }

  npy_array ids;
  rope_positions positions = rope_positions::from_offset(o.offset.value_or(0));
  std::int64_t largest = 0;
  const std::int64_t tokens = x.q.rank == 4 ? x.q.shape[1] : x.q.shape[0];
  if (!o.positions.empty()) {
    ids = read_npy(o.positions);
    if (ids.descr != "<i4" && ids.descr != "<i8") {
      throw error(o.positions + ": positions dtype '" + ids.descr + "' must be int32 or int64");
    }
    const dtype it = ids.descr == "<i4" ? dtype::i32 : dtype::i64;
    if (ids.shape.empty() || ids.shape.size() > 2) {
      throw error(o.positions + ": positions shape " + shape_str(ids.shape) +
                  " must be [T], [S] or [B, S]");
    }
    positions = rope_positions::from_ids(tensor_view::contiguous(ids.data.data(), it, ids.shape));
    const std::size_t n = ids.data.size() / size_of(it);
    for (std::size_t i = 0; i < n; ++i) {
      largest = std::max(largest, static_cast<std::int64_t>(load_as_f64(ids.data.data(), it, i)));
    }
  } else {
    largest = std::max<std::int64_t>(0, *o.offset + tokens - 1);
  }

  const int head_dim = static_cast<int>(x.q.shape[x.q.rank - 1]);
  const int rotary_dim = o.rotary_dim ? o.rotary_dim : head_dim;
  rope_table table;
  rope_angles angles;
  if (o.table == "none") {
    angles = rope_angles::from_theta(o.theta, precision);
  } else {
    table = make_rope_table(largest + 1, rotary_dim, o.theta, o.table == "x" ? t : dtype::f32,
                            precision);
    angles = rope_angles::from_table(table.cos, table.sin);
  }
  rope_options options;
  options.rotary_dim = o.rotary_dim;
  options.backward = o.backward;
  rope_apply(style, x, positions, angles, options);

  write_npy_atomic(o.out_q, q.descr, q.shape, q_out.data(), q_out.size());
  if (k) write_npy_atomic(o.out_k, k->descr, k->shape, k_out.data(), k_out.size());
}

}  // namespace

void add_apply_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("apply", "Apply RoPE to q (and k) read from .npy files");
  auto o = std::make_shared<apply_options>();
  cmd->add_option("--q", o->q,
                  "q .npy: [T, H, D] (thd), [B, S, H, D] (bshd) or [B, H, S, D] (bhsd); "
                  "f4, f2, or u2 holding bf16 bits with --dtype bf16")
      ->required();
  cmd->add_option("--k", o->k, "k .npy, same dtype and layout as q; its head count may differ");
  auto* pos = cmd->add_option(
      "--positions", o->positions,
      "int32/int64 .npy of positions: [T] for thd; [S] (shared) or [B, S] for bshd/bhsd");
  auto* off =
      cmd->add_option("--offset", o->offset, "position of the first token (token t is at N + t)");
  pos->excludes(off);
  off->excludes(pos);
  cmd->add_option("--style", o->style, "neox (rotate halves) or gptj (adjacent pairs)")->required();
  cmd->add_option("--theta", o->theta, "RoPE base: inv_freq[i] = theta^(-2i/rotary_dim)")
      ->required();
  cmd->add_option("--rotary-dim", o->rotary_dim,
                  "dims rotated (even, <= head_dim; default head_dim); "
                  "the rest pass through");
  cmd->add_option("--layout", o->layout, "thd (default), bshd or bhsd");
  cmd->add_option("--dtype", o->dtype_name,
                  "f32 | f16 | bf16: the input dtype (needed for bf16 in u2 files)");
  cmd->add_flag("--backward", o->backward, "apply the inverse rotation (the gradient w.r.t. x)");
  cmd->add_option("--table", o->table,
                  "none (default: angles computed per token), f32 or x "
                  "(a cos/sin table in fp32 or in the x dtype)");
  cmd->add_option("--precision", o->precision,
                  "accurate (default: fp64 angles) or hf_compat "
                  "(HF transformers' fp32 angles)");
  cmd->add_option("--out-q", o->out_q, "output .npy for q (same dtype and shape)")->required();
  cmd->add_option("--out-k", o->out_k, "output .npy for k (with --k)");
  cmd->callback([o] { run_apply(*o); });
}

}  // namespace tilerope::cli
