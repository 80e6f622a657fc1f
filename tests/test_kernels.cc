// The production kernels against the fp64 golden, on the SIMD target that TILEROPE_CPU_TARGET
// forces (ctest runs this binary once per target). Exit code 77 (skipped) when this CPU
// cannot run the forced target.

#include <gtest/gtest.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "check/builtin_cases.h"
#include "check/rope_case.h"
#include "cpu/cpu_plan.h"
#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/freqs.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"
#include "tilerope/runtime.h"

namespace {

using namespace tilerope;
using check::rope_case;

std::string describe(const rope_case& c, const check::case_result& r) {
  return c.name + " " + check::variant_of(c) + " " + std::string(to_string(c.x_type)) + " " +
         check::shape_of(c) + " max_abs " + std::to_string(r.max_abs_err) + " " + r.problem;
}

// Every element of the tensors drawn from N(0, 1), rounded to its dtype; RMSNorm weights (f32)
// drawn around 1: 1 + N(0, 1/16).
void fill_normal(std::initializer_list<tensor*> tensors, std::mt19937& rng) {
  std::normal_distribution<double> normal;
  for (tensor* t : tensors) {
    for (std::int64_t i = 0; i < t->numel(); ++i)
      store_from_f64(t->data(), t->type(), i, normal(rng));
  }
}
void fill_weights(std::initializer_list<tensor*> weights, std::mt19937& rng) {
  std::normal_distribution<double> normal;
  for (tensor* w : weights) {
    for (std::int64_t j = 0; j < w->numel(); ++j)
      store_from_f64(w->data(), dtype::f32, j, 1 + normal(rng) / 4);
  }
}

TEST(Kernels, RunOnTheForcedTarget) {
  const char* forced = std::getenv("TILEROPE_CPU_TARGET");
  if (forced && *forced && std::string(forced) != "best") EXPECT_EQ(cpu_target(), forced);
}

TEST(Kernels, BuiltinCasesMatchGolden) {
  for (const auto& c : check::builtin_cases()) {
    const auto r = check::run_case(c);
    EXPECT_TRUE(r.pass) << describe(c, r);
  }
}

// Software prefetch asks for lines and changes no result. Calls of 2^18 elements or more
// prefetch (smaller ones run from cache without): cases of 300 tokens of 12 + 4 heads, each
// kernel family and dtype, with it off, at one line and at the Intel default distance, pass
// against the golden with the same errors.
TEST(Kernels, PrefetchDistanceDoesNotChangeResults) {
  std::vector<rope_case> cases;
  for (int v = 0; v < 8; ++v) {
    rope_case c;
    c.name = "prefetch";
    c.tokens = 300;
    c.q_heads = 12;
    c.k_heads = 4;
    c.head_dim = v == 5 ? 80 : 128;
    c.x_type = v % 3 == 0 ? dtype::bf16 : v % 3 == 1 ? dtype::f32 : dtype::f16;
    c.style = v == 1 || v == 2 ? rope_style::gptj : rope_style::neox;
    c.inplace = v != 1 && v != 6;
    c.output_layout = v == 2 ? rope_output_layout::split_half : rope_output_layout::as_input;
    c.qk_norm = v == 3 || v == 4 || v == 6;
    c.backward = v == 4 || v == 6 || v == 7;
    c.vision_2d = v == 5;
    if (v == 7) c.mrope_section = std::array<int, 3>{16, 24, 24};
    c.seed = 1300 + v;
    cases.push_back(c);
  }
  const std::int64_t before = prefetch_bytes();
  set_prefetch_bytes(0);
  std::vector<check::case_result> off;
  for (const auto& c : cases) off.push_back(check::run_case(c));
  for (const std::int64_t ahead : {64, 2048}) {
    set_prefetch_bytes(ahead);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto r = check::run_case(cases[i]);
      EXPECT_TRUE(r.pass) << describe(cases[i], r) << " prefetch " << ahead;
      EXPECT_EQ(r.max_abs_err, off[i].max_abs_err) << describe(cases[i], r) << " " << ahead;
      EXPECT_EQ(r.max_rel_err, off[i].max_rel_err) << describe(cases[i], r) << " " << ahead;
    }
  }
  set_prefetch_bytes(before);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(off[i].pass) << describe(cases[i], off[i]) << " prefetch off";
  }
}

// Head dims with tails of every length on every vector width, rows of an odd number of whole
// vectors whose pairs' halves end mid-vector (taken in output order: 12 and 20 with 4 lanes,
// 24 and 40 with 8, 48, 80 and 112 with 16), odd head_dim with partial
// rotary (96 with 80: r/2 = 40 with 16 dims passed through), packed and separate buffers, in
// place and out of place, each dtype and style.
TEST(Kernels, SweepMatchesGolden) {
  std::uint64_t seed = 7;
  int n = 0;
  for (auto style : {rope_style::neox, rope_style::gptj}) {
    for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
      for (auto [d, r] : std::vector<std::pair<int, int>>{
               {2, 2},     {6, 6},     {7, 6},    {8, 8},   {14, 14},   {34, 34},
               {36, 16},   {62, 62},   {64, 32},  {80, 80}, {96, 96},   {12, 12},
               {20, 20},   {24, 24},   {40, 40},  {48, 48}, {112, 112}, {128, 128},
               {130, 128}, {256, 256}, {256, 64}, {96, 80}}) {
        for (int variant = 0; variant < 4; ++variant) {
          rope_case c;
          c.name = "sweep";
          c.style = style;
          c.x_type = t;
          c.head_dim = d;
          c.rotary_dim = r;
          c.tokens = 1 + (variant * 5 + d) % 9;
          c.q_heads = 1 + variant;
          c.k_heads = variant % 3;
          c.packed = c.k_heads > 0 && variant % 2 == 1;
          c.inplace = variant < 2;
          c.backward = variant == 3;
          c.positions = variant == 2 ? "i32" : "i64";
          c.seed = seed++;
          const auto res = check::run_case(c);
          EXPECT_TRUE(res.pass) << describe(c, res) << " d=" << d << " r=" << r << " v=" << variant;
          ++n;
        }
      }
    }
  }
  EXPECT_EQ(n, 2 * 3 * 22 * 4);
}

// bf16 halves of r/2 = 40 (head dim 80; with AVX512-BF16 one lane-pair step and a tail of 8
// pairs of each half joined in one vector), all dims rotated or 16 passed through, from a
// table, from full-width rows whose halves differ (four angle vectors a step) and from Qwen2-VL
// vision's 2D positions, forward and backward, in place and not, q alone or with k.
TEST(Kernels, Bf16HalvesOfHeadDim80MatchGolden) {
  std::uint64_t seed = 1300;
  int n = 0;
  for (int angles = 0; angles < 3; ++angles) {  // table, random full rows, vision 2D
    for (auto [d, r] : std::vector<std::pair<int, int>>{{80, 80}, {96, 80}}) {
      if (angles == 2 && d != r) continue;
      for (int variant = 0; variant < 4; ++variant) {
        rope_case c;
        c.name = "bf16-d80";
        c.x_type = dtype::bf16;
        c.head_dim = d;
        c.rotary_dim = r;
        c.tokens = 3 + variant;
        c.q_heads = 1 + variant;
        c.k_heads = variant % 3;
        c.inplace = variant % 2 == 0;
        c.backward = variant >= 2;
        if (angles == 1) {
          c.rows = "f32";
          c.random_rows = true;
        }
        c.vision_2d = angles == 2;
        c.seed = seed++;
        const auto res = check::run_case(c);
        EXPECT_TRUE(res.pass) << describe(c, res) << " d=" << d << " r=" << r << " v=" << variant
                              << " angles " << angles;
        ++n;
      }
    }
  }
  EXPECT_EQ(n, 5 * 4);
}

// QK RMSNorm + RoPE over head dims whose half is shorter than a vector on some targets (the
// fp32 row path), leaves an overlapping last vector, or is 1, 2 or 4 whole AVX-512 vectors
// (f32: the weights folded into angles held in registers), with partial rotary, both roundings,
// split-half output (in place and not) and the backward.
// Each case runs with QK RMSNorm's 16-bit rows held in registers and staged (the two paths of
// norm_rotate_block on targets with 32 vector registers; the CPU picks one by default).
TEST(Kernels, QkNormSweepMatchesGolden) {
  std::uint64_t seed = 900;
  int n = 0;
  for (int held16 : {0, 1}) {
    detail::set_norm_rows_held_16bit(held16);
    for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
      for (auto [d, r] : std::vector<std::pair<int, int>>{{6, 6},
                                                          {10, 10},
                                                          {20, 20},
                                                          {32, 32},
                                                          {34, 30},
                                                          {40, 40},
                                                          {64, 64},
                                                          {80, 80},
                                                          {96, 64},
                                                          {128, 128},
                                                          {256, 256}}) {
        // 0-2, 9, 10 forward, 3-8 backward; 5, 6, 9 and 10 span more than one group of four
        // heads (9 and 10 more than two, ending mid-group: the forward finds each group's
        // RMSNorm sums one group ahead); 7 and 8 take random full-width rows (cos, sin halves
        // differ)
        for (int variant = 0; variant < 11; ++variant) {
          rope_case c;
          c.name = "qknorm-sweep";
          c.qk_norm = true;
          c.x_type = t;
          c.head_dim = d;
          c.rotary_dim = r;
          c.tokens = 1 + (variant * 3 + d) % 7;
          c.q_heads = variant >= 9   ? 9 + variant % 2
                      : variant >= 5 ? 6 + variant % 2
                                     : 2 + variant % 2;
          c.k_heads = variant == 4 ? 0 : variant == 6 ? 5 : variant >= 9 ? 15 - c.q_heads : 1;
          c.inplace = variant % 2 == 0;
          if (variant == 1) c.norm_rounding = qk_norm_rounding::hf_qwen3;
          if (variant == 2 || variant == 4) {
            c.style = rope_style::gptj;
            c.output_layout = rope_output_layout::split_half;
          }
          if (variant == 5 || variant == 8) c.style = rope_style::gptj;
          if (variant >= 7) {
            c.rows = "f32";
            c.random_rows = true;
          }
          c.backward = variant >= 3 && variant <= 8;
          c.seed = seed++;
          const auto res = check::run_case(c);
          EXPECT_TRUE(res.pass) << describe(c, res) << " d=" << d << " r=" << r << " v=" << variant
                                << " held16 " << held16;
          ++n;
        }
      }
    }
  }
  detail::set_norm_rows_held_16bit(-1);
  EXPECT_EQ(n, 2 * 3 * 11 * 11);
}

// A QK RMSNorm backward case: heads of d, every dim rotated, weights drawn around 1.
rope_case qk_norm_backward_case(std::string name, dtype t, int d, bool inplace,
                                std::uint64_t seed) {
  rope_case c;
  c.name = std::move(name);
  c.qk_norm = true;
  c.backward = true;
  c.x_type = t;
  c.head_dim = c.rotary_dim = d;
  c.inplace = inplace;
  c.seed = seed;
  return c;
}

// QK RMSNorm + RoPE's backward with some weights 0, which neither the held rows (AVX-512, head
// dims 32, 64 and 128) nor the rows of whole vectors without AVX-512 fold into their angles (nor
// divide dw by): every such call takes the unfolded path, and it matches the golden too, dx and
// dw, both pair layouts, in place and not.
TEST(Kernels, QkNormBackwardWithZeroWeightsMatchesGolden) {
  std::uint64_t seed = 2000;
  int n = 0;
  for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (int d : {32, 64, 128, 80}) {
      for (auto style : {rope_style::neox, rope_style::gptj}) {
        for (bool inplace : {true, false}) {
          rope_case c = qk_norm_backward_case("qknorm-zero-weights", t, d, inplace, seed++);
          c.zero_weights = true;
          c.style = style;
          c.tokens = 3;
          c.q_heads = 6;
          c.k_heads = 2;
          const auto res = check::run_case(c);
          EXPECT_TRUE(res.pass) << describe(c, res) << " d=" << d;
          ++n;
        }
      }
    }
  }
  EXPECT_EQ(n, 3 * 4 * 2 * 2);
}

