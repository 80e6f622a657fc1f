#include "cases.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"

namespace tilerope::cli {

std::string_view to_string(x_layout l) {
  switch (l) {
    case x_layout::thd:
      return "thd";
    case x_layout::bshd:
      return "bshd";
    case x_layout::bhsd:
      return "bhsd";
  }
  return "?";
}

x_layout x_layout_from_string(std::string_view name) {
  if (name == "thd") return x_layout::thd;
  if (name == "bshd") return x_layout::bshd;
  if (name == "bhsd") return x_layout::bhsd;
  throw error("layout '" + std::string(name) + "' is not one of thd, bshd, bhsd");
}

namespace {

using bytes = std::vector<unsigned char>;

// One x buffer holding `total_heads` heads per token, in the case's layout.
struct x_buffer {
  bytes data;
  std::int64_t total_heads = 0;
};

// A view of heads [h0, h0 + heads) of a buffer laid out as the case says.
tensor_view head_view(const rope_case& c, x_buffer& buf, std::int64_t h0, std::int64_t heads) {
  const std::int64_t B = c.batch, S = c.tokens, D = c.head_dim, H = buf.total_heads;
  const auto es = static_cast<std::int64_t>(size_of(c.x_type));
  unsigned char* base = buf.data.data();
  switch (c.layout) {
    case x_layout::thd:
      return tensor_view(base + h0 * D * es, c.x_type, {S, heads, D}, {H * D, D, 1});
    case x_layout::bshd:
      return tensor_view(base + h0 * D * es, c.x_type, {B, S, heads, D}, {S * H * D, H * D, D, 1});
    case x_layout::bhsd:
      return tensor_view(base + h0 * S * D * es, c.x_type, {B, S, heads, D},
                         {H * S * D, D, S * D, 1});
  }
  return {};
}

x_buffer make_buffer(const rope_case& c, std::int64_t total_heads) {
  const std::int64_t b = c.layout == x_layout::thd ? 1 : c.batch;
  x_buffer buf;
  buf.total_heads = total_heads;
  buf.data.assign(
      static_cast<std::size_t>(b * c.tokens * total_heads * c.head_dim) * size_of(c.x_type), 0);
  return buf;
}

void fill_normal(x_buffer& buf, dtype t, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::size_t n = buf.data.size() / size_of(t);
  for (std::size_t i = 0; i < n; ++i) store_from_f64(buf.data.data(), t, i, normal(rng));
}

// Element (b, s, h, d) of view v, read from `from` (a buffer of the same size as the one v
// points into, starting at `base`).
double read_at(const tensor_view& v, const unsigned char* base, const unsigned char* from,
               std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  const bool r4 = v.rank == 4;
  const std::int64_t e = r4 ? b * v.strides[0] + s * v.strides[1] + h * v.strides[2] + d
                            : s * v.strides[0] + h * v.strides[1] + d;
  const auto offset = static_cast<const unsigned char*>(v.data) - base;
  const auto es = static_cast<std::int64_t>(size_of(v.type));
  return load_as_f64(from + offset + e * es, v.type, 0);
}

// Dense [B*S, H, D] fp64 copy of view v's elements as they are in `from`.
std::vector<double> gather(const rope_case& c, const tensor_view& v, const unsigned char* base,
                           const unsigned char* from) {
  const std::int64_t B = v.rank == 4 ? v.shape[0] : 1, S = c.tokens;
  const std::int64_t H = v.shape[v.rank - 2], D = c.head_dim;
  std::vector<double> out(static_cast<std::size_t>(B * S * H * D));
  std::size_t i = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d) out[i++] = read_at(v, base, from, b, s, h, d);
  return out;
}

void compare(const std::vector<double>& got, const std::vector<double>& want, case_result& r,
             const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (std::isnan(got[i]) || std::isnan(err)) {
      if (r.problem.empty())
        r.problem = std::string(what) + " element " + std::to_string(i) + " is NaN";
      r.pass = false;
      continue;
    }
    r.max_abs_err = std::max(r.max_abs_err, err);
    r.max_rel_err = std::max(r.max_rel_err, err / std::max(std::fabs(want[i]), r.atol));
    if (err > r.atol + r.rtol * std::fabs(want[i])) r.pass = false;
  }
}

void check_case_fields(const rope_case& c) {
  auto bad = [&](const std::string& what) { throw error("case '" + c.name + "': " + what); };
  if (!is_floating(c.x_type)) bad("dtype must be f32, f16 or bf16");
  if (c.tokens < 0 || c.batch < 0 || c.q_heads < 1 || c.k_heads < 0 || c.head_dim < 1) {
    bad("tokens, batch, k_heads must be >= 0 and q_heads, head_dim >= 1");
  }
  if (c.positions != "i32" && c.positions != "i64" && c.positions != "offset") {
    bad("positions '" + c.positions + "' is not one of i32, i64, offset");
  }
  if (c.table != "f32" && c.table != "f16" && c.table != "bf16" && c.table != "none") {
    bad("table '" + c.table + "' is not one of f32, f16, bf16, none");
  }
  if (c.max_pos < 1 || c.offset < 0) bad("max_pos must be >= 1 and offset >= 0");
  if (c.packed && c.k_heads == 0) bad("packed needs k_heads > 0");
  if (c.mrope_section && c.layout != x_layout::thd) bad("mrope_section needs the thd layout");
  if (c.vision_2d && (c.layout != x_layout::thd || c.mrope_section ||
                      (c.rotary_dim && c.rotary_dim != c.head_dim) || c.head_dim % 4 ||
                      c.precision != angle_precision::accurate)) {
    bad("vision_2d needs the thd layout, full rotary, head_dim % 4 == 0, accurate angles, no "
        "mrope_section");
  }
  if (!c.rows.empty() && c.rows != "f32" && c.rows != "f16" && c.rows != "bf16") {
    bad("rows '" + c.rows + "' is not one of f32, f16, bf16 (or absent)");
  }
  if ((c.rows_half || c.random_rows) && c.rows.empty()) bad("rows_half and random_rows need rows");
  if (c.qk_norm && c.norm_rounding == qk_norm_rounding::hf_qwen3 &&
      (c.style != rope_style::neox || c.backward)) {
    bad("norm_rounding hf_qwen3 needs style neox and no backward");
  }
  const double big = 1e9;
  if (c.batch * c.tokens * (c.q_heads + 2 * c.k_heads) * c.head_dim > big) bad("too large");
}

}  // namespace

