// Every invalid argument of rope_apply is a tilerope::error that names the argument and the
// values, thrown before any output byte is written.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"

namespace {

using namespace tilerope;

// A small valid call: q [T, 4, 64], k [T, 2, 64] f32, out of place, positions [T] i64, table.
struct fixture {
  static constexpr std::int64_t T = 5, Hq = 4, Hk = 2, D = 64;
  std::vector<float> q = std::vector<float>(T * Hq * D, 1.0f);
  std::vector<float> k = std::vector<float>(T * Hk * D, 2.0f);
  std::vector<float> q_out = std::vector<float>(T * Hq * D, -7.0f);
  std::vector<float> k_out = std::vector<float>(T * Hk * D, -7.0f);
  std::vector<std::int64_t> pos = {0, 1, 2, 3, 4};
  rope_table table = make_rope_table(16, D, 10000.0);
  rope_tensors x;
  rope_positions positions;
  rope_angles angles;
  rope_options options;
  rope_style style = rope_style::neox;
  // qk-norm: weights [D]; the backward's output gradients are q / k, written to q_out / k_out
  enum class call { rope, qk_norm, qk_norm_backward } mode = call::rope;
  std::vector<float> q_w = std::vector<float>(D, 1.0f);
  std::vector<float> k_w = std::vector<float>(D, 1.0f);
  std::vector<float> q_fwd = std::vector<float>(T * Hq * D, 0.5f);
  std::vector<float> k_fwd = std::vector<float>(T * Hk * D, 0.5f);
  std::vector<float> dq_w = std::vector<float>(D, -7.0f);
  std::vector<float> dk_w = std::vector<float>(D, -7.0f);
  qk_norm norm;
  qk_norm_rope_grad_tensors grads;