// The backward takes its tokens in runs of 16, q's rows of a run and then k's: tokens past one
// run, a last run cut short, and sequences of a batch that end inside a run.
TEST(Kernels, QkNormBackwardOverRunsOfTokensMatchesGolden) {
  std::uint64_t seed = 2100;
  int n = 0;
  for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (auto layout : {check::x_layout::thd, check::x_layout::bshd, check::x_layout::bhsd}) {
      for (bool inplace : {true, false}) {
        rope_case c = qk_norm_backward_case("qknorm-backward-runs", t, 128, inplace, seed++);
        c.layout = layout;
        c.batch = layout == check::x_layout::thd ? 1 : 2;
        c.tokens = layout == check::x_layout::thd ? 37 : 21;
        c.q_heads = 5;
        c.k_heads = 2;
        const auto res = check::run_case(c);
        EXPECT_TRUE(res.pass) << describe(c, res);
        ++n;
      }
    }
  }
  EXPECT_EQ(n, 3 * 3 * 2);
}

// Position 0 is the identity, bit for bit, in every dtype.
TEST(Kernels, PositionZeroIsIdentity) {
  for (auto style : {rope_style::neox, rope_style::gptj}) {
    for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
      tensor q(t, {3, 4, 80});
      std::mt19937 rng(3);
      std::normal_distribution<double> normal;
      for (std::int64_t i = 0; i < q.numel(); ++i) store_from_f64(q.data(), t, i, normal(rng));
      const tensor before = q.clone();
      std::vector<std::int64_t> zeros(3, 0);
      rope_tensors x;
      x.q = q;
      rope_apply(style, x,
                 rope_positions::from_ids(tensor_view::contiguous(zeros.data(), dtype::i64, {3})),
                 rope_angles::from_theta(10000.0));
      EXPECT_EQ(std::memcmp(q.data(), before.data(), q.bytes()), 0)
          << to_string(style) << to_string(t);
    }
  }
}

// Rotations keep each pair's norm, and backward undoes forward.
TEST(Kernels, NormsKeptAndBackwardInvertsForward) {
  const std::int64_t T = 33, H = 5, D = 128;
  for (auto style : {rope_style::neox, rope_style::gptj}) {
    std::vector<float> x(T * H * D), y(x.size()), z(x.size());
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-4, 4);
    for (auto& v : x) v = u(rng);
    rope_tensors fwd;
    fwd.q = tensor_view::contiguous(x.data(), dtype::f32, {T, H, D});
    fwd.q_out = tensor_view::contiguous(y.data(), dtype::f32, {T, H, D});
    const auto angles = rope_angles::from_theta(10000.0);
    rope_apply(style, fwd, rope_positions::from_offset(60000), angles);
    rope_tensors bwd;
    bwd.q = *fwd.q_out;
    bwd.q_out = tensor_view::contiguous(z.data(), dtype::f32, {T, H, D});
    rope_options back;
    back.backward = true;
    rope_apply(style, bwd, rope_positions::from_offset(60000), angles, back);
    double worst_norm = 0, worst_inverse = 0;
    for (std::int64_t row = 0; row < T * H; ++row) {
      for (std::int64_t i = 0; i < D / 2; ++i) {
        const std::int64_t a = row * D + (style == rope_style::neox ? i : 2 * i);
        const std::int64_t b = row * D + (style == rope_style::neox ? i + D / 2 : 2 * i + 1);
        const double n0 = std::hypot(double{x[a]}, double{x[b]});
        const double n1 = std::hypot(double{y[a]}, double{y[b]});
        worst_norm = std::max(worst_norm, std::fabs(n1 - n0));
      }
    }
    for (std::size_t i = 0; i < x.size(); ++i)
      worst_inverse = std::max(worst_inverse, double(std::fabs(z[i] - x[i])));
    EXPECT_LT(worst_norm, 4e-6) << to_string(style);
    EXPECT_LT(worst_inverse, 1e-5) << to_string(style);
  }
}

// Threads split tokens; each element's arithmetic is the same, so results are identical.
TEST(Kernels, ThreadCountDoesNotChangeResults) {
  const std::int64_t T = 300, H = 12, D = 128;
  std::vector<std::uint16_t> x(T * H * D), a(x.size()), b(x.size());
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = f32_to_bf16_bits(normal(rng));
  auto run = [&](int threads, std::vector<std::uint16_t>& out) {
    set_num_threads(threads);
    rope_tensors t;
    t.q = tensor_view::contiguous(x.data(), dtype::bf16, {T, H, D});
    t.q_out = tensor_view::contiguous(out.data(), dtype::bf16, {T, H, D});
    rope_apply(rope_style::neox, t, rope_positions::from_offset(5), rope_angles::from_theta(1e6));
  };
  const int before = num_threads();
  run(1, a);
  run(2, b);
  set_num_threads(before);
  EXPECT_EQ(a, b);
}

// MRoPE gathers its angles for runs of 64 tokens before rotating them: token counts of one,
// one run, a run and one, and several runs ending mid-run, on one thread and two (at 201 tokens
// of 12 heads the call is large enough to be split: its blocks of tokens end mid-run), both
// section layouts, forward, backward and QK RMSNorm, in place and out of place.
TEST(Kernels, MropeRunsOfTokensMatchGolden) {
  std::uint64_t seed = 1200;
  const int before = num_threads();
  int n = 0;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (std::int64_t T : {1, 64, 65, 201}) {
      for (int variant = 0; variant < 4; ++variant) {
        rope_case c;
        c.name = "mrope-runs";
        c.style = rope_style::neox;
        c.x_type = variant % 2 == 0 ? dtype::f32 : dtype::bf16;
        c.head_dim = 128;
        c.rotary_dim = 128;
        c.tokens = T;
        c.q_heads = 9;
        c.k_heads = 3;
        c.mrope_section =
            variant < 2 ? std::array<int, 3>{16, 24, 24} : std::array<int, 3>{24, 20, 20};
        c.mrope = variant < 2 ? mrope_layout::chunked : mrope_layout::interleaved;
        c.inplace = variant != 1;
        c.backward = variant == 2;
        c.qk_norm = variant == 3;
        c.seed = seed++;
        const auto res = check::run_case(c);
        EXPECT_TRUE(res.pass) << describe(c, res) << " T=" << T << " threads=" << threads
                              << " v=" << variant;
        ++n;
      }
    }
  }
  set_num_threads(before);
  EXPECT_EQ(n, 2 * 4 * 4);
}

// MRoPE's text tokens (every axis at one position) must come out as RoPE at that position, bit
// for bit, whatever the other tokens of the call. Every token's rows, text or not (one axis
// apart, another, or both), must be x cos + rotate_half(x) sin (backward: its transpose) with
// each frequency's angle from its own axis's table row, computed here in fp64. 150 tokens (two
// whole runs of 64 and part of a third), q and k, f32 and bf16, forward and backward, in place
// and out of place, one thread and two.
TEST(Kernels, MropeTextTokensAreRopeAtTheirPosition) {
  const std::int64_t T = 150, Hq = 4, Hk = 2, D = 128, half = D / 2, rows = 512;
  std::vector<float> cos(rows * half), sin(rows * half);
  for (std::int64_t p = 0; p < rows; ++p) {
    for (std::int64_t j = 0; j < half; ++j) {
      const double a = p * std::pow(1e4, -2.0 * j / D);
      cos[p * half + j] = static_cast<float>(std::cos(a));
      sin[p * half + j] = static_cast<float>(std::sin(a));
    }
  }
  const auto table =
      rope_angles::from_table(tensor_view::contiguous(cos.data(), dtype::f32, {rows, half}),
                              tensor_view::contiguous(sin.data(), dtype::f32, {rows, half}));
  // text tokens (t % 5 < 2) at one position; t % 5 == 2, 3, 4: h apart, w apart, both (far
  // enough that each moved axis's highest frequency turns by over half a radian)
  std::mt19937 rng(23);
  std::uniform_int_distribution<std::int64_t> at(0, rows - 201);
  std::vector<std::int64_t> ids(3 * T), first(T);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t p = at(rng), kind = t % 5;
    first[t] = ids[t] = p;
    ids[T + t] = kind == 2 || kind == 4 ? p + 100 : p;
    ids[2 * T + t] = kind == 3 || kind == 4 ? p + 200 : p;
  }
  const auto map = mrope_axis_map({16, 24, 24}, mrope_layout::chunked);
  const auto mrope =
      rope_positions::from_axes(tensor_view::contiguous(ids.data(), dtype::i64, {3, T}), map);
  const auto rope =
      rope_positions::from_ids(tensor_view::contiguous(first.data(), dtype::i64, {T}));
  const int before = num_threads();
  int compared = 0;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (auto t : {dtype::f32, dtype::bf16}) {
      for (bool backward : {false, true}) {
        for (bool inplace : {true, false}) {
          tensor q(t, {T, Hq, D}), k(t, {T, Hk, D});
          std::normal_distribution<double> normal;
          for (std::int64_t i = 0; i < q.numel(); ++i) store_from_f64(q.data(), t, i, normal(rng));
          for (std::int64_t i = 0; i < k.numel(); ++i) store_from_f64(k.data(), t, i, normal(rng));
          // a call's q and k outputs, from copies of q and k when in place
          auto run = [&](const rope_positions& positions) {
            std::array<tensor, 2> y{q.clone(), k.clone()};
            rope_tensors rt;
            rt.q = inplace ? y[0].view() : q.view();
            rt.k = inplace ? y[1].view() : k.view();
            if (!inplace) {
              rt.q_out = y[0].view();
              rt.k_out = y[1].view();
            }
            rope_options o;
            o.backward = backward;
            rope_apply(rope_style::neox, rt, positions, table, o);
            return y;
          };
          const auto got = run(mrope), want_text = run(rope);
          // relative to max(1, |y|): fp32 products, and bf16's rounding (2^-8)
          const double tolerance = t == dtype::f32 ? 1e-6 : 1.0 / 128;
          for (int x = 0; x < 2; ++x) {
            const tensor& in = x == 0 ? q : k;
            const std::int64_t H = x == 0 ? Hq : Hk;
            const std::size_t row = H * D * size_of(t);
            for (std::int64_t tok = 0; tok < T; ++tok) {
              const bool text = tok % 5 < 2;
              const auto* have = static_cast<const unsigned char*>(got[x].data()) + tok * row;
              const auto* want = static_cast<const unsigned char*>(want_text[x].data()) + tok * row;
              if (text) {
                EXPECT_EQ(std::memcmp(have, want, row), 0)
                    << (x == 0 ? "q" : "k") << " text token " << tok << " " << to_string(t)
                    << " backward " << backward << " in place " << inplace << " threads "
                    << threads;
              }
              double worst = 0;
              for (std::int64_t h = 0; h < H; ++h) {
                const std::size_t at0 = (tok * H + h) * D;
                for (std::int64_t i = 0; i < half; ++i) {
                  const std::int64_t p = ids[map[i] * T + tok];
                  const double c = cos[p * half + i], s = sin[p * half + i] * (backward ? -1 : 1);
                  const double a = load_as_f64(in.data(), t, at0 + i);
                  const double b = load_as_f64(in.data(), t, at0 + half + i);
                  for (auto [j, e] :
                       {std::pair{i, a * c - b * s}, std::pair{half + i, b * c + a * s}}) {
                    const double y = load_as_f64(got[x].data(), t, at0 + j);
                    worst = std::max(worst, std::abs(y - e) / std::max(1.0, std::abs(e)));
                  }
                }
              }
              EXPECT_LT(worst, tolerance)
                  << (x == 0 ? "q" : "k") << " token " << tok << (text ? " (text) " : " ")
                  << to_string(t) << " backward " << backward << " in place " << inplace
                  << " threads " << threads;
              ++compared;
            }
          }
        }
      }
    }
  }
  set_num_threads(before);
  EXPECT_EQ(compared, 2 * 2 * 2 * 2 * 2 * T);
}

