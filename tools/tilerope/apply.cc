#include "apply.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "npy.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/rope.h"

namespace tilerope::cli {

namespace {

// The flags of `tilerope apply`, as given.
struct apply_args {
  std::string q, k, positions, style, layout = "thd", dtype_name, table = "none";
  std::string precision = "accurate", out_q, out_k;
  std::int64_t offset = 0;
  double theta = 0;
  int rotary_dim = 0;
  bool backward = false;
  const CLI::Option* positions_flag = nullptr;
  const CLI::Option* offset_flag = nullptr;
  const CLI::Option* rotary_dim_flag = nullptr;
};

// The largest table the CLI builds (cos and sin together); past it, --table none is the way.
constexpr std::int64_t max_table_bytes = std::int64_t{4} << 30;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// `value` if it is one of `names`, else an error naming the flag, the value and the choices.
const std::string& one_of(const std::string& flag, const std::string& value,
                          const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), value) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw error(flag + " '" + value + "' is not one of " + list);
  }
  return value;
}

// The dtype q or k holds: f4 -> f32, f2 -> f16, u2 -> bf16 (only with --dtype bf16).
dtype x_dtype(const npy_array& a, const std::string& path, std::optional<dtype> forced) {
  dtype t = dtype::f32;
  if (a.descr == "<f2") {
    t = dtype::f16;
  } else if (a.descr == "<u2") {
    if (forced != dtype::bf16) {
      throw error(path + ": dtype '<u2' is read as bf16 bits only with --dtype bf16");
    }
    t = dtype::bf16;
  }
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

void run_apply(const apply_args& a) {
  // Flags first, before any file is read.
  if ((a.positions_flag->count() > 0) == (a.offset_flag->count() > 0)) {
    throw error(a.positions_flag->count() > 0
                    ? "--positions and --offset are mutually exclusive; give one"
                    : "one of --positions P.npy and --offset N is required");
  }
  if (a.k.empty() != a.out_k.empty()) {
    throw error(a.k.empty() ? "--out-k (" + a.out_k + ") is given without --k"
                            : "--k (" + a.k + ") is given without --out-k");
  }
  if (!a.out_k.empty()) {
    std::error_code e1, e2;
    const auto pq = std::filesystem::weakly_canonical(a.out_q, e1);
    const auto pk = std::filesystem::weakly_canonical(a.out_k, e2);
    if (a.out_q == a.out_k || (!e1 && !e2 && pq == pk)) {
      throw error("--out-q and --out-k name the same file (" + a.out_k + ")");
    }
  }
  if (a.rotary_dim_flag->count() > 0 && a.rotary_dim == 0) {
    throw error("--rotary-dim (0) must be > 0; leave it out to rotate all of head_dim");
  }
  const rope_style style = rope_style_from_string(a.style);
  const std::string& layout = one_of("--layout", a.layout, {"thd", "bshd", "bhsd"});
  const std::string& table = one_of("--table", a.table, {"none", "f32", "x"});
  const angle_precision precision = angle_precision_from_string(a.precision);
  std::optional<dtype> forced;
  if (!a.dtype_name.empty()) {
    forced = dtype_from_string(one_of("--dtype", a.dtype_name, {"f32", "f16", "bf16"}));
  }
  rope_angles angles = rope_angles::from_theta(a.theta, precision);  // checks theta

  // Inputs, and out-of-place outputs in memory.
  npy_array q = read_npy(a.q, npy_content::floats);
  const dtype t = x_dtype(q, a.q, forced);
  std::optional<npy_array> k;
  if (!a.k.empty()) k = read_npy(a.k, npy_content::floats);
  std::vector<unsigned char> q_out(q.data.size()), k_out(k ? k->data.size() : 0);
  rope_tensors x;
  x.q = x_view(q.data.data(), t, q.shape, layout, a.q, "q");
  x.q_out = x_view(q_out.data(), t, q.shape, layout, a.q, "q");
  if (k) {
    const dtype kt = x_dtype(*k, a.k, forced);  // rope_apply reports a k dtype unlike q's
    x.k = x_view(k->data.data(), kt, k->shape, layout, a.k, "k");
    x.k_out = x_view(k_out.data(), kt, k->shape, layout, a.k, "k");
  }

  npy_array ids;
  rope_positions positions = rope_positions::from_offset(a.offset);
  if (a.positions_flag->count() > 0) {
    ids = read_npy(a.positions, npy_content::integers);
    const dtype it = ids.descr == "<i4" ? dtype::i32 : dtype::i64;
    positions = rope_positions::from_ids(tensor_view::contiguous(ids.data.data(), it, ids.shape));
  }

  rope_table tables;
  if (table != "none") {
    const std::int64_t rows = table_rows(positions, x.q);
    const int rotary_dim = a.rotary_dim ? a.rotary_dim : static_cast<int>(x.q.shape[x.q.rank - 1]);
    const dtype table_type = table == "x" ? t : dtype::f32;
    const std::int64_t row_bytes =
        2 * std::max(rotary_dim / 2, 0) * static_cast<std::int64_t>(size_of(table_type));
    if (row_bytes > 0 && rows > max_table_bytes / row_bytes) {
      throw error("--table " + table + ": positions up to " + std::to_string(rows - 1) +
                  " need a cos/sin table of " + std::to_string(rows) +
                  " rows, over the 4 GiB this program builds; use --table none");
    }
    tables = make_rope_table(rows, rotary_dim, a.theta, table_type, precision);
    angles = rope_angles::from_table(tables.cos, tables.sin);
  }

  rope_options options;
  options.rotary_dim = a.rotary_dim;
  options.backward = a.backward;
  rope_apply(style, x, positions, angles, options);

  // Every output written beside its destination first, then all renamed.
  pending_npy out_q(a.out_q, q.descr, q.shape, q_out.data(), q_out.size());
  std::optional<pending_npy> out_k;
  if (k) out_k.emplace(a.out_k, k->descr, k->shape, k_out.data(), k_out.size());
  out_q.commit();
  if (out_k) out_k->commit();
}

}  // namespace

