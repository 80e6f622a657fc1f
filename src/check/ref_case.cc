#include "check/ref_case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"

namespace tilerope::check {

namespace {
constexpr std::pair<ref_kernel, const char*> kernel_names[] = {
    {ref_kernel::skeleton, "skeleton"},
    {ref_kernel::vision, "vision"},
    {ref_kernel::mrope, "mrope"},
    {ref_kernel::qk_norm_rope, "qk-norm-rope"},
    {ref_kernel::interleave, "interleave"}};
}  // namespace

std::string_view to_string(ref_kernel k) {
  for (auto [kk, name] : kernel_names) {
    if (kk == k) return name;
  }
  return "?";
}

ref_kernel ref_kernel_from_string(std::string_view name) {
  for (auto [k, n] : kernel_names) {
    if (name == n) return k;
  }
  throw error("reference kernel '" + std::string(name) +
              "' is not one of skeleton, vision, mrope, qk-norm-rope, interleave");
}

std::vector<std::string> ref_kernel_names() {
  std::vector<std::string> v;
  for (auto [k, n] : kernel_names) v.emplace_back(n);
  return v;
}

std::string ref_variant_of(const ref_case& c) {
  std::string v = "ref-" + std::string(to_string(c.kernel));
  if (c.kernel == ref_kernel::interleave) {
    v += c.output == reference::interleave_output::split_half ? "-split" : "-inter";
    v += c.path == reference::interleave_path::deinterleave ? "/deint" : "/gmask";
  }
  return v;
}

namespace {

using rng_t = std::mt19937_64;

void fill_normal(tensor& t, rng_t& rng, double clamp = 0) {
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = normal(rng);
    if (clamp > 0) v = std::clamp(v, -clamp, clamp);
    store_from_f64(t.data(), t.type(), static_cast<std::size_t>(i), v);
  }
}

// Random rows whose two halves repeat, as real tables cat(freqs, freqs) do.
void fill_repeated_halves(tensor& t, rng_t& rng) {
  std::normal_distribution<double> normal;
  const std::int64_t D = t.shape().back(), half = D / 2;
  for (std::int64_t r = 0; r < t.numel() / D; ++r) {
    for (std::int64_t j = 0; j < half; ++j) {
      const double v = normal(rng);
      store_from_f64(t.data(), t.type(), static_cast<std::size_t>(r * D + j), v);
      store_from_f64(t.data(), t.type(), static_cast<std::size_t>(r * D + half + j), v);
    }
  }
}

std::vector<double> to_f64(const tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = load_as_f64(t.data(), t.type(), i);
  return v;
}

void compare(const tensor& got, const std::vector<double>& want, double atol, double rtol,
             double& max_abs, double& max_rel, bool& pass) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = load_as_f64(got.data(), got.type(), i);
    const double err = std::fabs(g - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) pass = false;  // NaN fails too
    if (std::isnan(err)) continue;
    max_abs = std::max(max_abs, err);
    max_rel = std::max(max_rel, err / std::max(std::fabs(want[i]), atol));
  }
}

// The first half of each table row, as a half-width [rows, D/2] table of the same dtype.
tensor half_table(const tensor& full) {
  const std::int64_t D = full.shape().back(), rows = full.numel() / D;
  tensor t(full.type(), {rows, D / 2});
  const std::size_t es = size_of(full.type());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<unsigned char*>(t.data()) + r * (D / 2) * es,
                static_cast<const unsigned char*>(full.data()) + r * D * es, (D / 2) * es);
  }
  return t;
}

// `name` followed by the dims in brackets: dims("q", {2, 4}) is "q[2,4]"
std::string dims(const char* name, std::initializer_list<std::int64_t> d) {
  std::string s = name;
  s += '[';
  for (auto v : d) {
    if (s.back() != '[') s += ',';
    s += std::to_string(v);
  }
  return s + "]";
}

}  // namespace