// A buffer of `bytes` aligned to 64 bytes (streaming stores need whole aligned vectors).
std::unique_ptr<unsigned char, void (*)(void*)> aligned_bytes(std::size_t bytes) {
  return {static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)), std::free};
}

// Large out-of-place calls with aligned outputs take streaming stores: the result must be
// the in-place result, bit for bit (sizes past the streaming threshold, 64-byte aligned, and 32
// bytes past that: a vector of 16-bit halves aligned, two not), for halves, adjacent pairs (f32
// interleaved in registers on AVX-512), the split-half output and its backward, and QK RMSNorm +
// RoPE; head dim 128, and 80 (on AVX-512 rows taken in output order, whose stores are the row's
// own vectors).
TEST(Kernels, StreamingOutOfPlaceEqualsInPlace) {
  const std::int64_t Hq = 32, Hk = 8;
  struct config {
    rope_style style;
    rope_output_layout layout;
    bool backward, qk_norm;
  };
  const auto as_input = rope_output_layout::as_input, split = rope_output_layout::split_half;
  for (const config c :
       {config{rope_style::neox, as_input, false, false},
        config{rope_style::gptj, as_input, false, false},
        config{rope_style::gptj, split, false, false}, config{rope_style::gptj, split, true, false},
        config{rope_style::neox, as_input, false, true},
        config{rope_style::gptj, split, false, true}}) {
    for (auto [t, D, shift] :
         std::vector<std::tuple<dtype, std::int64_t, std::size_t>>{{dtype::f32, 128, 0},
                                                                   {dtype::f16, 128, 0},
                                                                   {dtype::bf16, 128, 0},
                                                                   {dtype::f32, 80, 0},
                                                                   {dtype::f16, 80, 0},
                                                                   {dtype::bf16, 80, 0},
                                                                   {dtype::f16, 128, 32},
                                                                   {dtype::bf16, 128, 32}}) {
      const std::int64_t T = D == 128 ? 1100 : 1400;  // past the streaming threshold (8 MiB)
      const std::size_t es = size_of(t), qn = T * Hq * D, kn = T * Hk * D;
      auto q = aligned_bytes(qn * es), k = aligned_bytes(kn * es);
      auto qo_buffer = aligned_bytes(qn * es + shift), ko_buffer = aligned_bytes(kn * es + shift);
      unsigned char* qo = qo_buffer.get() + shift;
      unsigned char* ko = ko_buffer.get() + shift;
      std::mt19937 rng(11);
      std::normal_distribution<double> normal;
      for (std::size_t i = 0; i < qn; ++i) store_from_f64(q.get(), t, i, normal(rng));
      for (std::size_t i = 0; i < kn; ++i) store_from_f64(k.get(), t, i, normal(rng));
      tensor w(t, {D});
      for (std::int64_t j = 0; j < D; ++j) store_from_f64(w.data(), t, j, 0.5 + 0.01 * j);
      const auto angles = rope_angles::from_theta(1e6);
      rope_options o;
      o.output_layout = c.layout;
      o.backward = c.backward;
      qk_norm norm;
      norm.q_weight = w;
      norm.k_weight = w.view();
      auto apply = [&](const rope_tensors& x) {
        if (c.qk_norm) {
          qk_norm_rope_apply(c.style, x, rope_positions::from_offset(3), angles, norm, o);
        } else {
          rope_apply(c.style, x, rope_positions::from_offset(3), angles, o);
        }
      };
      rope_tensors out;
      out.q = tensor_view::contiguous(q.get(), t, {T, Hq, D});
      out.k = tensor_view::contiguous(k.get(), t, {T, Hk, D});
      out.q_out = tensor_view::contiguous(qo, t, {T, Hq, D});
      out.k_out = tensor_view::contiguous(ko, t, {T, Hk, D});
      apply(out);
      rope_tensors in;
      in.q = out.q;
      in.k = out.k;
      apply(in);
      const std::string what = std::string(to_string(c.style)) + " " + std::string(to_string(t)) +
                               " split " + std::to_string(c.layout == split) + " backward " +
                               std::to_string(c.backward) + " qk_norm " +
                               std::to_string(c.qk_norm) + " D " + std::to_string(D) + " shift " +
                               std::to_string(shift);
      EXPECT_EQ(std::memcmp(q.get(), qo, qn * es), 0) << what;
      EXPECT_EQ(std::memcmp(k.get(), ko, kn * es), 0) << what;
    }
  }
}

// The same for QK RMSNorm + RoPE's backward: dx into its own aligned buffers (streamed)
// equals dx over dy, bit for bit, and the weight gradients agree; halves, adjacent pairs and
// the split-half layout, every dtype; head dims 128 and 256 (rows held with AVX-512: 4 and 8
// vectors of pairs) and 192 (6: staged). f16 runs streamed and stored normally without AVX-512
// (the CPU picks one by default).
TEST(Kernels, QkNormBackwardStreamingEqualsInPlace) {
  const std::int64_t Hq = 32, Hk = 8;
  const auto as_input = rope_output_layout::as_input, split = rope_output_layout::split_half;
  for (const std::int64_t D : {128, 192, 256}) {
    const std::int64_t T = D == 128 ? 1100 : D == 192 ? 730 : 560;  // 16-bit dx over 8 MiB
    for (const auto [style, layout] :
         {std::pair{rope_style::neox, as_input}, std::pair{rope_style::gptj, as_input},
          std::pair{rope_style::gptj, split}}) {
      for (auto [t, shift, streamed] :
           std::vector<std::tuple<dtype, std::size_t, int>>{{dtype::f32, 0, -1},
                                                            {dtype::f16, 0, 1},
                                                            {dtype::f16, 0, 0},
                                                            {dtype::bf16, 0, -1},
                                                            {dtype::f16, 32, 1},
                                                            {dtype::f16, 32, 0},
                                                            {dtype::bf16, 32, -1}}) {
        detail::set_f16_norm_backward_streamed(streamed);
        const std::size_t es = size_of(t), qn = T * Hq * D, kn = T * Hk * D;
        auto xq = aligned_bytes(qn * es), xk = aligned_bytes(kn * es), gq = aligned_bytes(qn * es);
        auto gk = aligned_bytes(kn * es);
        // dx 64-byte aligned, or 32 bytes past (a vector of 16-bit halves aligned, two not)
        auto dq_buffer = aligned_bytes(qn * es + shift), dk_buffer = aligned_bytes(kn * es + shift);
        unsigned char* dq = dq_buffer.get() + shift;
        unsigned char* dk = dk_buffer.get() + shift;
        std::mt19937 rng(13);
        std::normal_distribution<double> normal;
        for (auto* b : {&xq, &gq}) {
          for (std::size_t i = 0; i < qn; ++i) store_from_f64(b->get(), t, i, normal(rng));
        }
        for (auto* b : {&xk, &gk}) {
          for (std::size_t i = 0; i < kn; ++i) store_from_f64(b->get(), t, i, normal(rng));
        }
        tensor w(t, {D});
        for (std::int64_t j = 0; j < D; ++j) store_from_f64(w.data(), t, j, 0.5 + 0.01 * j);
        qk_norm norm;
        norm.q_weight = w;
        norm.k_weight = w.view();
        rope_options o;
        o.output_layout = layout;
        std::vector<float> dw[2][2];  // [out of place, in place][q, k]
        for (int inplace = 0; inplace < 2; ++inplace) {
          for (auto& v : dw[inplace]) v.assign(D, 0.0f);
          qk_norm_rope_grad_tensors g;
          g.q = tensor_view::contiguous(xq.get(), t, {T, Hq, D});
          g.k = tensor_view::contiguous(xk.get(), t, {T, Hk, D});
          g.dq_out = tensor_view::contiguous(gq.get(), t, {T, Hq, D});
          g.dk_out = tensor_view::contiguous(gk.get(), t, {T, Hk, D});
          if (!inplace) {
            g.dq = tensor_view::contiguous(dq, t, {T, Hq, D});
            g.dk = tensor_view::contiguous(dk, t, {T, Hk, D});
          }
          g.dq_weight = tensor_view::contiguous(dw[inplace][0].data(), dtype::f32, {D});
          g.dk_weight = tensor_view::contiguous(dw[inplace][1].data(), dtype::f32, {D});
          qk_norm_rope_backward(style, g, rope_positions::from_offset(3),
                                rope_angles::from_theta(1e6), norm, o);
        }
        const std::string what = std::string(to_string(style)) + " " + std::string(to_string(t)) +
                                 " split " + std::to_string(layout == split) + " shift " +
                                 std::to_string(shift) + " D " + std::to_string(D) +
                                 " f16 streamed " + std::to_string(streamed);
        EXPECT_EQ(std::memcmp(gq.get(), dq, qn * es), 0) << what;
        EXPECT_EQ(std::memcmp(gk.get(), dk, kn * es), 0) << what;
        EXPECT_EQ(dw[0][0], dw[1][0]) << what;
        EXPECT_EQ(dw[0][1], dw[1][1]) << what;
      }
    }
  }
  detail::set_f16_norm_backward_streamed(-1);
}

// Every variant that is a rotation: backward(forward(x)) = x, with per-token rows (neox,
// gptj, split-half output, MRoPE planes) and in place and out of place alike.
TEST(Kernels, VariantsBackwardInvertsForward) {
  const std::int64_t T = 29, H = 3, D = 96, half = D / 2;
  struct variant {
    rope_style style;
    rope_output_layout out;
    bool planes;
  };
  for (const variant v : {variant{rope_style::neox, rope_output_layout::as_input, false},
                          variant{rope_style::gptj, rope_output_layout::as_input, false},
                          variant{rope_style::gptj, rope_output_layout::split_half, false},
                          variant{rope_style::neox, rope_output_layout::as_input, true}}) {
    for (bool inplace : {false, true}) {
      // true angles, as rows: neox / split-half cat(c, c), gptj repeat_interleave(c, 2)
      const std::int64_t A = v.planes ? 3 : 1;
      std::vector<float> cos(A * T * D), sin(cos.size());
      for (std::int64_t a = 0; a < A; ++a) {
        for (std::int64_t t = 0; t < T; ++t) {
          for (std::int64_t j = 0; j < D; ++j) {
            const bool adjacent =
                v.style == rope_style::gptj && v.out == rope_output_layout::as_input;
            const std::int64_t i = adjacent ? j / 2 : j % half;
            const double angle =
                static_cast<double>(7 * t + 1000 * a) * std::pow(1e4, -2.0 * i / D);
            cos[(a * T + t) * D + j] = static_cast<float>(std::cos(angle));
            sin[(a * T + t) * D + j] = static_cast<float>(std::sin(angle));
          }
        }
      }
      const auto shape =
          v.planes ? std::vector<std::int64_t>{3, T, D} : std::vector<std::int64_t>{T, D};
      const auto angles = rope_angles::from_token_rows(
          tensor_view::contiguous(cos.data(), dtype::f32, shape),
          tensor_view::contiguous(sin.data(), dtype::f32, shape),
          v.planes ? mrope_axis_map({16, 16, 16}, mrope_layout::interleaved) : std::vector<int>{});
      std::vector<float> x(T * H * D), y(x.size()), z(x.size());
      std::mt19937 rng(21);
      std::uniform_real_distribution<float> u(-4, 4);
      for (auto& e : x) e = u(rng);
      rope_options fwd_options, back;
      fwd_options.output_layout = back.output_layout = v.out;
      back.backward = true;
      rope_tensors fwd;
      fwd.q = tensor_view::contiguous(x.data(), dtype::f32, {T, H, D});
      fwd.q_out = tensor_view::contiguous(y.data(), dtype::f32, {T, H, D});
      rope_apply(v.style, fwd, angles, fwd_options);
      rope_tensors bwd;
      bwd.q = *fwd.q_out;
      if (inplace) {
        rope_apply(v.style, bwd, angles, back);
        z = y;
      } else {
        bwd.q_out = tensor_view::contiguous(z.data(), dtype::f32, {T, H, D});
        rope_apply(v.style, bwd, angles, back);
      }
      double worst = 0;
      for (std::size_t i = 0; i < x.size(); ++i)
        worst = std::max(worst, double(std::fabs(z[i] - x[i])));
      EXPECT_LT(worst, 1e-5) << to_string(v.style) << " " << to_string(v.out) << " planes "
                             << v.planes << " inplace " << inplace;
    }
  }
}