void add_apply_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "apply",
      "Rotate q (and k) read from .npy files; write .npy outputs of the same dtype and shape");
  auto a = std::make_shared<apply_args>();
  cmd->add_option("--q", a->q,
                  "q .npy: [T, H, D] (thd), [B, S, H, D] (bshd) or [B, H, S, D] (bhsd); float32, "
                  "float16, or uint16 holding bf16 bits (with --dtype bf16)")
      ->type_name("FILE")
      ->required();
  cmd->add_option("--k", a->k,
                  "k .npy: as q, same dtype and layout; its head count may differ (GQA). "
                  "Needs --out-k")
      ->type_name("FILE");
  a->positions_flag = cmd->add_option("--positions", a->positions,
                                      "int32 or int64 .npy of positions: [T] for thd; [S] (shared "
                                      "by the batch) or [B, S] for bshd and bhsd. Or --offset")
                          ->type_name("FILE");
  a->offset_flag = cmd->add_option("--offset", a->offset,
                                   "consecutive positions N, N + 1, ... for the T (or S) tokens. "
                                   "Or --positions")
                       ->type_name("N");
  cmd->add_option("--style", a->style, "neox (rotate halves) or gptj (adjacent pairs)")
      ->type_name("neox|gptj")
      ->required();
  cmd->add_option("--theta", a->theta,
                  "RoPE base, finite and > 0: inv_freq[i] = theta^(-2i/rotary_dim)")
      ->type_name("F")
      ->required();
  a->rotary_dim_flag =
      cmd->add_option("--rotary-dim", a->rotary_dim,
                      "leading dims rotated per head, even and <= head_dim (default head_dim); "
                      "the rest pass through unchanged")
          ->type_name("N");
  cmd->add_option("--layout", a->layout,
                  "thd (default), bshd or bhsd: how q and k files are laid out (see --q)")
      ->type_name("thd|bshd|bhsd");
  cmd->add_option("--dtype", a->dtype_name,
                  "f32, f16 or bf16: the dtype of q and k; required for bf16 (uint16 files), "
                  "otherwise taken from the files and checked against them")
      ->type_name("f32|f16|bf16");
  cmd->add_flag("--backward", a->backward,
                "apply the inverse rotation (the gradient w.r.t. x of the forward)");
  cmd->add_option("--table", a->table,
                  "none (default): cos/sin computed per token; f32 or x: looked up in a "
                  "[max position + 1, rotary_dim/2] table of fp32 or of the q dtype")
      ->type_name("none|f32|x");
  cmd->add_option("--precision", a->precision,
                  "accurate (default): fp64 angles; hf_compat: fp32 angles as HF transformers")
      ->type_name("accurate|hf_compat");
  cmd->add_option("--out-q", a->out_q,
                  "output .npy for q, same dtype and shape; replaced whole or not at all")
      ->type_name("FILE")
      ->required();
  cmd->add_option("--out-k", a->out_k, "output .npy for k (with --k)")->type_name("FILE");
  cmd->callback([a] { run_apply(*a); });
}

}  // namespace tilerope::cli
