#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "check/case_angles.h"
#include "check/case_tensors.h"
#include "check/rope_case.h"
#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"

namespace tilerope::check {

namespace {

// Adds the errors of `got` against `want` to r; what names the tensor when one is NaN.
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

std::string approx(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", v);
  return text;
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
  // the case's own tables and golden need whole pairs; the API's rejection of others is tested
  // in tests/test_validation.cc
  const std::int64_t rotary = c.rotary_dim ? c.rotary_dim : c.head_dim;
  if (rotary < 2 || rotary % 2 || rotary > c.head_dim) {
    bad("rotary_dim (" + std::to_string(rotary) + ") must be even, >= 2 and <= head_dim (" +
        std::to_string(c.head_dim) + ")");
  }
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
  // Sizes in fp64: the fields are bounded by the loader, their products are not.
  const double elements = static_cast<double>(c.batch) * static_cast<double>(c.tokens) *
                          static_cast<double>(c.q_heads + 2 * c.k_heads) *
                          static_cast<double>(c.head_dim);
  if (elements > 1e9) {
    bad("batch * tokens * (q_heads + 2 k_heads) * head_dim (" + approx(elements) +
        ") must be <= 1e9");
  }
  // positions "offset" reach offset + tokens (+ 14 on the MRoPE axes); a table holds them all
  const double last_position = static_cast<double>(c.offset) + static_cast<double>(c.tokens) + 14;
  const double table_rows = std::max(static_cast<double>(c.max_pos), last_position);
  if (c.table != "none" && c.rows.empty() && table_rows * static_cast<double>(c.head_dim) > 1e9) {
    bad("a cos/sin table of " + approx(table_rows) + " positions * head_dim " +
        std::to_string(c.head_dim) + " must be <= 1e9 values (max_pos " +
        std::to_string(c.max_pos) + ", offset " + std::to_string(c.offset) + ")");
  }
}

// QK RMSNorm of a case: weights [D] of the x dtype drawn around 1; for the backward, the
// forward's inputs in buffers of their own (q and k of case_tensors are then dy) and the
// float32 [D] weight gradients the kernel writes.
struct case_norm {
  tensor q_weight, k_weight;
  std::vector<double> golden_weights[2];  // q, k as fp64
  qk_norm norm;
  std::vector<x_buffer> forward_in;
  tensor_view q_x, k_x;
  tensor dq_weight, dk_weight;
};

// Draws the weights, then the forward's inputs, with `rng`, after the case's angles.
case_norm make_case_norm(const rope_case& c, const case_tensors& x, std::mt19937_64& rng) {
  const std::int64_t D = c.head_dim;
  case_norm n;
  if (c.qk_norm) {
    std::normal_distribution<double> around_one(1.0, 0.25);
    n.q_weight = tensor(c.x_type, {D});
    n.k_weight = tensor(c.x_type, {D});
    for (tensor* w : {&n.q_weight, &n.k_weight}) {
      for (std::int64_t j = 0; j < D; ++j) {
        const double value = around_one(rng);
        store_from_f64(w->data(), c.x_type, static_cast<std::size_t>(j),
                       c.zero_weights && j % 3 == 0 ? 0.0 : value);
      }
    }
    for (int which = 0; which < 2; ++which) {
      const tensor& w = which ? n.k_weight : n.q_weight;
      for (std::int64_t j = 0; j < D; ++j) {
        n.golden_weights[which].push_back(
            load_as_f64(w.data(), w.type(), static_cast<std::size_t>(j)));
      }
    }
  }
  n.norm.q_weight = n.q_weight;
  if (c.k_heads) n.norm.k_weight = n.k_weight.view();
  n.norm.eps = c.eps;
  n.norm.rounding = c.norm_rounding;

  n.dq_weight = tensor(dtype::f32, {D});
  n.dk_weight = tensor(dtype::f32, {D});
  if (c.qk_norm && c.backward) {
    for (const auto& b : x.in) n.forward_in.push_back(make_buffer(c, b.total_heads));
    for (auto& b : n.forward_in) fill_normal(b, c.x_type, rng);
    n.q_x = head_view(c, n.forward_in[0], 0, c.q_heads);
    if (c.k_heads) {
      n.k_x = c.packed ? head_view(c, n.forward_in[0], c.q_heads, c.k_heads)
                       : head_view(c, n.forward_in[1], 0, c.k_heads);
    }
  }
  return n;
}

// The production call: rope_apply, qk_norm_rope_apply or qk_norm_rope_backward.
void run_production(const rope_case& c, const case_tensors& t, const case_angles& a,
                    const case_norm& n) {
  rope_tensors x;
  x.q = t.q;
  if (c.k_heads) x.k = t.k;
  if (!c.inplace) {
    x.q_out = t.q_out;
    if (c.k_heads) x.k_out = t.k_out;
  }
  rope_options options;
  options.rotary_dim = c.rotary_dim;
  options.output_layout = c.output_layout;
  if (c.qk_norm && c.backward) {
    qk_norm_rope_grad_tensors g;
    g.q = n.q_x;
    g.dq_out = t.q;
    g.dq_weight = n.dq_weight;
    if (!c.inplace) g.dq = t.q_out;
    if (c.k_heads) {
      g.k = n.k_x;
      g.dk_out = t.k;
      g.dk_weight = n.dk_weight.view();
      if (!c.inplace) g.dk = t.k_out;
    }
    qk_norm_rope_backward(c.style, g, a.positions, a.angles, n.norm, options);
  } else if (c.qk_norm) {
    qk_norm_rope_apply(c.style, x, a.positions, a.angles, n.norm, options);
  } else {
    options.backward = c.backward;
    rope_apply(c.style, x, a.positions, a.angles, options);
  }
}

// The golden of q (which = 0) or k (which = 1), compared with what the kernel wrote.
void compare_with_golden(const rope_case& c, const case_tensors& t, const case_angles& a,
                         const case_norm& n, int which, case_result& r) {
  const std::int64_t D = c.head_dim;
  const std::int64_t tokens = (c.layout != x_layout::thd ? c.batch : 1) * c.tokens;
  const int rotary = c.rotary_dim ? c.rotary_dim : static_cast<int>(D);
  const golden::variant gvariant = a.golden_variant;
  const bool norm_backward = c.qk_norm && c.backward;
  const tensor_view& xin = which == 0 ? t.q : t.k;
  const tensor_view& xout = which == 0 ? t.q_out : t.k_out;
  const std::size_t in_buf = (which == 1 && !c.packed) ? 1 : 0;
  const std::vector<double> x0 = gather(c, xin, t.in[in_buf].data.data(), t.before[in_buf].data());
  const std::int64_t heads = xin.shape[xin.rank - 2];
  const double* w = c.qk_norm ? n.golden_weights[which].data() : nullptr;
  std::vector<double> want(x0.size());
  std::vector<double> want_dw(static_cast<std::size_t>(D), 0.0);
  std::vector<double> xf;  // qk-norm backward: the forward's input
  if (norm_backward) {
    const tensor_view& xv = which == 0 ? n.q_x : n.k_x;
    xf = gather(c, xv, n.forward_in[in_buf].data.data(), n.forward_in[in_buf].data.data());
  }
  for (std::int64_t tok = 0; tok < tokens; ++tok) {
    const double* fc = a.golden_cos.data() + tok * rotary;
    const double* fs = a.golden_sin.data() + tok * rotary;
    // the forward of one row, fp64 (fp32_once: the exact result the kernel rounds once)
    auto forward = [&](const double* xr, double* yr) {
      if (!c.qk_norm) return golden::rotate_row(gvariant, D, rotary, fc, fs, xr, yr);
      std::vector<double> h(static_cast<std::size_t>(D));
      golden::rms_norm(1, D, xr, w, c.eps, h.data());
      golden::rotate_row(gvariant, D, rotary, fc, fs, h.data(), yr);
    };
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t at = (tok * heads + h) * D;
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
        std::vector<double> hn(static_cast<std::size_t>(D)), ones(static_cast<std::size_t>(D), 1.0);
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
  const auto& ob = c.inplace ? t.in[in_buf] : t.out[in_buf];
  compare(gather(c, xout, ob.data.data(), ob.data.data()), want, r, which == 0 ? "q" : "k");
  if (!norm_backward) return;
  // dw sums over every row: compared per row (divided by their count) at fp32's tolerance
  const tensor& dw = which == 0 ? n.dq_weight : n.dk_weight;
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

// What must not change: the inputs when out of place, v of a packed buffer always.
void check_untouched(const rope_case& c, const case_tensors& t, case_result& r) {
  for (std::size_t i = 0; i < t.in.size() && !c.inplace; ++i) {
    if (t.in[i].data != t.before[i]) r.pass = false, r.problem = "an input changed out of place";
  }
  if (!c.packed) return;
  x_buffer written = c.inplace ? t.in[0] : t.out[0];
  x_buffer v_copy = t.in[0];
  v_copy.data = t.before[0];
  const tensor_view v_now = head_view(c, written, c.q_heads + c.k_heads, c.k_heads);
  const tensor_view v_was = head_view(c, v_copy, c.q_heads + c.k_heads, c.k_heads);
  const auto a = gather(c, v_now, written.data.data(), written.data.data());
  const auto b = gather(c, v_was, v_copy.data.data(), v_copy.data.data());
  const bool v_same =
      c.inplace ? a == b : std::all_of(a.begin(), a.end(), [](double d) { return std::isnan(d); });
  if (!v_same) r.pass = false, r.problem = "v (not an operand) was written";
}

}  // namespace

case_result run_case(const rope_case& c) {
  check_case_fields(c);
  // One stream, drawn in this order: x, positions (and random rows), norm weights, the
  // backward's forward inputs.
  std::mt19937_64 rng(c.seed);
  const case_tensors t = make_case_tensors(c, rng);
  const case_angles a = make_case_angles(c, rng);
  const case_norm n = make_case_norm(c, t, rng);
  run_production(c, t, a, n);

  case_result r;
  const golden::tolerance tol = golden::tolerance_for(c.x_type);
  r.atol = c.atol.value_or(tol.atol);
  r.rtol = c.rtol.value_or(tol.rtol);
  r.pass = true;
  for (int which = 0; which < (c.k_heads ? 2 : 1); ++which)
    compare_with_golden(c, t, a, n, which, r);
  check_untouched(c, t, r);
  return r;
}

}  // namespace tilerope::check