// The split-half output in place, and its backward (each row read whole before it is
// written: held in registers when r/2 is 1, 2 or 4 vectors, else copied), equals the
// out-of-place result bit for bit, for every dtype; the head dims give every held count on
// each target (4, 8 and 16 lanes) and rows with a vector tail.
TEST(Kernels, SplitHalfInPlaceEqualsOutOfPlace) {
  const std::int64_t T = 17, H = 5;
  for (std::int64_t D : {8, 16, 32, 64, 128, 80, 6}) {
    for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
      for (bool backward : {false, true}) {
        tensor x(t, {T, H, D}), y(t, {T, H, D});
        std::mt19937 rng(31);
        std::normal_distribution<double> normal;
        for (std::int64_t i = 0; i < x.numel(); ++i) store_from_f64(x.data(), t, i, normal(rng));
        rope_options o;
        o.output_layout = rope_output_layout::split_half;
        o.backward = backward;
        rope_tensors out;
        out.q = x;
        out.q_out = y.view();
        rope_apply(rope_style::gptj, out, rope_positions::from_offset(11),
                   rope_angles::from_theta(1e4), o);
        rope_tensors in;
        in.q = x;
        rope_apply(rope_style::gptj, in, rope_positions::from_offset(11),
                   rope_angles::from_theta(1e4), o);
        EXPECT_EQ(std::memcmp(x.data(), y.data(), x.bytes()), 0)
            << D << " " << to_string(t) << " backward " << backward;
      }
    }
  }
}

// Full-width rows take two angle vectors per step only when both cos and sin have equal
// halves: rows where just one of them differs, in one column, must still rotate with all
// four, forward and backward, as x*cos + rotate_half(x)*sin. Head dim 80 rotates from memory,
// 128 through angles held in registers (AVX-512).
TEST(Kernels, FullWidthRowsWithOneDifferingHalfUseIt) {
  const std::int64_t T = 6, H = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int which = 0; which < 4; ++which) {  // cos or sin differs; head dim 80 or 128
    const std::int64_t D = which < 2 ? 80 : 128, half = D / 2;
    for (bool backward : {false, true}) {
      std::vector<float> x(T * H * D), y(x.size()), cos(T * D), sin(T * D);
      for (auto& v : x) v = u(rng);
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t j = 0; j < half; ++j) {
          cos[t * D + j] = cos[t * D + half + j] = u(rng);
          sin[t * D + j] = sin[t * D + half + j] = u(rng);
        }
        std::vector<float>& row = which % 2 == 0 ? cos : sin;
        row[t * D + half + (t * 7) % half] += 0.5f;
      }
      rope_tensors rt;
      rt.q = tensor_view::contiguous(x.data(), dtype::f32, {T, H, D});
      rt.q_out = tensor_view::contiguous(y.data(), dtype::f32, {T, H, D});
      rope_options o;
      o.backward = backward;
      rope_apply(
          rope_style::neox, rt, rope_positions::none(),
          rope_angles::from_token_rows(tensor_view::contiguous(cos.data(), dtype::f32, {T, D}),
                                       tensor_view::contiguous(sin.data(), dtype::f32, {T, D})),
          o);
      double worst = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t h = 0; h < H; ++h) {
          const float* xr = &x[(t * H + h) * D];
          const float* yr = &y[(t * H + h) * D];
          const float* c = &cos[t * D];
          const float* s = &sin[t * D];
          for (std::int64_t j = 0; j < D; ++j) {
            // forward: y = x c + rotate_half(x) s; backward: its transpose
            double e;
            if (!backward) {
              const double rot = j < half ? -xr[j + half] : xr[j - half];
              e = double(xr[j]) * c[j] + rot * s[j];
            } else {
              e = j < half ? double(xr[j]) * c[j] + double(xr[j + half]) * s[j + half]
                           : double(xr[j]) * c[j] - double(xr[j - half]) * s[j - half];
            }
            worst = std::max(worst, std::abs(e - yr[j]));
          }
        }
      }
      EXPECT_LT(worst, 1e-6) << (which % 2 == 0 ? "cos" : "sin") << " D " << D << " backward "
                             << backward;
    }
  }
}

// bf16 stores round each fp32 result once, subnormal results included (the AVX512-BF16
// instruction flushes them, so a vector pair holding one takes the integer path): the bf16
// kernel's output is the f32 kernel's on the same (exactly widened) inputs, rounded by the
// scalar conversion, bit for bit. Token 0 (position 0: y = x) has subnormal results in only
// the first elements of pairs (head 1) or only the second (head 2); the other tokens have
// them in both (head 3), in the first 16 pairs and the last 8 (head dim 80: the lane-pair step
// and the tail).
TEST(Kernels, Bf16StoresRoundSubnormalResultsLikeScalar) {
  const std::int64_t T = 9, H = 4;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [style, D] : std::vector<std::pair<rope_style, std::int64_t>>{
           {rope_style::neox, 128}, {rope_style::gptj, 128}, {rope_style::neox, 80}}) {
    std::vector<std::uint16_t> xb(T * H * D), yb(xb.size());
    std::vector<float> xf(xb.size()), yf(xb.size());
    for (std::size_t i = 0; i < xb.size(); ++i) {
      const auto h = static_cast<std::int64_t>(i) / D % H, j = static_cast<std::int64_t>(i) % D;
      const bool first = style == rope_style::neox ? j < D / 2 : j % 2 == 0;
      const std::int64_t pair = style == rope_style::neox ? j % (D / 2) : j / 2;
      const bool tiny =
          (pair < 16 || pair >= D / 2 - 8) && ((h == 1 && first) || (h == 2 && !first) || h == 3);
      const float v = u(rng) * (tiny ? 0x1p-125f : 1.0f);
      xb[i] = f32_to_bf16_bits(v);
      xf[i] = bf16_bits_to_f32(xb[i]);
    }
    const auto positions = rope_positions::from_offset(0);
    const auto angles = rope_angles::from_theta(1e4);
    rope_tensors b, f;
    b.q = tensor_view::contiguous(xb.data(), dtype::bf16, {T, H, D});
    b.q_out = tensor_view::contiguous(yb.data(), dtype::bf16, {T, H, D});
    f.q = tensor_view::contiguous(xf.data(), dtype::f32, {T, H, D});
    f.q_out = tensor_view::contiguous(yf.data(), dtype::f32, {T, H, D});
    rope_apply(style, b, positions, angles);
    rope_apply(style, f, positions, angles);
    int subnormal = 0, mismatches = 0;
    for (std::size_t i = 0; i < yb.size(); ++i) {
      subnormal += yf[i] != 0 && std::abs(yf[i]) < 0x1p-126f;
      mismatches += yb[i] != f32_to_bf16_bits(yf[i]);
    }
    EXPECT_GT(subnormal, 20) << to_string(style) << " D=" << D;  // the case exercises the fallback
    EXPECT_EQ(mismatches, 0) << to_string(style) << " D=" << D;
  }
}

// QK RMSNorm of bf16 rows whose squares are all fp32 subnormals (|x| < 2^-63): with eps = 0 or
// eps = 2^-126 those squares decide r, so they are summed, not flushed to zero. The bf16 result
// is the f32 kernel's on the same values to within bf16 rounding.
TEST(Kernels, QkNormKeepsSubnormalSquares) {
  const std::int64_t T = 3, H = 9, D = 128;
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::uint16_t> xb(T * H * D), yb(xb.size());
  std::vector<float> xf(xb.size()), yf(xb.size()), w(D);
  for (std::size_t i = 0; i < xb.size(); ++i) {
    xb[i] = f32_to_bf16_bits(u(rng) * 0x1p-64f);
    xf[i] = bf16_bits_to_f32(xb[i]);
  }
  for (auto& v : w) v = u(rng) + 1.5f;
  for (double eps : {0.0, 0x1p-126}) {
    qk_norm norm;
    norm.q_weight = tensor_view::contiguous(w.data(), dtype::f32, {D});
    norm.eps = eps;
    rope_tensors b, f;
    b.q = tensor_view::contiguous(xb.data(), dtype::bf16, {T, H, D});
    b.q_out = tensor_view::contiguous(yb.data(), dtype::bf16, {T, H, D});
    f.q = tensor_view::contiguous(xf.data(), dtype::f32, {T, H, D});
    f.q_out = tensor_view::contiguous(yf.data(), dtype::f32, {T, H, D});
    const auto positions = rope_positions::from_offset(0);
    const auto angles = rope_angles::from_theta(1e4);
    qk_norm_rope_apply(rope_style::neox, b, positions, angles, norm);
    qk_norm_rope_apply(rope_style::neox, f, positions, angles, norm);
    int mismatches = 0;
    double largest = 0;
    for (std::size_t i = 0; i < yb.size(); ++i) {
      const double got = bf16_bits_to_f32(yb[i]), want = yf[i];
      mismatches += !(std::fabs(got - want) <= 0x1p-7 * std::fabs(want) + 1e-6);
      largest = std::max(largest, std::fabs(want));
    }
    EXPECT_GT(largest, 0.5) << eps;  // the rows are normalised to order 1
    EXPECT_EQ(mismatches, 0) << eps;
  }
}

// QK RMSNorm + RoPE of one row copied into every head of a block: every head's output has
// the same bits, whichever group of heads it falls in and however its sums are taken (before
// the rotations, or inside the loop of a row two groups earlier), in place and out of place.
TEST(Kernels, QkNormSameRowInEveryHeadGivesSameBits) {
  const std::int64_t T = 2, H = 14, D = 128;
  std::mt19937 rng(57);
  std::normal_distribution<double> normal;
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
    for (bool in_place : {true, false}) {
      tensor x(type, {T, H, D}), y(type, {T, H, D}), w(dtype::f32, {D});
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t j = 0; j < D; ++j) {
          const double v = normal(rng);
          for (std::int64_t h = 0; h < H; ++h)
            store_from_f64(x.data(), type, (t * H + h) * D + j, v);
        }
      }
      for (std::int64_t j = 0; j < D; ++j)
        store_from_f64(w.data(), dtype::f32, j, 1 + normal(rng) / 4);
      qk_norm norm;
      norm.q_weight = w.view();
      rope_tensors r;
      r.q = x.view();
      if (!in_place) r.q_out = y.view();
      qk_norm_rope_apply(rope_style::neox, r, rope_positions::from_offset(5),
                         rope_angles::from_theta(1e6), norm);
      const auto* out = static_cast<const unsigned char*>((in_place ? x : y).data());
      const std::size_t row = static_cast<std::size_t>(D) * size_of(type);
      int differing = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t h = 1; h < H; ++h) {
          differing += std::memcmp(out + (t * H + h) * row, out + t * H * row, row) != 0;
        }
      }
      EXPECT_EQ(differing, 0) << to_string(type) << (in_place ? " in place" : " out of place");
    }
  }
}