  fixture() {
    x.q = tensor_view::contiguous(q.data(), dtype::f32, {T, Hq, D});
    x.k = tensor_view::contiguous(k.data(), dtype::f32, {T, Hk, D});
    x.q_out = tensor_view::contiguous(q_out.data(), dtype::f32, {T, Hq, D});
    x.k_out = tensor_view::contiguous(k_out.data(), dtype::f32, {T, Hk, D});
    positions = rope_positions::from_ids(tensor_view::contiguous(pos.data(), dtype::i64, {T}));
    angles = rope_angles::from_table(table.cos, table.sin);
    norm.q_weight = tensor_view::contiguous(q_w.data(), dtype::f32, {D});
    norm.k_weight = tensor_view::contiguous(k_w.data(), dtype::f32, {D});
    grads.q = tensor_view::contiguous(q_fwd.data(), dtype::f32, {T, Hq, D});
    grads.k = tensor_view::contiguous(k_fwd.data(), dtype::f32, {T, Hk, D});
    grads.dq_out = x.q;
    grads.dk_out = x.k;
    grads.dq = x.q_out;
    grads.dk = x.k_out;
    grads.dq_weight = tensor_view::contiguous(dq_w.data(), dtype::f32, {D});
    grads.dk_weight = tensor_view::contiguous(dk_w.data(), dtype::f32, {D});
  }
  void run() {
    if (mode == call::qk_norm)
      return qk_norm_rope_apply(style, x, positions, angles, norm, options);
    if (mode == call::qk_norm_backward) {
      return qk_norm_rope_backward(style, grads, positions, angles, norm, options);
    }
    rope_apply(style, x, positions, angles, options);
  }
  bool outputs_untouched() const {
    for (float v : dq_w)
      if (v != -7.0f) return false;
    for (float v : dk_w)
      if (v != -7.0f) return false;
    for (float v : q_out)
      if (v != -7.0f) return false;
    for (float v : k_out)
      if (v != -7.0f) return false;
    for (float v : q)
      if (v != 1.0f) return false;
    for (float v : k)
      if (v != 2.0f) return false;
    return true;
  }
};

// Breaks the fixture with `breaker`, expects an error whose message holds every `needle`.
void expect_rejected(const std::function<void(fixture&)>& breaker,
                     const std::vector<std::string>& needles) {
  fixture f;
  breaker(f);
  try {
    f.run();
    ADD_FAILURE() << "no error; expected one naming " << needles[0];
  } catch (const error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
  EXPECT_TRUE(f.outputs_untouched()) << needles[0];
}

TEST(Validation, TheFixtureIsValid) {
  fixture f;
  f.run();
  EXPECT_FALSE(f.outputs_untouched());
}

TEST(Validation, DtypeMismatch) {
  std::vector<std::uint16_t> k16(fixture::T * fixture::Hk * fixture::D);
  expect_rejected(
      [&](fixture& f) {
        f.x.k = tensor_view::contiguous(k16.data(), dtype::bf16, {5, 2, 64});
      },
      {"k dtype (bf16)", "q dtype (f32)"});
  expect_rejected(
      [&](fixture& f) {
        f.x.q_out = tensor_view::contiguous(k16.data(), dtype::f16, {5, 4, 64});
      },
      {"q_out dtype (f16)", "f32"});
  expect_rejected([&](fixture& f) { f.x.q.type = dtype::i32; }, {"q dtype (i32)"});
}

TEST(Validation, RankAndShapeMismatch) {
  expect_rejected(
      [](fixture& f) { f.x.q = tensor_view::contiguous(f.q.data(), dtype::f32, {5 * 4 * 64}); },
      {"q must have rank 3", "rank 1", "[1280]"});
  expect_rejected(
      [](fixture& f) {
        f.x.k = tensor_view::contiguous(f.k.data(), dtype::f32, {1, 5, 2, 64});
      },
      {"k rank (4)", "q rank (3)"});
  expect_rejected(
      [](fixture& f) {
        f.x.k = tensor_view::contiguous(f.k.data(), dtype::f32, {5, 4, 32});
      },
      {"k head_dim (32)", "q head_dim (64)"});
  expect_rejected(
      [](fixture& f) {
        f.x.k = tensor_view::contiguous(f.k.data(), dtype::f32, {2, 5, 64});
      },
      {"k token dims [2, 5, 64]", "[5, 4, 64]"});
  expect_rejected(
      [](fixture& f) {
        f.x.q_out = tensor_view::contiguous(f.q_out.data(), dtype::f32, {5, 2, 128});
      },
      {"q_out shape [5, 2, 128]", "q shape [5, 4, 64]"});
  expect_rejected([](fixture& f) { f.x.k.reset(); }, {"k_out is given but k is not"});
}

TEST(Validation, RotaryDim) {
  expect_rejected([](fixture& f) { f.options.rotary_dim = 63; },
                  {"rotary_dim (63)", "head_dim (64)"});
  expect_rejected([](fixture& f) { f.options.rotary_dim = 66; },
                  {"rotary_dim (66)", "<= head_dim (64)"});
  expect_rejected([](fixture& f) { f.options.rotary_dim = -2; }, {"rotary_dim (-2)"});
}

TEST(Validation, Positions) {
  expect_rejected(
      [](fixture& f) {
        f.positions =
            rope_positions::from_ids(tensor_view::contiguous(f.pos.data(), dtype::i64, {4}));
      },
      {"positions shape [4]", "[5]", "T = 5"});
  expect_rejected([](fixture& f) { f.pos[3] = -3; }, {"positions[3] (-3)", ">= 0"});
  expect_rejected([](fixture& f) { f.pos[2] = 16; }, {"position 16", "16 rows"});
  expect_rejected([](fixture& f) { f.positions = rope_positions::from_offset(-1); },
                  {"offset (-1)"});
  expect_rejected([](fixture& f) { f.positions = rope_positions::from_offset(12); },
                  {"position 16", "table"});
  expect_rejected([](fixture& f) { f.positions.ids.type = dtype::f32; }, {"positions dtype (f32)"});
  expect_rejected([](fixture& f) { f.positions.ids.data = nullptr; },
                  {"positions has null data", "[5]"});
}

TEST(Validation, ContiguityAndNullData) {
  expect_rejected(
      [](fixture& f) {
        f.x.q = tensor_view(f.q.data(), dtype::f32, {5, 4, 32}, {256, 64, 2});
      },
      {"q last dim must be contiguous", "[256, 64, 2]"});
  expect_rejected([](fixture& f) { f.x.k->data = nullptr; }, {"k has null data", "[5, 2, 64]"});
  // null data with zero size is fine
  fixture f;
  f.x.q = tensor_view::contiguous(nullptr, dtype::f32, {0, 4, 64});
  f.x.k = tensor_view::contiguous(nullptr, dtype::f32, {0, 2, 64});
  f.x.q_out = tensor_view::contiguous(nullptr, dtype::f32, {0, 4, 64});
  f.x.k_out = tensor_view::contiguous(nullptr, dtype::f32, {0, 2, 64});
  f.positions = rope_positions::from_ids(tensor_view::contiguous(nullptr, dtype::i64, {0}));
  EXPECT_NO_THROW(f.run());
}

TEST(Validation, Overlap) {
  // q_out shifted by one head inside q: a partial overlap
  expect_rejected(
      [](fixture& f) {
        f.q.resize(f.q.size() + 64, 1.0f);
        f.x.q = tensor_view::contiguous(f.q.data(), dtype::f32, {5, 4, 64});
        f.x.q_out = tensor_view::contiguous(f.q.data() + 64, dtype::f32, {5, 4, 64});
      },
      {"q_out [5, 4, 64] overlaps q [5, 4, 64]", "in place"});
  expect_rejected(
      [](fixture& f) {
        f.x.k_out = tensor_view::contiguous(f.q.data(), dtype::f32, {5, 2, 64});
      },
      {"k_out [5, 2, 64] overlaps q [5, 4, 64]"});
  expect_rejected(
      [](fixture& f) {
        f.x.q_out = tensor_view(f.q_out.data(), dtype::f32, {5, 4, 64}, {256, 0, 1});
      },
      {"q_out [5, 4, 64] with strides [256, 0, 1]", "more than once"});
  // writing into the cos table
  expect_rejected(
      [](fixture& f) {
        f.x.k.reset();
        f.x.k_out.reset();
        f.x.q = tensor_view::contiguous(f.q.data(), dtype::f32, {1, 4, 64});
        f.x.q_out = tensor_view::contiguous(f.table.cos.data(), dtype::f32, {1, 4, 64});
        f.positions =
            rope_positions::from_ids(tensor_view::contiguous(f.pos.data(), dtype::i64, {1}));
      },
      {"q_out [1, 4, 64] overlaps cos [16, 32]"});
  // exact alias is in place, and allowed
  fixture f;
  f.x.q_out = f.x.q;
  f.x.k_out = f.x.k;
  EXPECT_NO_THROW(f.run());
}

TEST(Validation, Angles) {
  auto nan = std::numeric_limits<double>::quiet_NaN();
  auto inf = std::numeric_limits<double>::infinity();
  for (double theta : {nan, inf, 0.0, -1.0}) {
    try {
      rope_angles::from_theta(theta);
      ADD_FAILURE() << theta;
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("theta ("), std::string::npos) << e.what();
    }
  }
  expect_rejected(
      [](fixture& f) {
        f.angles.sin = f.table.sin.view();
        f.angles.sin.shape[1] = 16;
      },
      {"sin table width (16)", "rotary_dim/2 (32)"});
  expect_rejected([](fixture& f) { f.angles.cos.type = dtype::i64; }, {"cos table dtype (i64)"});
  expect_rejected(
      [](fixture& f) {
        f.angles = rope_angles::from_inv_freq({1.0, 0.5});
      },
      {"inv_freq has 2 entries", "rotary_dim/2 (32)"});
  expect_rejected(
      [](fixture& f) {
        std::vector<double> inv(32, 1.0);
        inv[7] = std::numeric_limits<double>::infinity();
        f.angles = rope_angles::from_inv_freq(inv);
      },
      {"inv_freq[7] (inf)"});
  expect_rejected([](fixture& f) { f.style = static_cast<rope_style>(9); }, {"style (9)"});
}

TEST(Validation, TensorViewRejectsBadShapes) {
  EXPECT_THROW(tensor_view(nullptr, dtype::f32, {1, 2, 3, 4, 5, 6}, {1, 1, 1, 1, 1, 1}), error);
  EXPECT_THROW(tensor_view(nullptr, dtype::f32, {2, -1}, {1, 1}), error);
  EXPECT_THROW(tensor_view(nullptr, dtype::f32, {2, 3}, {1}), error);
}

TEST(Validation, EmptyIsANoOp) {
  fixture f;
  f.x.q = tensor_view::contiguous(f.q.data(), dtype::f32, {0, 4, 64});
  f.x.k = tensor_view::contiguous(f.k.data(), dtype::f32, {0, 2, 64});
  f.x.q_out = tensor_view::contiguous(f.q_out.data(), dtype::f32, {0, 4, 64});
  f.x.k_out = tensor_view::contiguous(f.k_out.data(), dtype::f32, {0, 2, 64});
  f.positions = rope_positions::from_ids(tensor_view::contiguous(f.pos.data(), dtype::i64, {0}));
  EXPECT_NO_THROW(f.run());
  EXPECT_TRUE(f.outputs_untouched());
}

}  // namespace

