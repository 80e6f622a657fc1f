#include "check/case_angles.h"

#include <algorithm>
#include <cmath>

namespace tilerope::check {

namespace {

// What the stages below derive from a case.
struct case_dims {
  bool rank4 = false;
  std::int64_t B = 1, S = 0, D = 0;
  int rotary = 0;
  std::int64_t half_dim = 0;
  bool multi_axis = false;  // several positions per token: MRoPE (3 axes), vision (2)
  std::int64_t n_axes = 3;
  int section[3] = {0, 0, 0};
  // how a full row's columns pair up: by the output layout (halves unless plain gptj)
  bool adjacent_table = false;
};

case_dims dims_of(const rope_case& c) {
  case_dims d;
  d.rank4 = c.layout != x_layout::thd;
  d.B = d.rank4 ? c.batch : 1, d.S = c.tokens, d.D = c.head_dim;
  d.rotary = c.rotary_dim ? c.rotary_dim : static_cast<int>(d.D);
  d.half_dim = d.rotary / 2;
  d.multi_axis = c.mrope_section.has_value() || c.vision_2d;
  d.n_axes = c.vision_2d ? 2 : 3;
  for (int a = 0; a < 3; ++a) d.section[a] = c.mrope_section ? (*c.mrope_section)[a] : 0;
  d.adjacent_table = c.style == rope_style::gptj && c.output_layout == rope_output_layout::as_input;
  return d;
}

std::int64_t freq_of_column(const case_dims& d, std::int64_t j) {
  return d.adjacent_table ? j / 2 : j % d.half_dim;
}

// The axis frequency i reads its position from, by the golden's own maps.
int golden_axis(const rope_case& c, const case_dims& d, std::int64_t i) {
  return c.vision_2d ? golden::vision_2d_frequency(d.D, c.theta, i).first
                     : golden::mrope_axis(d.section, c.mrope == mrope_layout::interleaved,
                                          static_cast<int>(i));
}

struct drawn_positions {
  std::vector<std::int64_t> per_token;  // (b, s)
  std::vector<std::int64_t> per_axis;   // [A, T]: MRoPE and vision
};

drawn_positions draw_positions(const rope_case& c, const case_dims& d, std::mt19937_64& rng) {
  const std::int64_t B = d.B, S = d.S;
  drawn_positions p;
  auto& pos = p.per_token;
  pos.resize(static_cast<std::size_t>(B * S));
  std::uniform_int_distribution<std::int64_t> uniform(0, c.max_pos - 1);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      auto& at = pos[static_cast<std::size_t>(b * S + s)];
      if (c.positions == "offset") {
        at = c.offset + s;
      } else if (b > 0 && (c.shared_positions || !d.rank4)) {
        at = pos[static_cast<std::size_t>(s)];
      } else {
        at = uniform(rng);
      }
    }
  }
  if (d.multi_axis) {
    for (std::int64_t i = 0; i < d.n_axes * S; ++i) {
      p.per_axis.push_back(c.positions == "offset" ? c.offset + i % S + (i / S) * 7 : uniform(rng));
    }
  }
  return p;
}

// The position frequency i of token t rotates by.
std::int64_t position_at(const rope_case& c, const case_dims& d, const drawn_positions& p,
                         std::int64_t t, std::int64_t i) {
  if (!d.multi_axis) return p.per_token[static_cast<std::size_t>(t)];
  return p.per_axis[static_cast<std::size_t>(golden_axis(c, d, i) * d.S + t)];
}

// The ids the kernel reads for the drawn positions, and its rope_positions of them.
void set_kernel_positions(const rope_case& c, const case_dims& d, const drawn_positions& p,
                          case_angles& out) {
  const bool one_row = !d.rank4 || c.shared_positions;
  const dtype id_type = c.positions == "i32" ? dtype::i32 : dtype::i64;
  out.ids = tensor(id_type,
                   one_row ? std::vector<std::int64_t>{d.S} : std::vector<std::int64_t>{d.B, d.S});
  for (std::int64_t i = 0; i < out.ids.numel(); ++i) {
    store_from_f64(out.ids.data(), id_type, static_cast<std::size_t>(i),
                   static_cast<double>(p.per_token[static_cast<std::size_t>(i)]));
  }
  out.positions = c.positions == "offset" ? rope_positions::from_offset(c.offset)
                                          : rope_positions::from_ids(out.ids);
  if (!d.multi_axis) return;
  // per frequency the axis it reads; the golden has its own maps and frequencies
  out.axis_ids = tensor(id_type, {d.n_axes, d.S});
  for (std::int64_t i = 0; i < d.n_axes * d.S; ++i) {
    store_from_f64(out.axis_ids.data(), id_type, static_cast<std::size_t>(i),
                   static_cast<double>(p.per_axis[static_cast<std::size_t>(i)]));
  }
  if (c.vision_2d) {
    out.vision = qwen2vl_vision_frequencies(static_cast<int>(d.D), c.theta);
    out.positions = rope_positions::from_axes(out.axis_ids, out.vision.axis_of_frequency);
  } else {
    out.positions =
        rope_positions::from_axes(out.axis_ids, mrope_axis_map(*c.mrope_section, c.mrope));
  }
}