// Each row's RMSNorm and rotation depend on that row alone, wherever its sums are taken: with
// AVX2 and SSE4 the rotation of a block's last groups sums the first groups of the blocks after
// it (k's, then the next token's q), so the call over every token gives the bits of q's and k's
// rows taken one token and one block at a time, at head counts that end groups of four mid-way,
// and with q alone (the next token's q follows q).
TEST(Kernels, QkNormRowsGiveTheSameBitsOneBlockAtATime) {
  const std::int64_t T = 6, D = 128;
  std::mt19937 rng(73);
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
    for (auto [hq, hk] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {3, 2}, {4, 4}, {5, 3}, {8, 4}, {9, 1}, {32, 8}, {6, 0}, {4, 0}}) {
      const std::int64_t k_rows = std::max<std::int64_t>(hk, 1);  // k's tensors, unused at hk 0
      tensor q(type, {T, hq, D}), k(type, {T, k_rows, D}), qo(type, {T, hq, D}),
          ko(type, {T, k_rows, D});
      tensor qw(dtype::f32, {D}), kw(dtype::f32, {D});
      fill_normal({&q, &k}, rng);
      fill_weights({&qw, &kw}, rng);
      qk_norm norm;
      norm.q_weight = qw.view();
      rope_tensors all;
      all.q = q.view();
      all.q_out = qo.view();
      if (hk > 0) {
        norm.k_weight = kw.view();
        all.k = k.view();
        all.k_out = ko.view();
      }
      const auto angles = rope_angles::from_theta(1e6);
      qk_norm_rope_apply(rope_style::neox, all, rope_positions::from_offset(0), angles, norm);
      int differing = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        for (bool is_q : {true, false}) {
          if (!is_q && hk == 0) continue;
          tensor& x = is_q ? q : k;
          const tensor& whole = is_q ? qo : ko;
          const std::int64_t heads = is_q ? hq : hk;
          const std::size_t bytes = static_cast<std::size_t>(heads * D) * size_of(type);
          std::vector<unsigned char> alone(bytes);
          rope_tensors one;
          one.q = tensor_view::contiguous(static_cast<unsigned char*>(x.data()) + t * bytes, type,
                                          {1, heads, D});
          one.q_out = tensor_view::contiguous(alone.data(), type, {1, heads, D});
          qk_norm one_norm;
          one_norm.q_weight = is_q ? qw.view() : kw.view();
          qk_norm_rope_apply(rope_style::neox, one, rope_positions::from_offset(t), angles,
                             one_norm);
          differing +=
              std::memcmp(alone.data(), static_cast<const unsigned char*>(whole.data()) + t * bytes,
                          bytes) != 0;
        }
      }
      EXPECT_EQ(differing, 0) << to_string(type) << " " << hq << " + " << hk << " heads";
    }
  }
}

// QK RMSNorm + RoPE's backward takes a block's rows of a run of tokens at a time, its sums
// running on across the tokens: dx is the same, bit for bit, as from calls of one token each,
// and the weight gradients agree to fp32 summation order. 37 tokens: two runs of 16 and a
// last one cut short.
TEST(Kernels, QkNormBackwardGivesTheSameBitsOneTokenAtATime) {
  const std::int64_t T = 37;
  std::mt19937 rng(79);
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
    for (std::int64_t D : {64, 128, 256}) {
      for (auto [hq, hk] :
           std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {3, 2}, {8, 4}, {9, 1}}) {
        tensor q(type, {T, hq, D}), k(type, {T, hk, D}), gq(type, {T, hq, D}), gk(type, {T, hk, D}),
            dq(type, {T, hq, D}), dk(type, {T, hk, D});
        tensor qw(dtype::f32, {D}), kw(dtype::f32, {D});
        fill_normal({&q, &k, &gq, &gk}, rng);
        fill_weights({&qw, &kw}, rng);
        qk_norm norm;
        norm.q_weight = qw.view();
        norm.k_weight = kw.view();
        const auto angles = rope_angles::from_theta(1e6);
        std::vector<float> dqw(D), dkw(D);
        qk_norm_rope_grad_tensors whole;
        whole.q = q.view();
        whole.k = k.view();
        whole.dq_out = gq.view();
        whole.dk_out = gk.view();
        whole.dq = dq.view();
        whole.dk = dk.view();
        whole.dq_weight = tensor_view::contiguous(dqw.data(), dtype::f32, {D});
        whole.dk_weight = tensor_view::contiguous(dkw.data(), dtype::f32, {D});
        qk_norm_rope_backward(rope_style::neox, whole, rope_positions::from_offset(0), angles,
                              norm);
        int differing = 0;
        std::vector<double> dqw_sum(D, 0.0), dkw_sum(D, 0.0);
        for (std::int64_t t = 0; t < T; ++t) {
          auto row = [&](tensor& x, std::int64_t heads) {
            const std::size_t bytes = static_cast<std::size_t>(heads * D) * size_of(type);
            return tensor_view::contiguous(static_cast<unsigned char*>(x.data()) + t * bytes, type,
                                           {1, heads, D});
          };
          const std::size_t q_bytes = static_cast<std::size_t>(hq * D) * size_of(type);
          const std::size_t k_bytes = static_cast<std::size_t>(hk * D) * size_of(type);
          std::vector<unsigned char> dq_alone(q_bytes), dk_alone(k_bytes);
          std::vector<float> dqw_alone(D), dkw_alone(D);
          qk_norm_rope_grad_tensors one;
          one.q = row(q, hq);
          one.k = row(k, hk);
          one.dq_out = row(gq, hq);
          one.dk_out = row(gk, hk);
          one.dq = tensor_view::contiguous(dq_alone.data(), type, {1, hq, D});
          one.dk = tensor_view::contiguous(dk_alone.data(), type, {1, hk, D});
          one.dq_weight = tensor_view::contiguous(dqw_alone.data(), dtype::f32, {D});
          one.dk_weight = tensor_view::contiguous(dkw_alone.data(), dtype::f32, {D});
          qk_norm_rope_backward(rope_style::neox, one, rope_positions::from_offset(t), angles,
                                norm);
          differing += std::memcmp(dq_alone.data(), row(dq, hq).data, q_bytes) != 0;
          differing += std::memcmp(dk_alone.data(), row(dk, hk).data, k_bytes) != 0;
          for (std::int64_t j = 0; j < D; ++j) {
            dqw_sum[j] += dqw_alone[j];
            dkw_sum[j] += dkw_alone[j];
          }
        }
        const std::string what = std::string(to_string(type)) + " D " + std::to_string(D) + " " +
                                 std::to_string(hq) + " + " + std::to_string(hk) + " heads";
        EXPECT_EQ(differing, 0) << what;
        for (std::int64_t j = 0; j < D; ++j) {
          EXPECT_NEAR(dqw[j], dqw_sum[j], 1e-5 * (1 + std::fabs(dqw_sum[j]))) << what << " " << j;
          EXPECT_NEAR(dkw[j], dkw_sum[j], 1e-5 * (1 + std::fabs(dkw_sum[j]))) << what << " " << j;
        }
      }
    }
  }
}

// QK RMSNorm + RoPE of heads wider than the sweep's: head dims 320 and 512, whose fp32
// weights (with gptj's pairs taken apart) no longer fit the call's own storage, forward and
// backward, in place and out of place.
TEST(Kernels, QkNormWideHeadsMatchGolden) {
  std::uint64_t seed = 1300;
  for (auto t : {dtype::f32, dtype::bf16}) {
    for (int d : {320, 512}) {
      for (auto style : {rope_style::neox, rope_style::gptj}) {
        for (int variant = 0; variant < 3; ++variant) {
          rope_case c;
          c.name = "qknorm-wide";
          c.qk_norm = true;
          c.style = style;
          c.x_type = t;
          c.head_dim = d;
          c.tokens = 3;
          c.q_heads = 5;
          c.k_heads = 2;
          c.inplace = variant != 1;
          c.backward = variant == 2;
          c.seed = seed++;
          const auto res = check::run_case(c);
          EXPECT_TRUE(res.pass) << describe(c, res) << " d=" << d << " v=" << variant;
        }
      }
    }
  }
}

// QK RMSNorm + RoPE of bf16 x whose results are mostly fp32 subnormals (weights near 2^-124):
// the AVX512-BF16 conversion flushes those, so a vector pair holding one takes the integer
// path. The bf16 result is the f32 kernel's on the same values to within one bf16 rounding,
// subnormal results included (their spacing, 2^-133, is the absolute tolerance), in place and
// out of place, for rows of 1, 2 and 4 vectors of pairs (head dims 32, 64, 128).
TEST(Kernels, QkNormBf16SubnormalResults) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::int64_t D : {32, 64, 128}) {
    for (bool in_place : {true, false}) {
      const std::int64_t T = 3, H = 6;
      std::vector<std::uint16_t> xb(T * H * D), yb(xb.size());
      std::vector<float> xf(xb.size()), yf(xb.size()), w(D);
      for (std::size_t i = 0; i < xb.size(); ++i) {
        xb[i] = f32_to_bf16_bits(u(rng));
        xf[i] = bf16_bits_to_f32(xb[i]);
      }
      for (auto& v : w) v = (u(rng) + 2.0f) * 0x1p-125f;
      qk_norm norm;
      norm.q_weight = tensor_view::contiguous(w.data(), dtype::f32, {D});
      rope_tensors b, f;
      b.q = tensor_view::contiguous(xb.data(), dtype::bf16, {T, H, D});
      if (!in_place) b.q_out = tensor_view::contiguous(yb.data(), dtype::bf16, {T, H, D});
      f.q = tensor_view::contiguous(xf.data(), dtype::f32, {T, H, D});
      f.q_out = tensor_view::contiguous(yf.data(), dtype::f32, {T, H, D});
      const auto positions = rope_positions::from_offset(3);
      const auto angles = rope_angles::from_theta(1e4);
      qk_norm_rope_apply(rope_style::neox, b, positions, angles, norm);
      qk_norm_rope_apply(rope_style::neox, f, positions, angles, norm);
      const std::vector<std::uint16_t>& got = in_place ? xb : yb;
      int subnormal = 0, mismatches = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = bf16_bits_to_f32(got[i]), want = yf[i];
        subnormal += want != 0 && std::fabs(want) < 0x1p-126;
        mismatches += !(std::fabs(g - want) <= 0x1p-7 * std::fabs(want) + 0x1p-133);
      }
      EXPECT_GT(subnormal, 20) << "D " << D;  // the case exercises the fallback
      EXPECT_EQ(mismatches, 0) << "D " << D << (in_place ? " in place" : " out of place");
    }
  }
}

// QK RMSNorm + RoPE: 1 and 2 threads give identical outputs; the weight gradients agree to
// fp64 summation order.
TEST(Kernels, QkNormThreadsAgree) {
  const std::int64_t T = 300, Hq = 16, Hk = 8, D = 128;
  tensor q(dtype::bf16, {T, Hq, D}), k(dtype::bf16, {T, Hk, D}), w(dtype::bf16, {D});
  std::mt19937 rng(41);
  std::normal_distribution<double> normal;
  for (tensor* t : {&q, &k, &w}) {
    for (std::int64_t i = 0; i < t->numel(); ++i)
      store_from_f64(t->data(), dtype::bf16, i, normal(rng));
  }
  qk_norm norm;
  norm.q_weight = w;
  norm.k_weight = w.view();
  const int before = num_threads();
  std::vector<std::vector<unsigned char>> outs;
  std::vector<std::vector<float>> grads;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    tensor qo(dtype::bf16, {T, Hq, D}), ko(dtype::bf16, {T, Hk, D});
    rope_tensors x;
    x.q = q;
    x.k = k.view();
    x.q_out = qo.view();
    x.k_out = ko.view();
    qk_norm_rope_apply(rope_style::neox, x, rope_positions::from_offset(0),
                       rope_angles::from_theta(1e6), norm);
    const auto* p = static_cast<const unsigned char*>(qo.data());
    outs.emplace_back(p, p + qo.bytes());
    std::vector<float> dqw(D), dkw(D);
    qk_norm_rope_grad_tensors g;
    g.q = q;
    g.k = k.view();
    g.dq_out = qo;  // any gradient will do
    g.dk_out = ko.view();
    g.dq_weight = tensor_view::contiguous(dqw.data(), dtype::f32, {D});
    g.dk_weight = tensor_view::contiguous(dkw.data(), dtype::f32, {D});
    qk_norm_rope_backward(rope_style::neox, g, rope_positions::from_offset(0),
                          rope_angles::from_theta(1e6), norm);
    grads.push_back(dqw);
  }
  set_num_threads(before);
  EXPECT_EQ(outs[0], outs[1]);
  for (std::int64_t j = 0; j < D; ++j) {
    EXPECT_NEAR(grads[0][j], grads[1][j], 1e-5 * (1 + std::fabs(grads[0][j]))) << j;
  }
}