namespace {

using namespace tilerope;

TEST(Validation, MultiAxisPositions) {
  const std::vector<int> map = mrope_axis_map({8, 12, 8}, mrope_layout::chunked);  // 28, not 32
  std::vector<std::int64_t> ids3(3 * 5, 1);
  auto axes = [&](std::vector<std::int64_t>& ids, std::int64_t axes_n, std::vector<int> m) {
    return rope_positions::from_axes(tensor_view::contiguous(ids.data(), dtype::i64, {axes_n, 5}),
                                     std::move(m));
  };
  expect_rejected([&](fixture& f) { f.positions = axes(ids3, 3, map); },
                  {"axis_of_frequency has 28 entries", "rotary_dim/2 (32)"});
  std::vector<int> bad(32, 0);
  bad[7] = 3;
  expect_rejected([&](fixture& f) { f.positions = axes(ids3, 3, bad); },
                  {"axis_of_frequency[7] (3)", "[0, 3)"});
  expect_rejected(
      [&](fixture& f) {
        f.positions = rope_positions::from_axes(
            tensor_view::contiguous(ids3.data(), dtype::i64, {3, 4}), std::vector<int>(32, 0));
      },
      {"positions shape [3, 4]", "[A, 5]"});
  ids3[9] = -4;
  expect_rejected([&](fixture& f) { f.positions = axes(ids3, 3, std::vector<int>(32, 1)); },
                  {"(-4)"});
  ids3[9] = 40;
  expect_rejected([&](fixture& f) { f.positions = axes(ids3, 3, std::vector<int>(32, 1)); },
                  {"position 40"});
}

TEST(Mrope, AxisMapsOfQwen2VlAndQwen3Vl) {
  const auto chunked = mrope_axis_map({16, 24, 24}, mrope_layout::chunked);
  ASSERT_EQ(chunked.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(chunked[i], i < 16 ? 0 : i < 40 ? 1 : 2) << i;
  const auto inter = mrope_axis_map({24, 20, 20}, mrope_layout::interleaved);
  ASSERT_EQ(inter.size(), 64u);
  // T H W T H W ... up to 3 * 20 = 60, then T
  for (int i = 0; i < 60; ++i) EXPECT_EQ(inter[i], i % 3) << i;
  for (int i = 60; i < 64; ++i) EXPECT_EQ(inter[i], 0) << i;
  EXPECT_THROW(mrope_axis_map({-1, 2, 3}, mrope_layout::chunked), error);
  // entries whose sum overflowed int (and asked for gigabytes) before
  EXPECT_THROW(mrope_axis_map({1 << 30, 1 << 30, 1 << 30}, mrope_layout::chunked), error);
  EXPECT_THROW(mrope_axis_map({0, 0, 32769}, mrope_layout::interleaved), error);
  EXPECT_EQ(mrope_layout_from_string(to_string(mrope_layout::interleaved)),
            mrope_layout::interleaved);
  EXPECT_THROW(mrope_layout_from_string("zigzag"), error);
}

}  // namespace

namespace {

TEST(Vision2d, FrequenciesAndErrors) {
  using namespace tilerope;
  const auto f = qwen2vl_vision_frequencies(80, 10000.0);
  ASSERT_EQ(f.inv_freq.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(f.axis_of_frequency[i], i < 20 ? 0 : 1);
    EXPECT_NEAR(f.inv_freq[i], std::pow(10000.0, -2.0 * (i % 20) / 40.0), 1e-15);
  }
  try {
    qwen2vl_vision_frequencies(6);
    FAIL();
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim (6)"), std::string::npos);
  }
}

}  // namespace

namespace {

using namespace tilerope;

// Rows per token, [T, D] f32 (full width), for the fixture's q [5, 4, 64].
struct rows_fixture {
  std::vector<float> cos = std::vector<float>(fixture::T * fixture::D, 0.5f);
  std::vector<float> sin = std::vector<float>(fixture::T * fixture::D, 0.5f);
  tensor_view c(std::initializer_list<std::int64_t> shape) {
    return tensor_view::contiguous(cos.data(), dtype::f32, shape);
  }
  tensor_view s(std::initializer_list<std::int64_t> shape) {
    return tensor_view::contiguous(sin.data(), dtype::f32, shape);
  }
};

TEST(Validation, TokenRows) {
  rows_fixture r;
  const std::int64_t T = fixture::T, D = fixture::D;
  auto use_rows = [&](fixture& f, tensor_view c, tensor_view s, std::vector<int> map = {}) {
    f.angles = rope_angles::from_token_rows(c, s, std::move(map));
    f.positions = rope_positions::none();
  };
  {
    fixture f;  // valid: full rows and half rows
    use_rows(f, r.c({T, D}), r.s({T, D}));
    f.run();
    EXPECT_FALSE(f.outputs_untouched());
    fixture h;
    use_rows(h, r.c({T, D / 2}), r.s({T, D / 2}));
    h.run();
  }
  expect_rejected(
      [&](fixture& f) {
        f.angles = rope_angles::from_token_rows(r.c({T, D}), r.s({T, D}));
      },
      {"from_token_rows", "rope_positions::none()"});
  expect_rejected([&](fixture& f) { f.positions = rope_positions::none(); },
                  {"rope_positions::none() needs angles from_token_rows"});
  expect_rejected(
      [&](fixture& f) {
        use_rows(f, r.c({T - 1, D}), r.s({T - 1, D}));
      },
      {"cos rows [4, 64]", "T = 5", "rotary_dim (64)", "q [5, 4, 64]"});
  expect_rejected(
      [&](fixture& f) {
        use_rows(f, r.c({T, D - 2}), r.s({T, D - 2}));
      },
      {"cos rows [5, 62]", "rotary_dim/2 (32)"});
  expect_rejected(
      [&](fixture& f) {
        use_rows(f, r.c({1, T, D}), r.s({1, T, D}));
      },
      {"cos rows [1, 5, 64]"});
  expect_rejected(
      [&](fixture& f) {
        use_rows(f, r.c({T, D}), r.s({T, D}));
        f.angles.sin.type = dtype::f16;
      },
      {"sin rows [5, 64] f16", "must match cos rows [5, 64] f32"});
  expect_rejected(
      [&](fixture& f) {
        use_rows(f, r.c({T, D}), r.s({T, D}));
        f.angles.cos.type = dtype::i32;
      },
      {"cos rows dtype (i32)"});
  expect_rejected(
      [&](fixture& f) {
        use_rows(f, r.c({T, D}), r.s({T, D}));
        f.angles.cos.data = nullptr;
        f.angles.sin.data = nullptr;
      },
      {"cos has null data"});
  // planes [A, T, w] with a frequency map
  std::vector<float> planes(3 * T * D, 0.25f);
  auto p3 = [&] { return tensor_view::contiguous(planes.data(), dtype::f32, {3, T, D}); };
  {
    fixture f;
    use_rows(f, p3(), p3(), mrope_axis_map({8, 12, 12}, mrope_layout::chunked));
    f.run();
  }
  expect_rejected([&](fixture& f) { use_rows(f, p3(), p3(), std::vector<int>(32, 3)); },
                  {"axis_of_frequency[0] (3)", "[0, 3)"});
  expect_rejected([&](fixture& f) { use_rows(f, p3(), p3(), std::vector<int>(31, 0)); },
                  {"axis_of_frequency has 31 entries", "rotary_dim/2 (32)"});
  // rows must not overlap an output
  expect_rejected(
      [&](fixture& f) {
        use_rows(f, tensor_view::contiguous(f.q_out.data(), dtype::f32, {T, D}), r.s({T, D}));
      },
      {"q_out [5, 4, 64] overlaps cos [5, 64]"});
}

TEST(Validation, OutputLayoutAndScaling) {
  expect_rejected([](fixture& f) { f.options.output_layout = static_cast<rope_output_layout>(5); },
                  {"output_layout (5)"});
  EXPECT_EQ(rope_output_layout_from_string("split-half"), rope_output_layout::split_half);
  EXPECT_EQ(rope_output_layout_from_string("interleaved"), rope_output_layout::as_input);
  EXPECT_THROW(rope_output_layout_from_string("diagonal"), error);
  EXPECT_THROW(rope_angles::from_frequencies({{1.0, 0.5}, -1.0}), error);
  expect_rejected(
      [](fixture& f) {
        f.angles = rope_angles::from_theta(10000.0);
        f.angles.attention_scaling = std::nan("");
      },
      {"attention_scaling (nan)"});
}

TEST(Validation, QkNorm) {
  using call = fixture::call;
  {
    fixture f;
    f.mode = call::qk_norm;
    f.run();
    EXPECT_FALSE(f.outputs_untouched());
  }
  auto qk = [](std::function<void(fixture&)> also) {
    return [also](fixture& f) {
      f.mode = call::qk_norm;
      also(f);
    };
  };
  expect_rejected(qk([](fixture& f) { f.norm.q_weight.shape[0] = 32; }),
                  {"q_weight shape [32]", "[head_dim] = [64]"});
  expect_rejected(qk([](fixture& f) { f.norm.k_weight.reset(); }),
                  {"k_weight is required when k is given"});
  expect_rejected(qk([](fixture& f) {
                    f.x.k.reset();
                    f.x.k_out.reset();
                  }),
                  {"k_weight is given but k is not"});
  expect_rejected(qk([](fixture& f) { f.norm.eps = -1e-6; }), {"eps (-0.000001)", ">= 0"});
  expect_rejected(qk([](fixture& f) { f.norm.eps = std::nan(""); }), {"eps (nan)"});
  expect_rejected(qk([](fixture& f) { f.norm.k_weight->type = dtype::i64; }),
                  {"k_weight dtype (i64)"});
  expect_rejected(qk([](fixture& f) {
                    f.norm.rounding = qk_norm_rounding::hf_qwen3;
                    f.style = rope_style::gptj;
                  }),
                  {"hf_qwen3", "style neox"});
  expect_rejected(qk([](fixture& f) { f.options.backward = true; }), {"qk_norm_rope_backward"});
  expect_rejected(qk([](fixture& f) {
                    f.norm.q_weight = tensor_view::contiguous(f.q_out.data(), dtype::f32, {64});
                  }),
                  {"q_out [5, 4, 64] overlaps q_weight [64]"});
  EXPECT_EQ(qk_norm_rounding_from_string("hf_qwen3"), qk_norm_rounding::hf_qwen3);
  EXPECT_THROW(qk_norm_rounding_from_string("bf16"), error);
}

TEST(Validation, QkNormBackward) {
  using call = fixture::call;
  {
    fixture f;
    f.mode = call::qk_norm_backward;
    f.run();
    EXPECT_FALSE(f.outputs_untouched());
  }
  auto back = [](std::function<void(fixture&)> also) {
    return [also](fixture& f) {
      f.mode = call::qk_norm_backward;
      also(f);
    };
  };
  expect_rejected(back([](fixture& f) { f.grads.dq_weight.type = dtype::f16; }),
                  {"dq_weight [64] f16", "f32"});
  expect_rejected(back([](fixture& f) { f.grads.dk_weight.reset(); }),
                  {"k, dk_out and dk_weight go together", "dk_weight absent"});
  expect_rejected(back([](fixture& f) { f.grads.q.shape[1] = 3; }),
                  {"q shape [5, 3, 64] must equal dq_out shape [5, 4, 64]"});
  expect_rejected(back([](fixture& f) { f.norm.rounding = qk_norm_rounding::hf_qwen3; }),
                  {"fp32_once", "hf_qwen3"});
  expect_rejected(back([](fixture& f) { f.options.backward = true; }),
                  {"options.backward must be false"});
  expect_rejected(back([](fixture& f) {
                    f.grads.dq_weight = tensor_view::contiguous(f.q_fwd.data(), dtype::f32, {64});
                  }),
                  {"dq_weight [64] overlaps q [5, 4, 64]"});
  expect_rejected(back([](fixture& f) { f.grads.dq = f.grads.q; }),
                  {"dq [5, 4, 64] overlaps q [5, 4, 64]"});
}

}  // namespace

namespace {

using namespace tilerope;

TEST(Validation, OffsetOverflowAndEpsRange) {
  expect_rejected(
      [](fixture& f) {
        f.positions = rope_positions::from_offset(std::numeric_limits<std::int64_t>::max() - 2);
      },
      {"position offset (9223372036854775805) + 5 tokens overflows int64"});
  expect_rejected(
      [](fixture& f) {
        f.mode = fixture::call::qk_norm;
        f.norm.eps = 1e-50;
      },
      {"eps (1e-50)", "normal fp32"});
  expect_rejected(
      [](fixture& f) {
        f.mode = fixture::call::qk_norm;
        f.norm.eps = 1e39;
      },
      {"eps (1e+39)"});
}

TEST(Validation, BackwardNamesItsOwnArguments) {
  using call = fixture::call;
  auto back = [](std::function<void(fixture&)> also) {
    return [also](fixture& f) {
      f.mode = call::qk_norm_backward;
      also(f);
    };
  };
  expect_rejected(back([](fixture& f) { f.grads.dq_out.rank = 2; }), {"dq_out must have rank 3"});
  expect_rejected(back([](fixture& f) { f.grads.dq->shape[0] = 4; }),
                  {"dq shape [4, 4, 64] must equal dq_out shape [5, 4, 64]"});
  expect_rejected(back([](fixture& f) { f.grads.dk_out->shape[2] = 32; }),
                  {"dk_out head_dim (32) must equal dq_out head_dim (64)"});
  expect_rejected(back([](fixture& f) { f.grads.q.type = dtype::f16; }),
                  {"q dtype (f16) must match dq_out dtype (f32)"});
}

}  // namespace

namespace {

using namespace tilerope;

// Views whose element counts or offsets overflow int64 are refused where they are made, and
// again by the API when their public fields were set by hand.
TEST(Validation, ViewsPastTwoToTheSixtyAreRefused) {
  const std::int64_t big = std::int64_t{1} << 62;
  float x = 0;
  EXPECT_THROW(tensor_view::contiguous(&x, dtype::f32, {0, big, big}), error);
  EXPECT_THROW(tensor_view::contiguous(&x, dtype::f32, {0, 4, big}), error);
  EXPECT_THROW(tensor_view(&x, dtype::f32, {2, 2}, {big, 1}), error);
  EXPECT_THROW(tensor_view(&x, dtype::f32, {3, 2}, {INT64_MIN, 1}), error);
  EXPECT_NO_THROW(tensor_view(&x, dtype::f32, {1, 1}, {INT64_MIN, 1}));  // never stepped
  expect_rejected([&](fixture& f) { f.x.q.strides[0] = big; }, {"q shape [5, 4, 64]", "2^60"});
  expect_rejected([&](fixture& f) { f.x.k->rank = 9; }, {"k rank (9)"});
  expect_rejected([&](fixture& f) { f.x.q_out->shape[1] = -4; }, {"q_out shape", "negative"});
  expect_rejected([&](fixture& f) { f.x.q.type = static_cast<dtype>(200); }, {"q dtype (200)"});
  expect_rejected([&](fixture& f) { f.positions.ids.rank = -1; }, {"positions rank (-1)"});
  expect_rejected(
      [&](fixture& f) {
        f.mode = fixture::call::qk_norm;
        f.norm.q_weight.rank = 6;
      },
      {"q_weight rank (6)"});
  expect_rejected(
      [&](fixture& f) {
        f.mode = fixture::call::qk_norm_backward;
        f.grads.dk_weight->rank = 7;
      },
      {"dk_weight rank (7)"});
}

}  // namespace