ref_result run_ref_case(const ref_case& c) {
  if (!is_floating(c.x_type)) throw error("case '" + c.name + "': dtype must be f32, f16 or bf16");
  if (c.batch < 1 || c.seq < 1 || c.heads < 1 || c.k_heads < 1 || c.head_dim < 2 ||
      c.head_dim % 2) {
    throw error("case '" + c.name + "': batch, seq, heads, k_heads must be >= 1, head_dim even");
  }
  const double elements = static_cast<double>(c.batch) * static_cast<double>(c.seq) *
                          static_cast<double>(c.heads + c.k_heads) *
                          static_cast<double>(c.head_dim);
  if (elements > 1e9) {
    char text[32];
    std::snprintf(text, sizeof text, "%.4g", elements);
    throw error("case '" + c.name + "': batch * seq * (heads + k_heads) * head_dim (" + text +
                ") must be <= 1e9");
  }
  rng_t rng(c.seed);
  ref_result r;
  const golden::tolerance tol = golden::tolerance_for(c.x_type);
  r.atol = c.atol.value_or(tol.atol);
  r.rtol = c.rtol.value_or(tol.rtol);
  r.pass = true;
  const std::int64_t B = c.batch, S = c.seq, N = c.heads, K = c.k_heads, D = c.head_dim;
  const dtype t = c.x_type;
  auto check = [&](const tensor& got, const std::vector<double>& want) {
    compare(got, want, r.atol, r.rtol, r.max_abs_err, r.max_rel_err, r.pass);
  };
  auto check_prod = [&](const tensor& got, const std::vector<double>& want) {
    double abs = 0, rel = 0;
    compare(got, want, r.atol, r.rtol, abs, rel, r.pass);
    r.prod_max_abs_err = std::max(r.prod_max_abs_err.value_or(0.0), abs);
  };

  switch (c.kernel) {
    case ref_kernel::skeleton: {
      tensor a(t, {B, S, D}), cos(t, {B, S, D}), sin(t, {B, S, D}), out(t, {B, S, D});
      fill_normal(a, rng);
      fill_repeated_halves(cos, rng);
      fill_repeated_halves(sin, rng);
      r.shape = dims("a", {B, S, D});
      r.report = reference::rope_skeleton(a, cos, sin, out, c.tiles);
      const auto x = to_f64(a), cv = to_f64(cos), sv = to_f64(sin);
      std::vector<const double*> cr, sr;
      for (std::int64_t i = 0; i < B * S; ++i)
        cr.push_back(cv.data() + i * D), sr.push_back(sv.data() + i * D);
      std::vector<double> want(x.size());
      golden::rope_full(B * S, D, x.data(), cr, sr, want.data());
      check(out, want);
      // production: x as [B, S, 1, D], one table row per (b, s)
      tensor prod(t, {B, S, D}), ids(dtype::i64, {B, S});
      for (std::int64_t i = 0; i < B * S; ++i) static_cast<std::int64_t*>(ids.data())[i] = i;
      const tensor hc = half_table(cos), hs = half_table(sin);
      rope_tensors xt;
      xt.q = tensor_view(a.data(), t, {B, S, 1, D}, {S * D, D, D, 1});
      xt.q_out = tensor_view(prod.data(), t, {B, S, 1, D}, {S * D, D, D, 1});
      rope_apply(rope_style::neox, xt, rope_positions::from_ids(ids),
                 rope_angles::from_table(hc, hs));
      check_prod(prod, want);
      break;
    }
    case ref_kernel::vision: {
      tensor q(t, {S, N, D}), k(t, {S, K, D}), cos(t, {S, D}), sin(t, {S, D});
      tensor qo(t, {S, N, D}), ko(t, {S, K, D});
      fill_normal(q, rng);
      fill_normal(k, rng);
      fill_repeated_halves(cos, rng);
      fill_repeated_halves(sin, rng);
      r.shape = dims("q", {S, N, D}) + dims(" k", {S, K, D});
      r.report = reference::vision_rope(q, k, cos, sin, qo, ko, c.tiles);
      const auto cv = to_f64(cos), sv = to_f64(sin);
      tensor qp(t, {S, N, D}), kp(t, {S, K, D});
      rope_tensors xt;
      xt.q = q;
      xt.k = k.view();
      xt.q_out = qp.view();
      xt.k_out = kp.view();
      const tensor hc = half_table(cos), hs = half_table(sin);
      rope_apply(rope_style::neox, xt, rope_positions::from_offset(0),
                 rope_angles::from_table(hc, hs));
      for (auto [in, out, prod, H] : {std::tuple{&q, &qo, &qp, N}, std::tuple{&k, &ko, &kp, K}}) {
        const auto x = to_f64(*in);
        std::vector<const double*> cr, sr;
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t h = 0; h < H; ++h)
            cr.push_back(cv.data() + s * D), sr.push_back(sv.data() + s * D);
        std::vector<double> want(x.size());
        golden::rope_full(S * H, D, x.data(), cr, sr, want.data());
        check(*out, want);
        check_prod(*prod, want);
      }
      break;
    }
    case ref_kernel::mrope: {
      tensor q(t, {B, N, S, D}), k(t, {B, K, S, D}), cos(t, {3, B, S, D}), sin(t, {3, B, S, D});
      tensor qo(t, {B, N, S, D}), ko(t, {B, K, S, D});
      fill_normal(q, rng);
      fill_normal(k, rng);
      fill_repeated_halves(cos, rng);
      fill_repeated_halves(sin, rng);
      r.shape = dims("q", {B, N, S, D}) + dims(" k", {B, K, S, D});
      r.report = reference::mrope(q, k, cos, sin, c.section, qo, ko, c.tiles);
      const auto cv = to_f64(cos), sv = to_f64(sin);
      const std::int64_t sec[3] = {c.section[0], c.section[1], c.section[2]};
      std::vector<double> ct(static_cast<std::size_t>(B * S * D)), st(ct.size());
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t s = 0; s < S; ++s) {
          const double* cp[3];
          const double* sp[3];
          for (int p = 0; p < 3; ++p) {
            cp[p] = cv.data() + ((p * B + b) * S + s) * D;
            sp[p] = sv.data() + ((p * B + b) * S + s) * D;
          }
          golden::mrope_row(sec, D, cp, ct.data() + (b * S + s) * D);
          golden::mrope_row(sec, D, sp, st.data() + (b * S + s) * D);
        }
      // production: q and k in one call, BHSD views, the [3, B, S, D] planes as given
      tensor qp(t, {B, N, S, D}), kp(t, {B, K, S, D});
      rope_tensors xt;
      xt.q = tensor_view(q.data(), t, {B, S, N, D}, {N * S * D, D, S * D, 1});
      xt.k = tensor_view(k.data(), t, {B, S, K, D}, {K * S * D, D, S * D, 1});
      xt.q_out = tensor_view(qp.data(), t, {B, S, N, D}, {N * S * D, D, S * D, 1});
      xt.k_out = tensor_view(kp.data(), t, {B, S, K, D}, {K * S * D, D, S * D, 1});
      rope_apply(
          rope_style::neox, xt,
          rope_angles::from_token_rows(cos, sin, mrope_axis_map(c.section, mrope_layout::chunked)));
      for (auto [in, out, prod, H] : {std::tuple{&q, &qo, &qp, N}, std::tuple{&k, &ko, &kp, K}}) {
        const auto x = to_f64(*in);
        std::vector<const double*> cr, sr;
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t s = 0; s < S; ++s)
              cr.push_back(ct.data() + (b * S + s) * D), sr.push_back(st.data() + (b * S + s) * D);
        std::vector<double> want(x.size());
        golden::rope_full(B * H * S, D, x.data(), cr, sr, want.data());
        check(*out, want);
        check_prod(*prod, want);
      }
      break;
    }
    case ref_kernel::qk_norm_rope: {
      tensor x(t, {S, N, D}), w(t, {D}), cos(t, {S, D}), sin(t, {S, D}), out(t, {S, N, D});
      fill_normal(x, rng);
      fill_normal(w, rng);
      fill_repeated_halves(cos, rng);
      fill_repeated_halves(sin, rng);
      r.shape = dims("x", {S, N, D});
      r.report = reference::qk_norm_rope(x, w, cos, sin, c.eps, out, c.tiles);
      const auto xv = to_f64(x), wv = to_f64(w), cv = to_f64(cos), sv = to_f64(sin);
      std::vector<double> h(xv.size()), want(xv.size());
      golden::rms_norm(S * N, D, xv.data(), wv.data(), c.eps, h.data());
      std::vector<const double*> cr, sr;
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t n = 0; n < N; ++n)
          cr.push_back(cv.data() + s * D), sr.push_back(sv.data() + s * D);
      golden::rope_full(S * N, D, h.data(), cr, sr, want.data());
      check(out, want);
      // production: the fused kernel with the same [S, D] rows
      tensor prod(t, {S, N, D});
      rope_tensors xt;
      xt.q = x;
      xt.q_out = prod.view();
      qk_norm norm;
      norm.q_weight = w;
      norm.eps = c.eps;
      qk_norm_rope_apply(rope_style::neox, xt, rope_positions::none(),
                         rope_angles::from_token_rows(cos, sin), norm);
      check_prod(prod, want);
      break;
    }
    case ref_kernel::interleave: {
      const std::int64_t TS = c.table_seq1 ? 1 : S;
      tensor x(t, {B, N, S, D}), cos(t, {B, 1, TS, D}), sin(t, {B, 1, TS, D}), out(t, {B, N, S, D});
      fill_normal(x, rng);
      fill_normal(cos, rng, 1.0);
      fill_normal(sin, rng, 1.0);
      r.shape = dims("x", {B, N, S, D}) + dims(" cos", {B, 1, TS, D});
      r.report = reference::interleave_rope(x, cos, sin, c.output, c.path, out, c.tiles);
      const auto xv = to_f64(x), cv = to_f64(cos), sv = to_f64(sin);
      std::vector<const double*> cr, sr;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t s = 0; s < S; ++s) {
            const std::int64_t row = b * TS + (c.table_seq1 ? 0 : s);
            cr.push_back(cv.data() + row * D);
            sr.push_back(sv.data() + row * D);
          }
      std::vector<double> want(xv.size());
      const bool split = c.output == reference::interleave_output::split_half;
      golden::interleave_rope(B * N * S, D, split, xv.data(), cr, sr, want.data());
      check(out, want);
      // production: x [B, N, S, D] as BHSD, the tables as rows [B, S, D] (stride 0 over S for
      // a single row)
      tensor prod(t, {B, N, S, D});
      rope_tensors xt;
      xt.q = tensor_view(x.data(), t, {B, S, N, D}, {N * S * D, D, S * D, 1});
      xt.q_out = tensor_view(prod.data(), t, {B, S, N, D}, {N * S * D, D, S * D, 1});
      const std::int64_t row_stride = c.table_seq1 ? 0 : D;
      rope_options o;
      o.output_layout = split ? rope_output_layout::split_half : rope_output_layout::as_input;
      rope_apply(rope_style::gptj, xt,
                 rope_angles::from_token_rows(
                     tensor_view(cos.data(), t, {B, S, D}, {TS * D, row_stride, 1}),
                     tensor_view(sin.data(), t, {B, S, D}, {TS * D, row_stride, 1})),
                 o);
      check_prod(prod, want);
      break;
    }
  }
  return r;
}

}  // namespace tilerope::check