// hf_qwen3 on f32 x is plain fp32 arithmetic with x*cos and rotate_half(x)*sin rounded
// separately: with inputs whose mean of squares is exact (every |x| = 1/2, so r = 2), every
// target gives the golden's emulation of that chain bit for bit (no fused multiply-add).
TEST(Kernels, QkNormHfRoundingIsSeparateRoundingOnEveryTarget) {
  const std::int64_t T = 5, H = 3, D = 64;
  std::vector<float> x(T * H * D), y(x.size()), w(D), cos(T * D), sin(T * D);
  std::mt19937 rng(51);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : x) v = u(rng) < 0 ? -0.5f : 0.5f;
  for (auto& v : w) v = u(rng) + 1.5f;
  for (auto& v : cos) v = u(rng);
  for (auto& v : sin) v = u(rng);
  rope_tensors t;
  t.q = tensor_view::contiguous(x.data(), dtype::f32, {T, H, D});
  t.q_out = tensor_view::contiguous(y.data(), dtype::f32, {T, H, D});
  qk_norm norm;
  norm.q_weight = tensor_view::contiguous(w.data(), dtype::f32, {D});
  norm.eps = 0;
  norm.rounding = qk_norm_rounding::hf_qwen3;
  qk_norm_rope_apply(
      rope_style::neox, t, rope_positions::none(),
      rope_angles::from_token_rows(tensor_view::contiguous(cos.data(), dtype::f32, {T, D}),
                                   tensor_view::contiguous(sin.data(), dtype::f32, {T, D})),
      norm);
  std::vector<double> wd(w.begin(), w.end()), xd(D), yd(D);
  int mismatches = 0;
  for (std::int64_t tk = 0; tk < T; ++tk) {
    const std::vector<double> c(cos.begin() + tk * D, cos.begin() + (tk + 1) * D);
    const std::vector<double> s(sin.begin() + tk * D, sin.begin() + (tk + 1) * D);
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t at = (tk * H + h) * D;
      for (std::int64_t j = 0; j < D; ++j) xd[j] = x[at + j];
      golden::qk_norm_rope_row_hf(dtype::f32, D, D, 0.0, wd.data(), c.data(), s.data(), xd.data(),
                                  yd.data());
      for (std::int64_t j = 0; j < D; ++j) mismatches += static_cast<double>(y[at + j]) != yd[j];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// q [T, 14, D] and k [T, 6, D] of N(0, 1) values, with NaN, +Inf or -Inf planted in either half
// of some rows (heads 1, 4, 6, 11, 13 of q, 2 of k) and rows of zeros (head 9 of q, 5 of k).
void fill_with_non_finite(tensor& q, tensor& k, std::mt19937& rng) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::normal_distribution<double> normal;
  for (tensor* x : {&q, &k}) {
    const bool is_k = x == &k;
    const std::int64_t T = x->shape()[0], H = x->shape()[1], D = x->shape()[2], half = D / 2;
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t h = 0; h < H; ++h) {
        std::int64_t at = -1;  // where the non-finite value goes
        double v = 0;
        if (is_k && h == 2) at = 0, v = inf;
        if (!is_k && h == 1) at = (3 + 5 * t) % D, v = nan;
        if (!is_k && h == 4) at = 7, v = inf;
        if (!is_k && h == 6) at = half + 9, v = -inf;
        if (!is_k && h == 11) at = D - 1 - t, v = nan;
        if (!is_k && h == 13) at = half - 1, v = -inf;
        const bool zeros = h == (is_k ? 5 : 9);
        for (std::int64_t j = 0; j < D; ++j) {
          store_from_f64(x->data(), x->type(), static_cast<std::size_t>((t * H + h) * D + j),
                         zeros     ? 0.0
                         : j == at ? v
                                   : normal(rng));
        }
      }
    }
  }
}

// The fp64 golden's angles of theta 1e4 at positions 0 to T - 1 for head dim D ([T, D/2] each),
// and the same rounded to an f32 table.
struct theta_angles {
  static constexpr double theta = 1e4;
  std::vector<double> cos_half, sin_half;
  tensor cos, sin;
  theta_angles(std::int64_t T, std::int64_t D)
      : cos(dtype::f32, {T, D / 2}), sin(dtype::f32, {T, D / 2}) {
    std::vector<std::int64_t> positions(T);
    for (std::int64_t t = 0; t < T; ++t) positions[t] = t;
    golden::angles(golden::inv_freq(D, theta), positions, cos_half, sin_half);
    for (std::size_t i = 0; i < cos_half.size(); ++i) {
      store_from_f64(cos.data(), dtype::f32, i, cos_half[i]);
      store_from_f64(sin.data(), dtype::f32, i, sin_half[i]);
    }
  }
};

// The angles the kernels are given: an f32 table (theta_angles', NaNs planted in it), or
// computed from theta_angles' theta.
rope_angles table_or_theta(bool table, const tensor& cos_t, const tensor& sin_t) {
  return table ? rope_angles::from_table(cos_t.view(), sin_t.view())
               : rope_angles::from_theta(theta_angles::theta);
}

// QK RMSNorm with one weight for q and k.
qk_norm norm_with(const tensor& weight) {
  qk_norm n;
  n.q_weight = weight.view();
  n.k_weight = weight.view();
  return n;
}

// q and k to be rotated in place, or into q_out and k_out.
rope_tensors q_and_k(tensor& q, tensor& k, tensor& q_out, tensor& k_out, bool in_place) {
  rope_tensors x;
  x.q = q.view();
  x.k = k.view();
  if (!in_place) {
    x.q_out = q_out.view();
    x.k_out = k_out.view();
  }
  return x;
}

// Element `at` of an f32 tensor set to the NaN of these bits.
void plant_nan(tensor& f32, std::int64_t at, std::uint32_t bits) {
  std::memcpy(static_cast<float*>(f32.data()) + at, &bits, sizeof bits);
}

// A result against the golden's: NaN where it is NaN, the same infinity, else within tol.
bool agrees_with_golden(double got, double want, golden::tolerance tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want);
}

// NaN and ±Inf go through every kernel as through the fp64 golden: a NaN stays NaN where the
// golden's is, an infinity stays the same infinity, and every finite result is within the
// dtype's tolerance. Kernels: rope_apply (neox, gptj, gptj with split-half output) and QK
// RMSNorm + RoPE (eps 1e-6 and 0, fp32_once and hf_qwen3) with computed angles; rope_apply
// (neox, gptj) with a table holding NaNs, and QK RMSNorm with NaN weights, whose bit patterns
// (0xffffffff, 0x7fffffff) a rounding to bf16 without a NaN test would carry into -0 or Inf.
// f32, bf16 and f16 x, head dims 64, 80 and 128, in place and out of place, q of 14 heads and k
// of 6 (past two groups of four, where the AVX2 and SSE4 norms sum rows ahead). Rows hold a NaN,
// +Inf or -Inf in either half, or only zeros (NaN with eps = 0, as in HF); token 0 is at
// position 0, where sin = 0 turns Inf * sin into NaN.
TEST(Kernels, NonFiniteValuesPropagateAsInTheGolden) {
  const std::int64_t T = 3, Hq = 14, Hk = 6;
  const std::uint32_t nan_bits[2] = {0xffffffffu, 0x7fffffffu};
  std::mt19937 rng(61);
  std::normal_distribution<double> normal;
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
    for (std::int64_t D : {64, 80, 128}) {
      const std::int64_t half = D / 2;
      tensor q0(type, {T, Hq, D}), k0(type, {T, Hk, D}), w(dtype::f32, {D});
      fill_with_non_finite(q0, k0, rng);
      for (std::int64_t j = 0; j < D; ++j)
        store_from_f64(w.data(), dtype::f32, static_cast<std::size_t>(j), 1 + normal(rng) / 4);
      tensor w_nan = w.clone();
      plant_nan(w_nan, 5, nan_bits[0]);
      plant_nan(w_nan, D - 3, nan_bits[1]);
      const theta_angles ang(T, D);
      const std::vector<double>&cos_half = ang.cos_half, &sin_half = ang.sin_half;
      tensor cos_t = ang.cos.clone(), sin_t = ang.sin.clone();  // the table
      plant_nan(cos_t, 1 * half + 3, nan_bits[0]);
      plant_nan(sin_t, 2 * half + half - 2, nan_bits[1]);
      const auto tol = golden::tolerance_for(type);
      // 0-2 rope (neox, gptj, gptj split-half), 3-5 QK RMSNorm (eps 1e-6, eps 0, hf_qwen3),
      // 6-7 rope through the table (neox, gptj), 8 QK RMSNorm with NaN weights
      for (int kernel = 0; kernel < 9; ++kernel) {
        const bool norm = (kernel >= 3 && kernel <= 5) || kernel == 8;
        const bool table = kernel == 6 || kernel == 7;
        const double eps = kernel == 4 ? 0.0 : 1e-6;
        const rope_style style =
            kernel == 1 || kernel == 2 || kernel == 7 ? rope_style::gptj : rope_style::neox;
        const auto v = kernel == 2                 ? golden::variant::gptj_split_half
                       : style == rope_style::gptj ? golden::variant::gptj
                                                   : golden::variant::neox;
        const tensor& weight = kernel == 8 ? w_nan : w;
        for (bool in_place : {true, false}) {
          tensor q = q0.clone(), k = k0.clone(), qo(type, {T, Hq, D}), ko(type, {T, Hk, D});
          rope_tensors x = q_and_k(q, k, qo, ko, in_place);
          rope_options options;
          if (kernel == 2) options.output_layout = rope_output_layout::split_half;
          const auto from = rope_positions::from_offset(0);
          const auto angles = table_or_theta(table, cos_t, sin_t);
          if (norm) {
            qk_norm n = norm_with(weight);
            n.eps = eps;
            if (kernel == 5) n.rounding = qk_norm_rounding::hf_qwen3;
            qk_norm_rope_apply(style, x, from, angles, n, options);
          } else {
            rope_apply(style, x, from, angles, options);
          }
          std::vector<double> xd(D), hd(D), yd(D), c(D), s(D), wd(D);
          for (std::int64_t j = 0; j < D; ++j)
            wd[j] = load_as_f64(weight.data(), dtype::f32, static_cast<std::size_t>(j));
          int wrong = 0, nonfinite = 0;
          std::string first;
          for (auto [in, out, H] : {std::tuple{&q0, in_place ? &q : &qo, Hq},
                                    std::tuple{&k0, in_place ? &k : &ko, Hk}}) {
            for (std::int64_t t = 0; t < T; ++t) {
              for (std::int64_t i = 0; i < D; ++i) {  // full-width rows in the variant's order
                const auto f = static_cast<std::size_t>(
                    t * half + (v == golden::variant::gptj ? i / 2 : i % half));
                c[i] = table ? load_as_f64(cos_t.data(), dtype::f32, f) : cos_half[f];
                s[i] = table ? load_as_f64(sin_t.data(), dtype::f32, f) : sin_half[f];
              }
              for (std::int64_t h = 0; h < H; ++h) {
                const std::int64_t at = (t * H + h) * D;
                for (std::int64_t j = 0; j < D; ++j)
                  xd[j] = load_as_f64(in->data(), type, static_cast<std::size_t>(at + j));
                if (norm) golden::rms_norm(1, D, xd.data(), wd.data(), eps, hd.data());
                golden::rotate_row(v, D, D, c.data(), s.data(), norm ? hd.data() : xd.data(),
                                   yd.data());
                for (std::int64_t j = 0; j < D; ++j) {
                  const double got =
                      load_as_f64(out->data(), type, static_cast<std::size_t>(at + j));
                  const double want = yd[j];
                  // hf_qwen3 rounds as HF, not as the golden: finite where the golden is
                  const bool ok = kernel == 5 && std::isfinite(want)
                                      ? std::isfinite(got)
                                      : agrees_with_golden(got, want, tol);
                  nonfinite += !std::isfinite(want);
                  if (!ok && wrong++ == 0) {
                    first = "t " + std::to_string(t) + " h " + std::to_string(h) + " j " +
                            std::to_string(j) + " got " + std::to_string(got) + " want " +
                            std::to_string(want);
                  }
                }
              }
            }
          }
          const std::string call = std::string(to_string(type)) + " D " + std::to_string(D) +
                                   " kernel " + std::to_string(kernel) +
                                   (in_place ? " in place" : " out of place");
          EXPECT_EQ(wrong, 0) << call << ": " << first;
          EXPECT_GE(nonfinite, 8 * T) << call;  // the planted values reach the outputs
        }
      }
    }
  }
}