std::string variant_of(const rope_case& c) {
  std::string v = c.mrope_section ? "mrope-" + std::string(to_string(c.mrope)) + "-" : "";
  if (c.vision_2d) v = "vision2d-";
  if (c.qk_norm) v = (c.zero_weights ? "qknorm-w0-" : "qknorm-") + v;
  std::string style(to_string(c.style));
  if (c.output_layout == rope_output_layout::split_half) style += "-split";
  if (!c.rows.empty()) style += c.rows_half ? "-rows/2" : "-rows";
  return v + style + (c.backward ? "-bwd" : "");
}

std::string shape_of(const rope_case& c) {
  const std::string tok = c.layout == x_layout::thd
                              ? std::to_string(c.tokens)
                              : std::to_string(c.batch) + "," + std::to_string(c.tokens);
  std::string s =
      "q[" + tok + "," + std::to_string(c.q_heads) + "," + std::to_string(c.head_dim) + "]";
  if (c.k_heads)
    s += " k[" + tok + "," + std::to_string(c.k_heads) + "," + std::to_string(c.head_dim) + "]";
  if (c.rotary_dim && c.rotary_dim != c.head_dim) s += " r=" + std::to_string(c.rotary_dim);
  return s;
}

case_result run_case(const rope_case& c) {
  check_case_fields(c);
  const bool rank4 = c.layout != x_layout::thd;
  const std::int64_t B = rank4 ? c.batch : 1, S = c.tokens, D = c.head_dim;
  const int rotary = c.rotary_dim ? c.rotary_dim : static_cast<int>(D);
  std::mt19937_64 rng(c.seed);

  // x buffers: one packed [.., Hq + 2 Hk, D] (v last, left untouched), or q and k apart.
  std::vector<x_buffer> in;
  tensor_view q, k;
  if (c.packed) {
    in.push_back(make_buffer(c, c.q_heads + 2 * c.k_heads));
  } else {
    in.push_back(make_buffer(c, c.q_heads));
    if (c.k_heads) in.push_back(make_buffer(c, c.k_heads));
  }
  for (auto& b : in) fill_normal(b, c.x_type, rng);
  q = head_view(c, in[0], 0, c.q_heads);
  if (c.k_heads)
    k = c.packed ? head_view(c, in[0], c.q_heads, c.k_heads) : head_view(c, in[1], 0, c.k_heads);
  std::vector<bytes> before;
  for (auto& b : in) before.push_back(b.data);

  // Outputs: the inputs themselves, or buffers of the same layout filled with NaN bytes.
  std::vector<x_buffer> out = in;
  tensor_view q_out = q, k_out = k;
  if (!c.inplace) {
    for (auto& b : out) std::fill(b.data.begin(), b.data.end(), 0xff);
    q_out = head_view(c, out[0], 0, c.q_heads);
    if (c.k_heads) {
      k_out = c.packed ? head_view(c, out[0], c.q_heads, c.k_heads)
                       : head_view(c, out[1], 0, c.k_heads);
    }
  }

  // Positions, per token (b, s).
  std::vector<std::int64_t> pos(static_cast<std::size_t>(B * S));
  std::uniform_int_distribution<std::int64_t> uniform(0, c.max_pos - 1);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      auto& p = pos[static_cast<std::size_t>(b * S + s)];
      if (c.positions == "offset") {
        p = c.offset + s;
      } else if (b > 0 && (c.shared_positions || !rank4)) {
        p = pos[static_cast<std::size_t>(s)];
      } else {
        p = uniform(rng);
      }
    }
  }
  const bool one_row = !rank4 || c.shared_positions;
  const dtype id_type = c.positions == "i32" ? dtype::i32 : dtype::i64;
  tensor ids(id_type, one_row ? std::vector<std::int64_t>{S} : std::vector<std::int64_t>{B, S});
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    store_from_f64(ids.data(), id_type, static_cast<std::size_t>(i),
                   static_cast<double>(pos[static_cast<std::size_t>(i)]));
  }
  rope_positions positions = c.positions == "offset" ? rope_positions::from_offset(c.offset)
                                                     : rope_positions::from_ids(ids);
  // Several positions per token (MRoPE: 3 axes, vision: 2), and per frequency the axis it
  // reads; the golden has its own maps and frequencies.
  const std::int64_t half_dim = rotary / 2;
  const bool multi_axis = c.mrope_section.has_value() || c.vision_2d;
  const std::int64_t n_axes = c.vision_2d ? 2 : 3;
  std::vector<std::int64_t> axis_pos;  // [A, T]
  tensor axis_ids;
  vision_2d_frequencies vision;
  if (multi_axis) {
    axis_ids = tensor(id_type, {n_axes, S});
    for (std::int64_t i = 0; i < n_axes * S; ++i) {
      axis_pos.push_back(c.positions == "offset" ? c.offset + i % S + (i / S) * 7 : uniform(rng));
      store_from_f64(axis_ids.data(), id_type, static_cast<std::size_t>(i),
                     static_cast<double>(axis_pos.back()));
    }
    if (c.vision_2d) {
      vision = qwen2vl_vision_frequencies(static_cast<int>(D), c.theta);
      positions = rope_positions::from_axes(axis_ids, vision.axis_of_frequency);
    } else {
      positions = rope_positions::from_axes(axis_ids, mrope_axis_map(*c.mrope_section, c.mrope));
    }
  }
  const int sec[3] = {c.mrope_section ? (*c.mrope_section)[0] : 0,
                      c.mrope_section ? (*c.mrope_section)[1] : 0,
                      c.mrope_section ? (*c.mrope_section)[2] : 0};
  // the position frequency i of token t rotates by
  auto position_at = [&](std::int64_t t, std::int64_t i) {
    if (!multi_axis) return pos[static_cast<std::size_t>(t)];
    const int axis = c.vision_2d ? golden::vision_2d_frequency(D, c.theta, i).first
                                 : golden::mrope_axis(sec, c.mrope == mrope_layout::interleaved,
                                                      static_cast<int>(i));
    return axis_pos[static_cast<std::size_t>(axis * S + t)];
  };
  std::int64_t largest = pos.empty() ? 0 : *std::max_element(pos.begin(), pos.end());
  for (std::int64_t p : axis_pos) largest = std::max(largest, p);
  // The golden's cos/sin per token and frequency (half width), for every source but rows.
  std::vector<double> gcos, gsin;
  rope_table table;
  rope_angles angles;
  const bool rows = !c.rows.empty();
  // how a full row's columns pair up: by the output layout (halves unless plain gptj)
  const bool adjacent_table =
      c.style == rope_style::gptj && c.output_layout == rope_output_layout::as_input;
  const golden::variant gvariant = c.style == rope_style::neox ? golden::variant::neox
                                   : adjacent_table            ? golden::variant::gptj
                                                               : golden::variant::gptj_split_half;
  auto freq_of_column = [&](std::int64_t j) { return adjacent_table ? j / 2 : j % half_dim; };
  // the golden's own inverse frequencies, and the angle of frequency i at position p
  std::vector<double> ginv = golden::inv_freq(rotary, c.theta);
  if (c.vision_2d) {
    for (std::int64_t i = 0; i < half_dim; ++i)
      ginv[static_cast<std::size_t>(i)] = golden::vision_2d_frequency(D, c.theta, i).second;
  }
  tensor row_cos, row_sin;
  if (rows) {
    // [T, w], [B, S, w] or [S, w] (shared), or planes [A, T, w]
    const std::int64_t w = c.rows_half ? half_dim : rotary;
    std::vector<std::int64_t> shape;
    if (multi_axis) shape.push_back(n_axes);
    if (rank4 && !c.shared_positions) shape.push_back(B);
    shape.push_back(S);
    shape.push_back(w);
    const dtype rt = dtype_from_string(c.rows);
    row_cos = tensor(rt, shape);
    row_sin = tensor(rt, shape);
    const std::int64_t planes = multi_axis ? n_axes : 1;
    const std::int64_t per_plane = row_cos.numel() / planes;
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (std::int64_t a = 0; a < planes; ++a) {
      for (std::int64_t e = 0; e < per_plane; ++e) {
        const std::int64_t token = e / w, col = e % w;
        const std::int64_t p = multi_axis ? axis_pos[static_cast<std::size_t>(a * S + token)]
                                          : pos[static_cast<std::size_t>(token)];
        const std::int64_t i = c.rows_half ? col : freq_of_column(col);
        const double angle = static_cast<double>(p) * ginv[static_cast<std::size_t>(i)];
        const auto at = static_cast<std::size_t>(a * per_plane + e);
        store_from_f64(row_cos.data(), rt, at, c.random_rows ? u(rng) : std::cos(angle));
        store_from_f64(row_sin.data(), rt, at, c.random_rows ? u(rng) : std::sin(angle));
      }
    }
    if (multi_axis) {
      angles = rope_angles::from_token_rows(
          row_cos, row_sin,
          c.vision_2d ? vision.axis_of_frequency : mrope_axis_map(*c.mrope_section, c.mrope));
    } else {
      angles = rope_angles::from_token_rows(row_cos, row_sin);
    }
    positions = rope_positions::none();
  } else if (c.table != "none") {
    table = c.vision_2d ? make_rope_table(std::max(c.max_pos, largest + 1), vision.inv_freq,
                                          dtype_from_string(c.table))
                        : make_rope_table(std::max(c.max_pos, largest + 1), rotary, c.theta,
                                          dtype_from_string(c.table), c.precision);
    angles = rope_angles::from_table(table.cos, table.sin);
    for (std::int64_t t = 0; t < B * S; ++t) {
      for (std::int64_t i = 0; i < half_dim; ++i) {
        const auto at = static_cast<std::size_t>(position_at(t, i) * half_dim + i);
        gcos.push_back(load_as_f64(table.cos.data(), table.cos.type(), at));
        gsin.push_back(load_as_f64(table.sin.data(), table.sin.type(), at));
      }
    }
  } else if (!multi_axis) {
    angles = rope_angles::from_theta(c.theta, c.precision);
    if (c.precision == angle_precision::accurate) {
      golden::angles(ginv, pos, gcos, gsin);
    } else {
      golden::angles_hf(rotary, c.theta, pos, c.x_type, gcos, gsin);
    }
  } else {  // per frequency, each at the position of its axis
    angles = c.vision_2d ? rope_angles::from_inv_freq(vision.inv_freq, c.precision)
                         : rope_angles::from_theta(c.theta, c.precision);
    for (std::int64_t t = 0; t < S; ++t) {
      for (std::int64_t i = 0; i < half_dim; ++i) {
        const auto ui = static_cast<std::size_t>(i);
        std::vector<double> cs, sn;
        if (c.precision == angle_precision::accurate) {
          golden::angles({ginv[ui]}, {position_at(t, i)}, cs, sn);
          gcos.push_back(cs[0]);
          gsin.push_back(sn[0]);
        } else {
          golden::angles_hf(rotary, c.theta, {position_at(t, i)}, c.x_type, cs, sn);
          gcos.push_back(cs[ui]);
          gsin.push_back(sn[ui]);
        }
      }
    }
  }
  // Full-width golden rows per token (rotary entries): half-width values spread over the
  // columns of each pair, or the rows as the kernel reads them (plane of each column's
  // frequency; chunked MRoPE as the source material builds it from chunks of section * 2).
  const std::int64_t tokens = B * S;
  std::vector<double> full_cos(static_cast<std::size_t>(tokens * rotary)),
      full_sin(full_cos.size());
  for (std::int64_t t = 0; t < tokens; ++t) {
    double* fc = full_cos.data() + t * rotary;
    double* fs = full_sin.data() + t * rotary;
    if (!rows) {
      for (std::int64_t j = 0; j < rotary; ++j) {
        const auto at = static_cast<std::size_t>(t * half_dim + freq_of_column(j));
        fc[j] = gcos[at];
        fs[j] = gsin[at];
      }
      continue;
    }
    const std::int64_t w = c.rows_half ? half_dim : rotary;
    const std::int64_t token_row = rank4 && c.shared_positions ? t % S : t;
    const std::int64_t per_plane = row_cos.numel() / (multi_axis ? n_axes : 1);
    auto value = [&](const tensor& tab, std::int64_t plane, std::int64_t col) {
      const auto at = static_cast<std::size_t>(plane * per_plane + token_row * w + col);
      return load_as_f64(tab.data(), tab.type(), at);
    };
    if (multi_axis && !c.vision_2d && c.mrope == mrope_layout::chunked && !adjacent_table &&
        !c.rows_half) {
      std::vector<double> planes_c(static_cast<std::size_t>(3 * rotary)), planes_s(planes_c.size());
      for (std::int64_t a = 0; a < 3; ++a) {
        for (std::int64_t j = 0; j < rotary; ++j) {
          planes_c[static_cast<std::size_t>(a * rotary + j)] = value(row_cos, a, j);
          planes_s[static_cast<std::size_t>(a * rotary + j)] = value(row_sin, a, j);
        }
      }
      const std::int64_t sec64[3] = {sec[0], sec[1], sec[2]};
      const double* pc[3] = {&planes_c[0], &planes_c[rotary], &planes_c[2 * rotary]};
      const double* ps[3] = {&planes_s[0], &planes_s[rotary], &planes_s[2 * rotary]};
      golden::mrope_row(sec64, rotary, pc, fc);
      golden::mrope_row(sec64, rotary, ps, fs);
      continue;
    }
    for (std::int64_t j = 0; j < rotary; ++j) {
      const std::int64_t i = freq_of_column(j);
      std::int64_t plane = 0;
      if (multi_axis) {
        plane = c.vision_2d ? golden::vision_2d_frequency(D, c.theta, i).first
                            : golden::mrope_axis(sec, c.mrope == mrope_layout::interleaved,
                                                 static_cast<int>(i));
      }
      const std::int64_t col = c.rows_half ? i : j;
      fc[j] = value(row_cos, plane, col);
      fs[j] = value(row_sin, plane, col);
    }
  }

  // QK RMSNorm weights, [D] of the x dtype, around 1.
  tensor q_weight, k_weight;
  std::vector<double> gw[2];
  if (c.qk_norm) {
    std::normal_distribution<double> around_one(1.0, 0.25);
    q_weight = tensor(c.x_type, {D});
    k_weight = tensor(c.x_type, {D});
    for (tensor* w : {&q_weight, &k_weight}) {
      for (std::int64_t j = 0; j < D; ++j) {
        const double value = around_one(rng);
        store_from_f64(w->data(), c.x_type, static_cast<std::size_t>(j),
                       c.zero_weights && j % 3 == 0 ? 0.0 : value);
      }
    }
    for (int k2 = 0; k2 < 2; ++k2) {
      const tensor& w = k2 ? k_weight : q_weight;
      for (std::int64_t j = 0; j < D; ++j)
        gw[k2].push_back(load_as_f64(w.data(), w.type(), static_cast<std::size_t>(j)));
    }
  }
  qk_norm norm;
  norm.q_weight = q_weight;
  if (c.k_heads) norm.k_weight = k_weight.view();
  norm.eps = c.eps;
  norm.rounding = c.norm_rounding;
  const bool norm_backward = c.qk_norm && c.backward;

  // qk-norm backward: the forward's inputs in buffers of their own; q, k above are dy.
  std::vector<x_buffer> fwd;
  tensor_view q_x, k_x;
  tensor dq_weight(dtype::f32, {D}), dk_weight(dtype::f32, {D});
  if (norm_backward) {
    for (const auto& b : in) fwd.push_back(make_buffer(c, b.total_heads));
    for (auto& b : fwd) fill_normal(b, c.x_type, rng);
    q_x = head_view(c, fwd[0], 0, c.q_heads);
    if (c.k_heads)
      k_x = c.packed ? head_view(c, fwd[0], c.q_heads, c.k_heads)
                     : head_view(c, fwd[1], 0, c.k_heads);
  }

  rope_tensors x;
  x.q = q;
  if (c.k_heads) x.k = k;
  if (!c.inplace) {
    x.q_out = q_out;
    if (c.k_heads) x.k_out = k_out;
  }
  rope_options options;
  options.rotary_dim = c.rotary_dim;
  options.output_layout = c.output_layout;
  if (norm_backward) {
    qk_norm_rope_grad_tensors g;
    g.q = q_x;
    g.dq_out = q;
    g.dq_weight = dq_weight;
    if (!c.inplace) g.dq = q_out;
    if (c.k_heads) {
      g.k = k_x;
      g.dk_out = k;
      g.dk_weight = dk_weight.view();
      if (!c.inplace) g.dk = k_out;
    }
    qk_norm_rope_backward(c.style, g, positions, angles, norm, options);
  } else if (c.qk_norm) {
    qk_norm_rope_apply(c.style, x, positions, angles, norm, options);
  } else {
    options.backward = c.backward;
    rope_apply(c.style, x, positions, angles, options);
  }

  case_result r;
  const golden::tolerance tol = golden::tolerance_for(c.x_type);
  r.atol = c.atol.value_or(tol.atol);
  r.rtol = c.rtol.value_or(tol.rtol);
  r.pass = true;
  for (int which = 0; which < (c.k_heads ? 2 : 1); ++which) {
    const tensor_view& xin = which == 0 ? q : k;
    const tensor_view& xout = which == 0 ? q_out : k_out;
    const std::size_t in_buf = (which == 1 && !c.packed) ? 1 : 0;
    const std::vector<double> x0 = gather(c, xin, in[in_buf].data.data(), before[in_buf].data());
    const std::int64_t heads = xin.shape[xin.rank - 2];
    const double* w = c.qk_norm ? gw[which].data() : nullptr;
    std::vector<double> want(x0.size());
    std::vector<double> want_dw(static_cast<std::size_t>(D), 0.0);
    std::vector<double> xf;  // qk-norm backward: the forward's input
    if (norm_backward) {
      const tensor_view& xv = which == 0 ? q_x : k_x;
      xf = gather(c, xv, fwd[in_buf].data.data(), fwd[in_buf].data.data());
    }
    for (std::int64_t t = 0; t < tokens; ++t) {
      const double* fc = full_cos.data() + t * rotary;
      const double* fs = full_sin.data() + t * rotary;
      // the forward of one row, fp64 (fp32_once: the exact result the kernel rounds once)
      auto forward = [&](const double* xr, double* yr) {
        if (!c.qk_norm) return golden::rotate_row(gvariant, D, rotary, fc, fs, xr, yr);
        std::vector<double> h(static_cast<std::size_t>(D));
        golden::rms_norm(1, D, xr, w, c.eps, h.data());
        golden::rotate_row(gvariant, D, rotary, fc, fs, h.data(), yr);
      };
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t at = (t * heads + h) * D;
        const double* xr = x0.data() + at;
        double* yr = want.data() + at;
        if (norm_backward) {
          // dx and dw by central differences of L = sum(g * forward(x)) in fp64
          const double* xrow = xf.data() + at;
          std::vector<double> y(static_cast<std::size_t>(D));
          auto loss_x = [&](const double* xv) {
            forward(xv, y.data());
            double l = 0;
            for (std::int64_t j = 0; j < D; ++j) l += xr[j] * y[j];
            return l;
          };
          golden::finite_difference_gradient(D, loss_x, xrow, 1e-6, yr);
          std::vector<double> hn(static_cast<std::size_t>(D)),
              ones(static_cast<std::size_t>(D), 1.0);
          golden::rms_norm(1, D, xrow, ones.data(), c.eps, hn.data());
          auto loss_w = [&](const double* wv) {
            std::vector<double> hw(static_cast<std::size_t>(D));
            for (std::int64_t j = 0; j < D; ++j) hw[j] = hn[j] * wv[j];
            golden::rotate_row(gvariant, D, rotary, fc, fs, hw.data(), y.data());
            double l = 0;
            for (std::int64_t j = 0; j < D; ++j) l += xr[j] * y[j];
            return l;
          };
          std::vector<double> gw_row(static_cast<std::size_t>(D));
          golden::finite_difference_gradient(D, loss_w, w, 1e-6, gw_row.data());
          for (std::int64_t j = 0; j < D; ++j) want_dw[j] += gw_row[j];
        } else if (c.qk_norm && c.norm_rounding == qk_norm_rounding::hf_qwen3) {
          golden::qk_norm_rope_row_hf(c.x_type, D, rotary, c.eps, w, fc, fs, xr, yr);
        } else if (c.backward) {
          golden::linear_transpose(D, forward, xr, yr);
        } else {
          forward(xr, yr);
        }
      }
    }
    const auto& ob = c.inplace ? in[in_buf] : out[in_buf];
    compare(gather(c, xout, ob.data.data(), ob.data.data()), want, r, which == 0 ? "q" : "k");
    if (norm_backward) {
      // dw sums over every row: compared per row (divided by their count) at fp32's tolerance
      const tensor& dw = which == 0 ? dq_weight : dk_weight;
      const double rows_n = static_cast<double>(std::max<std::int64_t>(1, tokens * heads));
      std::vector<double> got(static_cast<std::size_t>(D));
      for (std::int64_t j = 0; j < D; ++j) {
        got[j] = load_as_f64(dw.data(), dtype::f32, static_cast<std::size_t>(j)) / rows_n;
        want_dw[j] /= rows_n;
      }
      case_result wr;
      const golden::tolerance t32 = golden::tolerance_for(dtype::f32);
      wr.atol = t32.atol, wr.rtol = t32.rtol, wr.pass = true;
      compare(got, want_dw, wr, which == 0 ? "dq_weight" : "dk_weight");
      r.max_abs_err = std::max(r.max_abs_err, wr.max_abs_err);
      if (!wr.pass) {
        r.pass = false;
        if (r.problem.empty()) r.problem = which == 0 ? "dq_weight differs" : "dk_weight differs";
      }
    }
  }
  // What must not change: the inputs when out of place, v of a packed buffer always.
  for (std::size_t i = 0; i < in.size() && !c.inplace; ++i) {
    if (in[i].data != before[i]) r.pass = false, r.problem = "an input changed out of place";
  }
  if (c.packed) {
    const x_buffer& written = c.inplace ? in[0] : out[0];
    x_buffer v_copy = in[0];
    v_copy.data = before[0];
    const tensor_view v_now =
        head_view(c, const_cast<x_buffer&>(written), c.q_heads + c.k_heads, c.k_heads);
    const tensor_view v_was = head_view(c, v_copy, c.q_heads + c.k_heads, c.k_heads);
    const auto a = gather(c, v_now, written.data.data(), written.data.data());
    const auto b = gather(c, v_was, v_copy.data.data(), v_copy.data.data());
    const bool v_same =
        c.inplace ? a == b
                  : std::all_of(a.begin(), a.end(), [](double d) { return std::isnan(d); });
    if (!v_same) r.pass = false, r.problem = "v (not an operand) was written";
  }
  return r;
}