// The golden's cos and sin per token and frequency (half width).
struct half_rows {
  std::vector<double> cos, sin;
};

// The kernel's angles: per-token rows (drawn with `rng` when random), a table, or computed
// from theta. For every source but rows, also the golden's half-width cos and sin.
half_rows set_kernel_angles(const rope_case& c, const case_dims& d, const drawn_positions& p,
                            std::mt19937_64& rng, case_angles& out) {
  const std::int64_t B = d.B, S = d.S, D = d.D, half_dim = d.half_dim;
  const int rotary = d.rotary;
  const auto& pos = p.per_token;
  std::int64_t largest = pos.empty() ? 0 : *std::max_element(pos.begin(), pos.end());
  for (std::int64_t at : p.per_axis) largest = std::max(largest, at);
  half_rows g;
  // the golden's own inverse frequencies, and the angle of frequency i at position p
  std::vector<double> ginv = golden::inv_freq(rotary, c.theta);
  if (c.vision_2d) {
    for (std::int64_t i = 0; i < half_dim; ++i)
      ginv[static_cast<std::size_t>(i)] = golden::vision_2d_frequency(D, c.theta, i).second;
  }
  if (!c.rows.empty()) {
    // [T, w], [B, S, w] or [S, w] (shared), or planes [A, T, w]
    const std::int64_t w = c.rows_half ? half_dim : rotary;
    std::vector<std::int64_t> shape;
    if (d.multi_axis) shape.push_back(d.n_axes);
    if (d.rank4 && !c.shared_positions) shape.push_back(B);
    shape.push_back(S);
    shape.push_back(w);
    const dtype rt = dtype_from_string(c.rows);
    out.row_cos = tensor(rt, shape);
    out.row_sin = tensor(rt, shape);
    const std::int64_t planes = d.multi_axis ? d.n_axes : 1;
    const std::int64_t per_plane = out.row_cos.numel() / planes;
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (std::int64_t a = 0; a < planes; ++a) {
      for (std::int64_t e = 0; e < per_plane; ++e) {
        const std::int64_t token = e / w, col = e % w;
        const std::int64_t position = d.multi_axis
                                          ? p.per_axis[static_cast<std::size_t>(a * S + token)]
                                          : pos[static_cast<std::size_t>(token)];
        const std::int64_t i = c.rows_half ? col : freq_of_column(d, col);
        const double angle = static_cast<double>(position) * ginv[static_cast<std::size_t>(i)];
        const auto at = static_cast<std::size_t>(a * per_plane + e);
        store_from_f64(out.row_cos.data(), rt, at, c.random_rows ? u(rng) : std::cos(angle));
        store_from_f64(out.row_sin.data(), rt, at, c.random_rows ? u(rng) : std::sin(angle));
      }
    }
    if (d.multi_axis) {
      out.angles = rope_angles::from_token_rows(
          out.row_cos, out.row_sin,
          c.vision_2d ? out.vision.axis_of_frequency : mrope_axis_map(*c.mrope_section, c.mrope));
    } else {
      out.angles = rope_angles::from_token_rows(out.row_cos, out.row_sin);
    }
    out.positions = rope_positions::none();
  } else if (c.table != "none") {
    out.table = c.vision_2d ? make_rope_table(std::max(c.max_pos, largest + 1), out.vision.inv_freq,
                                              dtype_from_string(c.table))
                            : make_rope_table(std::max(c.max_pos, largest + 1), rotary, c.theta,
                                              dtype_from_string(c.table), c.precision);
    const rope_table& table = out.table;
    out.angles = rope_angles::from_table(table.cos, table.sin);
    for (std::int64_t t = 0; t < B * S; ++t) {
      for (std::int64_t i = 0; i < half_dim; ++i) {
        const auto at = static_cast<std::size_t>(position_at(c, d, p, t, i) * half_dim + i);
        g.cos.push_back(load_as_f64(table.cos.data(), table.cos.type(), at));
        g.sin.push_back(load_as_f64(table.sin.data(), table.sin.type(), at));
      }
    }
  } else if (!d.multi_axis) {
    out.angles = rope_angles::from_theta(c.theta, c.precision);
    if (c.precision == angle_precision::accurate) {
      golden::angles(ginv, pos, g.cos, g.sin);
    } else {
      golden::angles_hf(rotary, c.theta, pos, c.x_type, g.cos, g.sin);
    }
  } else {  // per frequency, each at the position of its axis
    out.angles = c.vision_2d ? rope_angles::from_inv_freq(out.vision.inv_freq, c.precision)
                             : rope_angles::from_theta(c.theta, c.precision);
    for (std::int64_t t = 0; t < S; ++t) {
      for (std::int64_t i = 0; i < half_dim; ++i) {
        const auto ui = static_cast<std::size_t>(i);
        std::vector<double> cs, sn;
        if (c.precision == angle_precision::accurate) {
          golden::angles({ginv[ui]}, {position_at(c, d, p, t, i)}, cs, sn);
          g.cos.push_back(cs[0]);
          g.sin.push_back(sn[0]);
        } else {
          golden::angles_hf(rotary, c.theta, {position_at(c, d, p, t, i)}, c.x_type, cs, sn);
          g.cos.push_back(cs[ui]);
          g.sin.push_back(sn[ui]);
        }
      }
    }
  }
  return g;
}