// The backward passes with NaN and ±Inf in the incoming gradient g (and x of QK RMSNorm's
// backward holding an infinity): dx as the fp64 golden's formula gives it, NaN where it is NaN,
// the same infinity, else within tolerance, and QK RMSNorm's weight gradients NaN exactly where
// the golden's are. rope_apply's backward (neox through a table holding NaNs, gptj through
// computed angles) and qk_norm_rope_backward (neox and gptj, with NaN weights too), f32, bf16
// and f16, head dims 64, 80 and 128, dx over g and into its own tensor.
TEST(Kernels, NonFiniteGradientsPropagateAsInTheGolden) {
  const std::int64_t T = 3, Hq = 14, Hk = 6;
  std::mt19937 rng(62);
  std::normal_distribution<double> normal;
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
    for (std::int64_t D : {64, 80, 128}) {
      const std::int64_t half = D / 2;
      tensor gq0(type, {T, Hq, D}), gk0(type, {T, Hk, D});
      fill_with_non_finite(gq0, gk0, rng);
      tensor xq(type, {T, Hq, D}), xk(type, {T, Hk, D}), w(dtype::f32, {D});
      for (tensor* x : {&xq, &xk}) {
        for (std::size_t i = 0; i < static_cast<std::size_t>(x->numel()); ++i)
          store_from_f64(x->data(), type, i, normal(rng));
      }
      store_from_f64(xq.data(), type, static_cast<std::size_t>((1 * Hq + 3) * D + 5),
                     std::numeric_limits<double>::infinity());
      for (std::int64_t j = 0; j < D; ++j)
        store_from_f64(w.data(), dtype::f32, static_cast<std::size_t>(j), 1 + normal(rng) / 4);
      tensor w_nan = w.clone();
      plant_nan(w_nan, D - 2, 0xffffffffu);
      const theta_angles ang(T, D);
      const std::vector<double>&cos_half = ang.cos_half, &sin_half = ang.sin_half;
      tensor cos_t = ang.cos.clone(), sin_t = ang.sin.clone();  // the table
      plant_nan(sin_t, 2 * half + 1, 0xffffffffu);
      const auto tol = golden::tolerance_for(type);
      // 0 rope neox through the table, 1 rope gptj, 2-3 QK RMSNorm neox and gptj, 4 with NaN
      // weights
      for (int kernel = 0; kernel < 5; ++kernel) {
        const bool norm = kernel >= 2, table = kernel == 0;
        const rope_style style = kernel == 1 || kernel == 3 ? rope_style::gptj : rope_style::neox;
        const auto v = style == rope_style::gptj ? golden::variant::gptj : golden::variant::neox;
        const tensor& weight = kernel == 4 ? w_nan : w;
        for (bool in_place : {true, false}) {
          tensor gq = gq0.clone(), gk = gk0.clone(), dq(type, {T, Hq, D}), dk(type, {T, Hk, D});
          std::vector<float> dw(2 * D);
          const auto from = rope_positions::from_offset(0);
          const auto angles = table_or_theta(table, cos_t, sin_t);
          if (norm) {
            const qk_norm n = norm_with(weight);
            qk_norm_rope_grad_tensors g;
            g.q = xq.view();
            g.k = xk.view();
            g.dq_out = gq.view();
            g.dk_out = gk.view();
            if (!in_place) {
              g.dq = dq.view();
              g.dk = dk.view();
            }
            g.dq_weight = tensor_view::contiguous(dw.data(), dtype::f32, {D});
            g.dk_weight = tensor_view::contiguous(dw.data() + D, dtype::f32, {D});
            qk_norm_rope_backward(style, g, from, angles, n);
          } else {
            rope_tensors x = q_and_k(gq, gk, dq, dk, in_place);
            rope_options options;
            options.backward = true;
            rope_apply(style, x, from, angles, options);
          }
          std::vector<double> gd(D), xd(D), dh(D), want(D), c(D), s(D), wd(D), dw_want(2 * D, 0.0);
          for (std::int64_t j = 0; j < D; ++j)
            wd[j] = load_as_f64(weight.data(), dtype::f32, static_cast<std::size_t>(j));
          int wrong = 0, nonfinite = 0;
          std::string first;
          for (int b = 0; b < 2; ++b) {
            const tensor& g_in = b == 0 ? gq0 : gk0;
            const tensor& x_in = b == 0 ? xq : xk;
            const tensor& out = b == 0 ? (in_place ? gq : dq) : (in_place ? gk : dk);
            const std::int64_t H = b == 0 ? Hq : Hk;
            for (std::int64_t t = 0; t < T; ++t) {
              for (std::int64_t i = 0; i < D; ++i) {  // the inverse rotation: sin negated
                const auto f = static_cast<std::size_t>(
                    t * half + (v == golden::variant::gptj ? i / 2 : i % half));
                c[i] = table ? load_as_f64(cos_t.data(), dtype::f32, f) : cos_half[f];
                s[i] = -(table ? load_as_f64(sin_t.data(), dtype::f32, f) : sin_half[f]);
              }
              for (std::int64_t h = 0; h < H; ++h) {
                const std::int64_t at = (t * H + h) * D;
                for (std::int64_t j = 0; j < D; ++j) {
                  gd[j] = load_as_f64(g_in.data(), type, static_cast<std::size_t>(at + j));
                  xd[j] = load_as_f64(x_in.data(), type, static_cast<std::size_t>(at + j));
                }
                golden::rotate_row(v, D, D, c.data(), s.data(), gd.data(), dh.data());
                if (norm) {  // dx_j = r w_j dh_j - x_j r^3 / D sum_k(w_k dh_k x_k)
                  double sq = 0, dot = 0;
                  for (std::int64_t j = 0; j < D; ++j) {
                    sq += xd[j] * xd[j];
                    dot += wd[j] * dh[j] * xd[j];
                  }
                  const double r = 1 / std::sqrt(sq / D + 1e-6);
                  for (std::int64_t j = 0; j < D; ++j) {
                    want[j] = r * wd[j] * dh[j] - xd[j] * r * r * r / D * dot;
                    dw_want[b * D + j] += dh[j] * xd[j] * r;
                  }
                } else {
                  want = dh;
                }
                for (std::int64_t j = 0; j < D; ++j) {
                  const double got =
                      load_as_f64(out.data(), type, static_cast<std::size_t>(at + j));
                  nonfinite += !std::isfinite(want[j]);
                  if (!agrees_with_golden(got, want[j], tol) && wrong++ == 0) {
                    first = "b " + std::to_string(b) + " t " + std::to_string(t) + " h " +
                            std::to_string(h) + " j " + std::to_string(j) + " got " +
                            std::to_string(got) + " want " + std::to_string(want[j]);
                  }
                }
              }
            }
          }
          int dw_wrong = 0;
          for (std::int64_t j = 0; norm && j < 2 * D; ++j)
            dw_wrong += std::isnan(dw[j]) != std::isnan(dw_want[j]);
          const std::string call = std::string(to_string(type)) + " D " + std::to_string(D) +
                                   " kernel " + std::to_string(kernel) +
                                   (in_place ? " in place" : " out of place");
          EXPECT_EQ(wrong, 0) << call << ": " << first;
          EXPECT_EQ(dw_wrong, 0) << call;
          EXPECT_GE(nonfinite, 8 * T) << call;  // the planted values reach the outputs
        }
      }
    }
  }
}

// The vector conversions of this target against the scalar ones (themselves checked against
// independent references for every input in test_dtype.cc): every fp32 bit pattern. bf16 is
// checked as one vector is stored, as two are narrowed together (bf16 rows of halves without
// AVX-512) and as two are joined as pairs (rows of adjacent pairs).
TEST(KernelConversions, EveryF32BitPatternRoundsLikeScalar) {
  constexpr std::int64_t chunk = 1 << 20;
  const char* ways[] = {"", "", " (two vectors together)", " (two vectors as pairs)"};
  for (int way = 0; way < 4; ++way) {
    const dtype to = way == 0 ? dtype::f16 : dtype::bf16;
    std::int64_t mismatches = 0;
#pragma omp parallel for reduction(+ : mismatches) schedule(static)
    for (std::int64_t start = 0; start < (std::int64_t{1} << 32); start += chunk) {
      std::vector<float> in(chunk);
      std::vector<std::uint16_t> out(chunk);
      for (std::int64_t i = 0; i < chunk; ++i) {
        const auto bits = static_cast<std::uint32_t>(start + i);
        std::memcpy(&in[i], &bits, 4);
      }
      if (way < 2) {
        detail::convert_f32_to_16(to, in.data(), out.data(), chunk);
      } else if (way == 2) {
        detail::convert_f32_to_bf16_blocks(in.data(), out.data(), chunk);
      } else {
        detail::convert_f32_to_bf16_pairs(in.data(), out.data(), chunk);
      }
      for (std::int64_t i = 0; i < chunk; ++i) {
        const std::uint16_t want =
            to == dtype::f16 ? f32_to_f16_bits(in[i]) : f32_to_bf16_bits(in[i]);
        mismatches += out[i] != want;
      }
    }
    EXPECT_EQ(mismatches, 0) << to_string(to) << ways[way];
  }
}

TEST(KernelConversions, Every16BitPatternWidensExactly) {
  for (dtype from : {dtype::f16, dtype::bf16}) {
    std::vector<std::uint16_t> in(1 << 16);
    std::vector<float> out(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint16_t>(i);
    detail::convert_16_to_f32(from, in.data(), out.data(), static_cast<std::int64_t>(in.size()));
    int mismatches = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float want = from == dtype::f16 ? f16_bits_to_f32(in[i]) : bf16_bits_to_f32(in[i]);
      std::uint32_t a, b;
      std::memcpy(&a, &out[i], 4);
      std::memcpy(&b, &want, 4);
      // F16C quiets a signalling NaN: then only the quiet bit may differ
      const bool nan_quieted = std::isnan(want) && (a | 0x00400000u) == (b | 0x00400000u);
      mismatches += a != b && !nan_quieted;
    }
    EXPECT_EQ(mismatches, 0) << to_string(from);
  }
}

