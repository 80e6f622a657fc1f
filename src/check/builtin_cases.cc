#include "check/builtin_cases.h"

#include <array>
#include <cstdint>
#include <string>
#include <utility>

namespace tilerope::check {

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

std::vector<ref_case> builtin_ref_cases() {
  std::vector<ref_case> cases;
  auto add = [&](ref_case c) { cases.push_back(std::move(c)); };
  ref_case v;
  v.name = "ref-vision-smoke-31x16x128";
  v.kernel = ref_kernel::vision;
  v.x_type = dtype::f16;
  v.seq = 31, v.heads = 16, v.k_heads = 16;
  add(v);
  ref_case m;
  m.name = "ref-mrope-smoke-1x16x31x128";
  m.kernel = ref_kernel::mrope;
  m.x_type = dtype::f16;
  m.batch = 1, m.heads = 16, m.k_heads = 2, m.seq = 31;
  add(m);
  ref_case s;
  s.name = "ref-skeleton-4x16x64";
  s.kernel = ref_kernel::skeleton;
  s.batch = 4, s.seq = 16, s.head_dim = 64;
  add(s);
  ref_case q;
  q.name = "ref-qk-norm-rope-q-s7";
  q.kernel = ref_kernel::qk_norm_rope;
  q.x_type = dtype::bf16;
  q.seq = 7, q.heads = 16;
  q.atol = q.rtol = 1e-2;
  add(q);
  for (auto out :
       {reference::interleave_output::interleaved, reference::interleave_output::split_half}) {
    for (auto path :
         {reference::interleave_path::deinterleave, reference::interleave_path::gathermask}) {
      ref_case i;
      i.kernel = ref_kernel::interleave;
      i.x_type = dtype::bf16;
      i.batch = 1, i.heads = 4, i.seq = 37, i.head_dim = 64;
      i.output = out;
      i.path = path;
      i.name = ref_variant_of(i) + "-1x4x37x64";
      i.atol = 1e-4;
      i.rtol = 7.8125e-3;
      add(i);
    }
  }
  return cases;
}

}  // namespace tilerope::check