// Full-width golden rows per token (rotary entries): half-width values spread over the
// columns of each pair, or the rows as the kernel reads them (plane of each column's
// frequency; chunked MRoPE as the source material builds it from chunks of section * 2).
void set_golden_rows(const rope_case& c, const case_dims& d, const half_rows& g, case_angles& out) {
  const std::int64_t S = d.S, half_dim = d.half_dim;
  const int rotary = d.rotary;
  const tensor &row_cos = out.row_cos, &row_sin = out.row_sin;
  const std::int64_t tokens = d.B * S;
  out.golden_cos.assign(static_cast<std::size_t>(tokens * rotary), 0.0);
  out.golden_sin.assign(out.golden_cos.size(), 0.0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    double* fc = out.golden_cos.data() + t * rotary;
    double* fs = out.golden_sin.data() + t * rotary;
    if (c.rows.empty()) {
      for (std::int64_t j = 0; j < rotary; ++j) {
        const auto at = static_cast<std::size_t>(t * half_dim + freq_of_column(d, j));
        fc[j] = g.cos[at];
        fs[j] = g.sin[at];
      }
      continue;
    }
    const std::int64_t w = c.rows_half ? half_dim : rotary;
    const std::int64_t token_row = d.rank4 && c.shared_positions ? t % S : t;
    const std::int64_t per_plane = row_cos.numel() / (d.multi_axis ? d.n_axes : 1);
    auto value = [&](const tensor& tab, std::int64_t plane, std::int64_t col) {
      const auto at = static_cast<std::size_t>(plane * per_plane + token_row * w + col);
      return load_as_f64(tab.data(), tab.type(), at);
    };
    if (d.multi_axis && !c.vision_2d && c.mrope == mrope_layout::chunked && !d.adjacent_table &&
        !c.rows_half) {
      std::vector<double> planes_c(static_cast<std::size_t>(3 * rotary)), planes_s(planes_c.size());
      for (std::int64_t a = 0; a < 3; ++a) {
        for (std::int64_t j = 0; j < rotary; ++j) {
          planes_c[static_cast<std::size_t>(a * rotary + j)] = value(row_cos, a, j);
          planes_s[static_cast<std::size_t>(a * rotary + j)] = value(row_sin, a, j);
        }
      }
      const std::int64_t sec64[3] = {d.section[0], d.section[1], d.section[2]};
      const double* pc[3] = {&planes_c[0], &planes_c[rotary], &planes_c[2 * rotary]};
      const double* ps[3] = {&planes_s[0], &planes_s[rotary], &planes_s[2 * rotary]};
      golden::mrope_row(sec64, rotary, pc, fc);
      golden::mrope_row(sec64, rotary, ps, fs);
      continue;
    }
    for (std::int64_t j = 0; j < rotary; ++j) {
      const std::int64_t i = freq_of_column(d, j);
      const std::int64_t plane = d.multi_axis ? golden_axis(c, d, i) : 0;
      const std::int64_t col = c.rows_half ? i : j;
      fc[j] = value(row_cos, plane, col);
      fs[j] = value(row_sin, plane, col);
    }
  }
}

}  // namespace

case_angles make_case_angles(const rope_case& c, std::mt19937_64& rng) {
  const case_dims d = dims_of(c);
  const drawn_positions p = draw_positions(c, d, rng);
  case_angles out;
  set_kernel_positions(c, d, p, out);
  const half_rows g = set_kernel_angles(c, d, p, rng, out);
  set_golden_rows(c, d, g, out);
  out.golden_variant = c.style == rope_style::neox ? golden::variant::neox
                       : d.adjacent_table          ? golden::variant::gptj
                                                   : golden::variant::gptj_split_half;
  return out;
}

}  // namespace tilerope::check