// Computed angles (rope_angles::from_theta and its kin) take cos and sin a vector of fp64
// angles at a time. Through rope_apply on f32 rows of pairs (1, 0), whose outputs are cos and
// sin exactly, they match libm's, formed and rounded as freqs.h says: within one ulp
// everywhere, and exactly but for at most one value in 10^5. Positions 0 to 4095, spread to
// 2^24, and past the vector path's reduced range (2^25 to 2^62, libm's path); accurate and
// hf_compat, attention scaling 1 and 1.2, head dims 128 and 80, one position a token and one
// per axis (two axes, as the vision RoPE).
TEST(Kernels, ComputedAnglesMatchLibm) {
  std::mt19937_64 rng(4242);
  std::vector<std::int64_t> pos;
  for (std::int64_t t = 0; t < 4096; ++t) pos.push_back(t);
  for (int t = 0; t < 4096; ++t) pos.push_back(static_cast<std::int64_t>(rng() % (1u << 24)));
  for (int e : {25, 31, 40, 62}) pos.push_back(std::int64_t{1} << e);
  const auto T = static_cast<std::int64_t>(pos.size());
  tensor ids(dtype::i64, {T}), axis_ids(dtype::i64, {2, T});
  auto* id = static_cast<std::int64_t*>(ids.data());
  auto* axis_id = static_cast<std::int64_t*>(axis_ids.data());
  for (std::int64_t t = 0; t < T; ++t) {
    id[t] = axis_id[t] = pos[static_cast<std::size_t>(t)];
    axis_id[T + t] = pos[static_cast<std::size_t>(T - 1 - t)];
  }
  long values = 0, differ = 0, worse = 0;
  for (int D : {128, 80}) {
    const int half = D / 2;
    tensor x(dtype::f32, {T, 1, D}), y(dtype::f32, {T, 1, D});
    auto* xp = static_cast<float*>(x.data());
    for (std::int64_t e = 0; e < T * D; ++e) xp[e] = e % D < half ? 1.0f : 0.0f;
    std::vector<int> axis_of(static_cast<std::size_t>(half));
    for (int i = 0; i < half; ++i) axis_of[static_cast<std::size_t>(i)] = i % 2;
    const std::vector<double> inv_freq = rope_inv_freq(D, 1e6);
    for (auto precision : {angle_precision::accurate, angle_precision::hf_compat}) {
      for (double scaling : {1.0, 1.2}) {
        for (bool axes : {false, true}) {
          rope_tensors io;
          io.q = x;
          io.q_out = y.view();
          rope_apply(
              rope_style::neox, io,
              axes ? rope_positions::from_axes(axis_ids, axis_of) : rope_positions::from_ids(ids),
              rope_angles::from_frequencies({inv_freq, scaling}, precision));
          const auto* out = static_cast<const float*>(y.data());
          for (std::int64_t t = 0; t < T; ++t) {
            for (int i = 0; i < half; ++i) {
              const std::int64_t at = axes ? axis_id[(i % 2) * T + t] : id[t];
              float c, s;
              if (precision == angle_precision::accurate) {
                const double a = static_cast<double>(at) * inv_freq[static_cast<std::size_t>(i)];
                c = static_cast<float>(std::cos(a) * scaling);
                s = static_cast<float>(std::sin(a) * scaling);
              } else {
                const double a = static_cast<float>(at) *
                                 static_cast<float>(inv_freq[static_cast<std::size_t>(i)]);
                c = static_cast<float>(std::cos(a)) * static_cast<float>(scaling);
                s = static_cast<float>(std::sin(a)) * static_cast<float>(scaling);
              }
              for (auto [got, want] :
                   {std::pair{out[t * D + i], c}, std::pair{out[t * D + half + i], s}}) {
                ++values;
                if (got == want) continue;
                ++differ;
                if (std::nextafter(want, got) != got && ++worse <= 5) {
                  ADD_FAILURE() << "D " << D << " position " << at << " frequency " << i << ": "
                                << got << " where libm gives " << want;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(worse, 0);
  EXPECT_LE(differ, values / 100000) << differ << " of " << values << " differ by one ulp";
  EXPECT_EQ(values, 2 * 8 * T * (64 + 40));
}

// Computed angles rotate as a table of the same angles does (make_rope_table: fp32 for
// accurate, the x dtype for hf_compat, as HF keeps its tables), bit for bit: the same kernels
// over the same fp32 cos and sin. For hf_compat with 16-bit x this checks the computed angles'
// rounding to the x dtype, on each target.
TEST(Kernels, ComputedAnglesRotateAsTheirTable) {
  const std::int64_t T = 600, Hq = 4, Hk = 2, D = 128;
  tensor ids(dtype::i64, {T});
  auto* id = static_cast<std::int64_t*>(ids.data());
  std::mt19937_64 rng(99);
  for (std::int64_t t = 0; t < T; ++t)
    id[t] = t < 300 ? t : static_cast<std::int64_t>(rng() % 4096);
  int compared = 0;
  for (auto t : {dtype::f32, dtype::bf16, dtype::f16}) {
    tensor q(t, {T, Hq, D}), k(t, {T, Hk, D});
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    for (tensor* x : {&q, &k}) {
      for (std::int64_t e = 0; e < x->numel(); ++e) {
        store_from_f64(x->data(), t, static_cast<std::size_t>(e), u(rng));
      }
    }
    for (auto precision : {angle_precision::accurate, angle_precision::hf_compat}) {
      for (auto style : {rope_style::neox, rope_style::gptj}) {
        const rope_table table =
            make_rope_table(4096, static_cast<int>(D), 1e6,
                            precision == angle_precision::accurate ? dtype::f32 : t, precision);
        tensor outs[2][2] = {{tensor(t, {T, Hq, D}), tensor(t, {T, Hk, D})},
                             {tensor(t, {T, Hq, D}), tensor(t, {T, Hk, D})}};
        for (int from_table = 0; from_table < 2; ++from_table) {
          rope_tensors io;
          io.q = q;
          io.k = k.view();
          io.q_out = outs[from_table][0].view();
          io.k_out = outs[from_table][1].view();
          rope_apply(style, io, rope_positions::from_ids(ids),
                     from_table ? rope_angles::from_table(table.cos, table.sin)
                                : rope_angles::from_theta(1e6, precision));
        }
        for (int j = 0; j < 2; ++j) {
          EXPECT_EQ(std::memcmp(outs[0][j].data(), outs[1][j].data(), outs[0][j].bytes()), 0)
              << to_string(t) << " " << to_string(precision) << " " << to_string(style)
              << (j == 0 ? " q" : " k");
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 2 * 2 * 2);
}

}  // namespace

// Long context: positions up to 2^24 with theta 1e6. The accurate mode's f32 outputs, for
// |x| <= 1, are within 2e-6 of the fp64 golden (its own cos and sin of fp64 angles).
TEST(Kernels, LongContextAccurateOutputsWithin2e6) {
  const std::int64_t D = 128, H = 2;
  std::mt19937_64 rng(2024);
  std::vector<std::int64_t> pos;
  for (int e = 10; e <= 24; ++e) {  // a spread over each binade, and its top
    for (int j = 0; j < 64; ++j)
      pos.push_back((std::int64_t{1} << (e - 1)) +
                    static_cast<std::int64_t>(rng() % (1u << (e - 1))));
  }
  pos.push_back(std::int64_t{1} << 24);
  pos.push_back((std::int64_t{1} << 24) - 1);
  const auto T = static_cast<std::int64_t>(pos.size());
  tensor x(dtype::f32, {T, H, D}), y(dtype::f32, {T, H, D});
  std::uniform_real_distribution<float> u(-1, 1);
  auto* xp = static_cast<float*>(x.data());
  for (std::int64_t e = 0; e < T * H * D; ++e) xp[e] = u(rng);
  rope_tensors io;
  io.q = x;
  io.q_out = y.view();
  rope_apply(rope_style::neox, io,
             rope_positions::from_ids(tensor_view::contiguous(pos.data(), dtype::i64, {T})),
             rope_angles::from_theta(1e6, angle_precision::accurate));
  const std::vector<double> inv = golden::inv_freq(D, 1e6);
  std::vector<double> c(D), s(D), row(D), want(D);
  double worst = 0;
  std::int64_t worst_at = 0;
  const auto* yp = static_cast<const float*>(y.data());
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < D / 2; ++i) {
      const double a = static_cast<double>(pos[t]) * inv[i];
      c[i] = c[i + D / 2] = std::cos(a);
      s[i] = s[i + D / 2] = std::sin(a);
    }
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t d = 0; d < D; ++d) row[d] = xp[(t * H + h) * D + d];
      golden::rotate_row(golden::variant::neox, D, D, c.data(), s.data(), row.data(), want.data());
      for (std::int64_t d = 0; d < D; ++d) {
        const double err = std::fabs(yp[(t * H + h) * D + d] - want[d]);
        if (err > worst) worst = err, worst_at = pos[t];
      }
    }
  }
  EXPECT_LE(worst, 2e-6) << "at position " << worst_at;
}

// Subnormal f32 inputs and outputs are kept as fp32 keeps them, and no call leaves
// flush-to-zero or denormals-are-zero on in the caller's MXCSR.
TEST(Kernels, SubnormalsKeptAndNoFlushToZeroLeftOn) {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned csr_before = _mm_getcsr();
#endif
  const std::int64_t T = 6, H = 3, D = 64;
  tensor x(dtype::f32, {T, H, D}), y(dtype::f32, {T, H, D});
  auto* xp = static_cast<float*>(x.data());
  for (std::int64_t e = 0; e < T * H * D; ++e) xp[e] = static_cast<float>(e % 13 + 1) * 0x1p-140f;
  for (bool theta_angles : {false, true}) {
    rope_tensors io;
    io.q = x;
    io.q_out = y.view();
    // position 0 rotates by cos 1, sin 0: every output equals its (subnormal) input
    rope_apply(rope_style::neox, io, rope_positions::from_offset(0),
               theta_angles ? rope_angles::from_theta(1e4)
                            : rope_angles::from_inv_freq(std::vector<double>(D / 2, 0.5)));
    const auto* yp = static_cast<const float*>(y.data());
    const std::vector<double> inv =
        theta_angles ? golden::inv_freq(D, 1e4) : std::vector<double>(D / 2, 0.5);
    std::vector<double> c(D), sn(D), row(D), want(D);
    std::int64_t nonzero = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t i = 0; i < D / 2; ++i) {
        c[i] = c[i + D / 2] = std::cos(static_cast<double>(t) * inv[i]);
        sn[i] = sn[i + D / 2] = std::sin(static_cast<double>(t) * inv[i]);
      }
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t at = (t * H + h) * D;
        for (std::int64_t d = 0; d < D; ++d) row[d] = xp[at + d];
        golden::rotate_row(golden::variant::neox, D, D, c.data(), sn.data(), row.data(),
                           want.data());
        for (std::int64_t d = 0; d < D; ++d) {
          if (t == 0) ASSERT_EQ(yp[at + d], xp[at + d]) << "element " << at + d;
          // two products rounded at the subnormal step, 2^-149
          ASSERT_LE(std::fabs(yp[at + d] - want[d]), 0x1p-148) << "element " << at + d;
          nonzero += yp[at + d] != 0.0f;
        }
      }
    }
    EXPECT_GT(nonzero, T * H * D * 9 / 10) << "subnormal results flushed to zero";
  }
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_EQ(_mm_getcsr() & 0x8040u, csr_before & 0x8040u) << "FTZ or DAZ changed";
  EXPECT_EQ(csr_before & 0x8040u, 0u) << "the test process started with FTZ or DAZ on";
#endif
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* forced = std::getenv("TILEROPE_CPU_TARGET");
  if (forced && *forced) {
    try {
      set_cpu_target(forced);
    } catch (const tilerope::error& e) {
      std::printf("skipped: %s\n", e.what());
      return 77;
    }
  }
  std::printf("kernel tests on cpu target %s\n", cpu_target().c_str());
  return RUN_ALL_TESTS();
}