namespace {
rope_case make(std::string name, rope_style style, dtype t, std::int64_t d,
               std::int64_t tokens = 7) {
  rope_case c;
  c.name = std::move(name);
  c.style = style;
  c.x_type = t;
  c.head_dim = d;
  c.tokens = tokens;
  return c;
}
}  // namespace

std::vector<rope_case> builtin_cases() {
  std::vector<rope_case> cases;
  const rope_style styles[] = {rope_style::neox, rope_style::gptj};
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16};
  std::uint64_t seed = 100;
  // Every style x dtype x head_dim, alternating in place and out of place.
  for (rope_style s : styles) {
    for (dtype t : types) {
      for (std::int64_t d : {64, 80, 96, 128, 256}) {
        rope_case c = make(
            std::string(to_string(s)) + "-" + std::string(to_string(t)) + "-d" + std::to_string(d),
            s, t, d, 5 + (d % 7));
        c.inplace = (d / 16) % 2 == 0;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  for (rope_style s : styles) {
    const std::string st(to_string(s));
    // partial rotary: the tail dims pass through
    for (auto [d, r] : {std::pair<int, int>{128, 64}, {80, 32}, {6, 4}, {2, 2}}) {
      rope_case c = make(st + "-partial-d" + std::to_string(d) + "-r" + std::to_string(r), s,
                         r == 32 ? dtype::bf16 : dtype::f32, d, 9);
      c.rotary_dim = r;
      c.inplace = r != 64;
      c.seed = seed++;
      cases.push_back(c);
    }
    // GQA prefill slice of a Qwen3-8B-like layer, packed qkv, in place and out of place
    for (bool inplace : {true, false}) {
      rope_case c = make(st + "-gqa-32x8-packed-" + (inplace ? "inplace" : "outplace"), s,
                         dtype::bf16, 128, 17);
      c.q_heads = 32;
      c.k_heads = 8;
      c.packed = true;
      c.inplace = inplace;
      c.seed = seed++;
      cases.push_back(c);
    }
    // layouts and position forms
    for (x_layout l : {x_layout::bshd, x_layout::bhsd}) {
      for (bool shared : {true, false}) {
        rope_case c = make(st + "-" + std::string(to_string(l)) + (shared ? "-pos-s" : "-pos-bs"),
                           s, dtype::f16, 64, 11);
        c.layout = l;
        c.batch = 3;
        c.shared_positions = shared;
        c.positions = shared ? "i32" : "i64";
        c.packed = l == x_layout::bshd;
        c.inplace = !shared;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
    // decode at a cache offset, q only, i32 positions, low-precision tables
    {
      rope_case c = make(st + "-decode-offset", s, dtype::bf16, 128, 1);
      c.q_heads = 32;
      c.k_heads = 8;
      c.positions = "offset";
      c.offset = 4095;
      cases.push_back(c);
    }
    {
      rope_case c = make(st + "-q-only-i32", s, dtype::f32, 64, 13);
      c.k_heads = 0;
      c.positions = "i32";
      c.seed = seed++;
      cases.push_back(c);
    }
    for (const char* table : {"f16", "bf16"}) {
      rope_case c = make(st + "-table-" + table, s, dtype::f32, 128, 8);
      c.table = table;
      c.seed = seed++;
      cases.push_back(c);
    }
    // angles computed on the fly, at long positions
    for (angle_precision p : {angle_precision::accurate, angle_precision::hf_compat}) {
      rope_case c = make(st + "-computed-" + std::string(to_string(p)), s, dtype::f32, 128, 9);
      c.table = "none";
      c.precision = p;
      c.max_pos = 1 << 20;
      c.theta = 1e6;
      c.seed = seed++;
      cases.push_back(c);
    }
    // backward
    for (dtype t : types) {
      rope_case c = make(st + "-backward-" + std::string(to_string(t)), s, t, 128, 6);
      c.backward = true;
      c.inplace = t != dtype::f16;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  // MRoPE: positions [3, T], Qwen2-VL's chunked sections and Qwen3-VL's interleaved ones
  struct mrope_spec {
    const char* name;
    std::array<int, 3> section;
    mrope_layout layout;
  };
  for (const mrope_spec m : {mrope_spec{"qwen2vl", {16, 24, 24}, mrope_layout::chunked},
                             mrope_spec{"qwen3vl", {24, 20, 20}, mrope_layout::interleaved}}) {
    for (dtype t : types) {
      for (bool packed : {false, true}) {
        rope_case c = make(std::string("mrope-") + m.name + "-" + std::string(to_string(t)) +
                               (packed ? "-packed-16x2" : ""),
                           rope_style::neox, t, 128, packed ? 31 : 9);
        c.mrope_section = m.section;
        c.mrope = m.layout;
        c.q_heads = packed ? 16 : 4;
        c.k_heads = 2;
        c.packed = packed;
        c.inplace = !packed || t != dtype::f16;
        c.positions = t == dtype::f16 ? "i32" : "i64";
        c.theta = 1e6;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
    for (int variant = 0; variant < 4; ++variant) {
      rope_case c = make(std::string("mrope-") + m.name, rope_style::neox, dtype::f32, 128, 5);
      c.mrope_section = m.section;
      c.mrope = m.layout;
      c.seed = seed++;
      if (variant == 0) c.name += "-backward", c.backward = true;
      if (variant == 1) c.name += "-computed", c.table = "none";
      if (variant == 2)
        c.name += "-computed-hf", c.table = "none", c.precision = angle_precision::hf_compat;
      if (variant == 3) {
        c.name += "-table-bf16-partial-r64";
        c.table = "bf16";
        c.rotary_dim = 64;
        c.mrope_section = m.layout == mrope_layout::chunked ? std::array<int, 3>{8, 12, 12}
                                                            : std::array<int, 3>{12, 10, 10};
      }
      cases.push_back(c);
    }
  }
  // Qwen2-VL's vision tower: (row, col) per patch, head_dim 80 (16 heads), q and k packed
  for (dtype t : types) {
    for (std::int64_t d : {80, 64, 128}) {
      rope_case c = make("vision2d-" + std::string(to_string(t)) + "-d" + std::to_string(d),
                         rope_style::neox, t, d, d == 80 ? 37 : 9);
      c.vision_2d = true;
      c.q_heads = d == 80 ? 16 : 4;
      c.k_heads = c.q_heads;
      c.packed = d == 80;
      c.inplace = d != 64;
      c.max_pos = 64;  // patch rows and columns of a 64 x 64 grid
      c.positions = d == 128 ? "i32" : "i64";
      c.table = d == 128 ? "none" : "f32";
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  for (int variant = 0; variant < 2; ++variant) {
    rope_case c = make(variant ? "vision2d-backward" : "vision2d-table-bf16", rope_style::neox,
                       dtype::f32, 80, 7);
    c.vision_2d = true;
    c.backward = variant == 1;
    c.table = variant ? "f32" : "bf16";
    c.seed = seed++;
    cases.push_back(c);
  }
  // Vision RoPE as the source material passes it: q, k [S, N, D] with cos, sin [S, D] rows
  // per patch (full head_dim), and every other form of rows
  for (dtype t : types) {
    for (int variant = 0; variant < 4; ++variant) {
      const std::int64_t d = variant == 1 ? 80 : variant == 3 ? 64 : 128;
      rope_case c =
          make("vision-rows-" + std::string(to_string(t)) + "-v" + std::to_string(variant),
               rope_style::neox, t, d, variant == 0 ? 31 : 13 + variant);
      c.q_heads = c.k_heads = 16;
      if (variant == 2) c.q_heads = c.k_heads = 4;
      c.rows = variant == 3 ? std::string(to_string(t)) : "f32";
      c.random_rows = variant >= 2;  // columns unrelated to each other
      c.packed = variant == 1;
      c.inplace = variant != 2;
      c.backward = variant == 3 && t == dtype::f32;
      c.max_pos = 4096;
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  for (int variant = 0; variant < 8; ++variant) {
    rope_case c = make("vision-rows-form-" + std::to_string(variant), rope_style::neox,
                       variant % 2 ? dtype::bf16 : dtype::f32, 80, 11);
    c.rows = "f32";
    c.seed = seed++;
    if (variant == 0) c.name += "-half-width", c.rows_half = true;
    if (variant == 1) c.name += "-bf16-rows", c.rows = "bf16";
    if (variant == 2) c.name += "-bshd-b3", c.layout = x_layout::bshd, c.batch = 3;
    if (variant == 3) {
      c.name += "-bhsd-shared";
      c.layout = x_layout::bhsd, c.batch = 2, c.shared_positions = true;
    }
    if (variant == 4) c.name += "-backward-random", c.backward = true, c.random_rows = true;
    if (variant == 5) c.name += "-partial-r48", c.rotary_dim = 48, c.random_rows = true;
    if (variant == 6) c.name += "-2d-planes", c.vision_2d = true, c.max_pos = 64;
    if (variant == 7) {
      c.name += "-2d-planes-backward";
      c.vision_2d = true, c.max_pos = 64, c.backward = true, c.rows = "f16";
    }
    cases.push_back(c);
  }
  // MRoPE with precomputed tables, planes [3, T, D] as the source material's [3, B, S, D]
  for (const mrope_spec m : {mrope_spec{"qwen2vl", {16, 24, 24}, mrope_layout::chunked},
                             mrope_spec{"qwen3vl", {24, 20, 20}, mrope_layout::interleaved}}) {
    for (int variant = 0; variant < 4; ++variant) {
      const dtype t = variant < 3 ? types[variant] : dtype::f32;
      rope_case c = make(std::string("mrope-planes-") + m.name + "-" + std::string(to_string(t)),
                         rope_style::neox, t, 128, 31);
      c.mrope_section = m.section;
      c.mrope = m.layout;
      c.q_heads = 16;
      c.k_heads = 2;
      c.rows = variant == 2 ? "bf16" : "f32";
      c.theta = 1e6;
      c.inplace = variant != 1;
      c.seed = seed++;
      if (variant == 3) c.name += "-backward-random", c.backward = true, c.random_rows = true;
      cases.push_back(c);
    }
  }
  // Qwen3 QK RMSNorm + RoPE: q 16 heads, k 8, head_dim 128, eps 1e-6, theta 1e6
  for (dtype t : types) {
    for (std::int64_t seq : {1, 7, 32}) {
      rope_case c = make("qknorm-" + std::string(to_string(t)) + "-s" + std::to_string(seq),
                         rope_style::neox, t, 128, seq);
      c.qk_norm = true;
      c.q_heads = 16;
      c.k_heads = 8;
      c.theta = 1e6;
      c.packed = seq == 7;
      c.inplace = seq != 32;
      c.table = seq == 1 ? "none" : "f32";
      if (seq == 32) c.rows = std::string(to_string(t));  // cos, sin [S, D] as the source's
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  for (int variant = 0; variant < 5; ++variant) {
    const dtype t = variant < 3 ? dtype::bf16 : variant == 3 ? dtype::f16 : dtype::f32;
    const std::int64_t seq = variant == 0 ? 1 : variant == 1 ? 7 : 128;
    rope_case c = make("qknorm-hf-" + std::string(to_string(t)) + "-s" + std::to_string(seq),
                       rope_style::neox, t, 128, seq);
    c.qk_norm = true;
    c.norm_rounding = qk_norm_rounding::hf_qwen3;
    c.q_heads = 16;
    c.k_heads = 8;
    c.theta = 1e6;
    c.table = std::string(to_string(t));  // HF keeps cos and sin in the x dtype
    c.packed = variant == 2;
    c.seed = seed++;
    cases.push_back(c);
  }
  for (int variant = 0; variant < 10; ++variant) {
    const dtype t = types[variant % 3];
    rope_case c = make("qknorm-form-" + std::to_string(variant), rope_style::neox, t, 128, 9);
    c.qk_norm = true;
    c.seed = seed++;
    if (variant == 0) c.name += "-gptj", c.style = rope_style::gptj;
    if (variant == 1) {
      c.name += "-gptj-split-half";
      c.style = rope_style::gptj, c.output_layout = rope_output_layout::split_half;
    }
    if (variant == 2) c.name += "-partial-r64", c.rotary_dim = 64;
    if (variant == 3) c.name += "-bshd-b2", c.layout = x_layout::bshd, c.batch = 2;
    if (variant == 4) c.name += "-q-only", c.k_heads = 0;
    if (variant >= 5) {
      c.name += "-backward";
      c.backward = true;
      c.q_heads = 4;
      c.k_heads = 2;
      c.tokens = 5;
      c.inplace = variant % 2 == 0;
      // heads past one group of four, the last group partial
      if (variant == 5) c.name += "-q9-k7", c.q_heads = 9, c.k_heads = 7;
      if (variant == 6) c.name += "-q10-k6", c.q_heads = 10, c.k_heads = 6;
      if (variant == 7) c.name += "-q13-k5", c.q_heads = 13, c.k_heads = 5;
      if (variant == 8) c.name += "-partial-r64-packed", c.rotary_dim = 64, c.packed = true;
      if (variant == 9)
        c.name += "-gptj-split-half", c.style = rope_style::gptj,
                                      c.output_layout = rope_output_layout::split_half;
    }
    cases.push_back(c);
  }
  {
    rope_case c = make("qknorm-eps-0.1-d64", rope_style::neox, dtype::f32, 64, 6);
    c.qk_norm = true;
    c.eps = 0.1;
    c.seed = seed++;
    cases.push_back(c);
  }
  // Interleaved RoPE: adjacent pairs in; split-half out (the NPU-compatible form, half-pair
  // tables) and interleaved out (positional tables), x [B, N, S, 64] as the source material
  for (auto out : {rope_output_layout::split_half, rope_output_layout::as_input}) {
    const std::string o = out == rope_output_layout::split_half ? "split" : "inter";
    for (dtype t : types) {
      for (int variant = 0; variant < 3; ++variant) {
        rope_case c = make(
            "interleave-" + o + "-" + std::string(to_string(t)) + "-v" + std::to_string(variant),
            rope_style::gptj, t, 64, 37);
        c.output_layout = out;
        c.layout = x_layout::bhsd;
        c.batch = 1;
        c.q_heads = 4;
        c.k_heads = variant == 2 ? 0 : 4;
        c.rows = variant == 0 ? std::string(to_string(t)) : "f32";
        c.random_rows = variant == 0;  // tables clamped to [-1, 1] as the source material's
        c.inplace = variant != 1;
        c.table = variant == 2 ? "none" : "f32";
        if (variant == 2) c.rows.clear();
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  for (int variant = 0; variant < 8; ++variant) {
    rope_case c = make("interleave-split-form-" + std::to_string(variant), rope_style::gptj,
                       types[variant % 3], 64, 13);
    c.output_layout = rope_output_layout::split_half;
    c.seed = seed++;
    if (variant < 3) c.name += "-backward", c.backward = true, c.inplace = variant != 1;
    if (variant == 3)
      c.name += "-backward-random-rows", c.backward = true, c.rows = "f32", c.random_rows = true;
    if (variant == 4) c.name += "-partial-d80-r48", c.head_dim = 80, c.rotary_dim = 48;
    if (variant == 5)
      c.name += "-packed-32x8-d128", c.head_dim = 128, c.q_heads = 32, c.k_heads = 8,
                                     c.packed = true;
    if (variant == 6)
      c.name += "-b4-n128-s2", c.layout = x_layout::bhsd, c.batch = 4, c.q_heads = 128,
                               c.k_heads = 0, c.tokens = 2;
    if (variant == 7) c.name += "-d6", c.head_dim = 6;
    cases.push_back(c);
  }
  rope_case empty = make("neox-empty-t0", rope_style::neox, dtype::f32, 64, 0);
  cases.push_back(empty);
  return cases;
}

void for_each_case_key(const nlohmann::json& j, std::string& name,
                       const std::function<bool(const std::string&, const nlohmann::json&)>& set) {
  if (!j.is_object()) throw error("a case must be a JSON object, got " + j.dump());
  name = j.value("name", std::string("unnamed"));
  for (const auto& [key, v] : j.items()) {
    if (key == "name") continue;
    try {
      if (!set(key, v)) throw error("unknown key");
    } catch (const nlohmann::json::exception&) {
      throw error("case '" + name + "': key '" + key + "' has a bad value " + v.dump());
    } catch (const error& e) {
      throw error("case '" + name + "': key '" + key + "': " + e.what());
    }
  }
}

nlohmann::json read_case_list(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw error("cannot open case file '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw error("case file '" + path + "' is not valid JSON: " + e.what());
  }
  if (j.is_object() && j.contains("cases")) j = j["cases"];
  if (!j.is_array())
    throw error("case file '" + path + "' must hold a list of cases or {\"cases\": [...]}");
  return j;
}

rope_case case_from_json(const nlohmann::json& j) {
  rope_case c;
  for_each_case_key(j, c.name, [&](const std::string& key, const nlohmann::json& v) {
    if (key == "style")
      c.style = rope_style_from_string(v.get<std::string>());
    else if (key == "dtype")
      c.x_type = dtype_from_string(v.get<std::string>());
    else if (key == "layout")
      c.layout = x_layout_from_string(v.get<std::string>());
    else if (key == "batch")
      c.batch = v.get<std::int64_t>();
    else if (key == "tokens")
      c.tokens = v.get<std::int64_t>();
    else if (key == "q_heads")
      c.q_heads = v.get<std::int64_t>();
    else if (key == "k_heads")
      c.k_heads = v.get<std::int64_t>();
    else if (key == "head_dim")
      c.head_dim = v.get<std::int64_t>();
    else if (key == "rotary_dim")
      c.rotary_dim = v.get<int>();
    else if (key == "packed")
      c.packed = v.get<bool>();
    else if (key == "inplace")
      c.inplace = v.get<bool>();
    else if (key == "backward")
      c.backward = v.get<bool>();
    else if (key == "positions")
      c.positions = v.get<std::string>();
    else if (key == "shared_positions")
      c.shared_positions = v.get<bool>();
    else if (key == "offset")
      c.offset = v.get<std::int64_t>();
    else if (key == "max_pos")
      c.max_pos = v.get<std::int64_t>();
    else if (key == "table")
      c.table = v.get<std::string>();
    else if (key == "precision")
      c.precision = angle_precision_from_string(v.get<std::string>());
    else if (key == "theta")
      c.theta = v.get<double>();
    else if (key == "seed")
      c.seed = v.get<std::uint64_t>();
    else if (key == "atol")
      c.atol = v.get<double>();
    else if (key == "rtol")
      c.rtol = v.get<double>();
    else if (key == "mrope_section")
      c.mrope_section = v.get<std::array<int, 3>>();
    else if (key == "mrope_layout")
      c.mrope = mrope_layout_from_string(v.get<std::string>());
    else if (key == "vision_2d")
      c.vision_2d = v.get<bool>();
    else if (key == "output_layout")
      c.output_layout = rope_output_layout_from_string(v.get<std::string>());
    else if (key == "rows")
      c.rows = v.get<std::string>();
    else if (key == "rows_half")
      c.rows_half = v.get<bool>();
    else if (key == "random_rows")
      c.random_rows = v.get<bool>();
    else if (key == "qk_norm")
      c.qk_norm = v.get<bool>();
    else if (key == "zero_weights")
      c.zero_weights = v.get<bool>();
    else if (key == "eps")
      c.eps = v.get<double>();
    else if (key == "norm_rounding")
      c.norm_rounding = qk_norm_rounding_from_string(v.get<std::string>());
    else
      return false;
    return true;
  });
  return c;
}

std::vector<rope_case> cases_from_file(const std::string& path) {
  std::vector<rope_case> cases;
  for (const auto& item : read_case_list(path)) cases.push_back(case_from_json(item));
  return cases;
}

}  // namespace tilerope::cli
