// The tile layer: every rule broken once (and its message checked), loop chunking, valid_shape,
// and the ops' arithmetic on small data.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tilerope/error.h"
#include "tilerope/tile.h"

namespace {

using namespace tilerope;
using namespace tilerope::tile;
using tile::tensor;

// A kernel over in [4, 8, 32] f32 (values i) and out [4, 8, 32] f32 (sentinel -1).
struct fixture {
  std::vector<float> in_data = std::vector<float>(4 * 8 * 32),
                     out_data = std::vector<float>(4 * 8 * 32, -1.0f);
  tensor in{"in", tensor_view::contiguous(in_data.data(), dtype::f32, {4, 8, 32})};
  tensor out{"out", tensor_view::contiguous(out_data.data(), dtype::f32, {4, 8, 32})};
  fixture() {
    for (std::size_t i = 0; i < in_data.size(); ++i) in_data[i] = static_cast<float>(i);
  }
  kernel_report run(const std::function<void()>& body, std::size_t ub = 192 * 1024) {
    return run_kernel("test", {in}, {out}, body, {ub});
  }
  bool out_untouched() const {
    for (float v : out_data)
      if (v != -1.0f) return false;
    return true;
  }
};

// The message of the error `body` raises inside a kernel ("" when none is raised).
std::string error_of(fixture& f, const std::function<void()>& body, std::size_t ub = 192 * 1024) {
  try {
    f.run(body, ub);
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(msg, needle) EXPECT_NE((msg).find(needle), std::string::npos) << (msg)

TEST(TileRules, TileShapeRankAndDims) {
  fixture f;
  EXPECT_HAS(error_of(f, [] { set_vec_tile_shapes({1, 1, 1, 1, 32}); }), "1..4 dims, got 5");
  EXPECT_HAS(error_of(f, [] { set_vec_tile_shapes({1, 0, 32}); }), "every dim must be > 0");
  EXPECT_HAS(error_of(f,
                      [&] {
                        set_vec_tile_shapes({1, 8});
                        neg(view(f.in, {1, 8, 32}, {0, 0, 0}));
                      }),
             "tile shape [1, 8] has rank 2 but the op's output [1, 8, 32] has rank 3");
  EXPECT_HAS(error_of(f, [&] { neg(view(f.in, {1, 8, 32}, {0, 0, 0})); }), "no tile shape set");
  EXPECT_TRUE(f.out_untouched());
}

TEST(TileRules, LastTileDimIsAMultipleOf32Bytes) {
  fixture f;
  const std::string msg = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 12});
    neg(view(f.in, {1, 8, 32}, {0, 0, 0}));
  });
  EXPECT_HAS(msg, "last dim (12) * sizeof(f32) = 48 bytes is not a multiple of 32 bytes");
  // 8 f32 = 32 bytes is fine; bf16 needs 16
  EXPECT_EQ(error_of(f,
                     [&] {
                       set_vec_tile_shapes({1, 8, 8});
                       assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {0, 0, 0}, f.out);
                     }),
            "");
  EXPECT_HAS(error_of(f,
                      [&] {
                        set_vec_tile_shapes({1, 8, 8});
                        cast(view(f.in, {1, 8, 32}, {0, 0, 0}), dtype::bf16);
                      }),
             "sizeof(bf16) = 16 bytes");
}

TEST(TileRules, Concat) {
  fixture f;
  auto v = [&](std::int64_t w) { return view(f.in, {1, 8, w}, {0, 0, 0}); };
  auto tiled = [&](std::function<void()> body) {
    return error_of(f, [&] {
      set_vec_tile_shapes({1, 8, 32});
      body();
    });
  };
  EXPECT_HAS(tiled([&] { concat({v(32)}, -1); }), "1 inputs; concat takes 2..128");
  EXPECT_HAS(tiled([&] { concat(std::vector<value>(129, v(8)), -1); }), "129 inputs");
  EXPECT_HAS(tiled([&] {
               concat({v(8), cast(v(8), dtype::f16)}, -1);
             }),
             "input 1 is f16, input 0 is f32");
  EXPECT_HAS(tiled([&] {
               concat({v(32), reshape(view(f.in, {1, 8, 32}, {0, 0, 0}), {8, 32})}, -1);
             }),
             "differ in rank");
  EXPECT_HAS(tiled([&] {
               concat({v(8), view(f.in, {1, 4, 8}, {0, 0, 0})}, -1);
             }),
             "differ in dim 1");
  EXPECT_HAS(tiled([&] {
               concat({v(8), view(f.in, {1, 8, 8}, {0, 0, 0}, shape_t{1, 8, 4})}, -1);
             }),
             "valid for 4 of 8 along the concat dim 2; it must be fully valid");
  EXPECT_EQ(tiled([&] {
              concat({v(8), view(f.in, {1, 8, 8}, {0, 0, 0}, shape_t{1, 4, 8})}, -1);
            }),
            "");
}

TEST(TileRules, BoundsCyclesAndOutputs) {
  fixture f;
  EXPECT_HAS(error_of(f, [&] { view(f.in, {2, 8, 32}, {3, 0, 0}); }), "at offsets [3, 0, 0]");
  EXPECT_HAS(error_of(f, [&] { view(f.in, {2, 8, 32}, {3, 0, 0}); }), "is out of bounds");
  // a tail window may reach past the end when its valid region does not
  EXPECT_EQ(error_of(f, [&] { view(f.in, {2, 8, 32}, {3, 0, 0}, shape_t{1, 8, 32}); }), "");
  EXPECT_HAS(error_of(f,
                      [&] {
                        set_vec_tile_shapes({1, 8, 32});
                        assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {4, 0, 0}, f.out);
                      }),
             "assemble into 'out' with shape [1, 8, 32] at offsets [4, 0, 0]");
  EXPECT_HAS(error_of(f,
                      [&] {
                        view(f.out, {1, 8, 32}, {0, 0, 0});
                      }),
             "reading a kernel output before it is written");
  EXPECT_HAS(error_of(f,
                      [&] {
                        set_vec_tile_shapes({1, 8, 32});
                        assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {0, 0, 0}, f.out);
                        view(f.out, {1, 8, 32}, {0, 0, 0});
                      }),
             "a cycle");
  EXPECT_HAS(error_of(f,
                      [&] {
                        set_vec_tile_shapes({1, 8, 32});
                        assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {0, 0, 0}, f.in);
                      }),
             "assemble into 'in': it is not an output");
  EXPECT_TRUE(f.out_untouched());  // the checking pass raised before anything was written
}

TEST(TileRules, AssembleIntoAViewedTensorIsACycle) {
  // A tensor both viewed and assembled: registered as an output, viewing it already fails;
  // registered as input and output at once, the assemble is the cycle.
  std::vector<float> data(8 * 32, 1.0f);
  tensor t("t", tensor_view::contiguous(data.data(), dtype::f32, {8, 32}));
  std::string msg;
  try {
    run_kernel("cycle", {t}, {t}, [&] {
      set_vec_tile_shapes({8, 32});
      value v = neg(view(t, {8, 32}, {0, 0}));
      assemble(v, {0, 0}, t);
    });
  } catch (const error& e) {
    msg = e.what();
  }
  EXPECT_FALSE(msg.empty());
}

TEST(TileRules, MixedDtypes) {
  fixture f;
  for (auto op : {+[](const value&a, const value&b) { return add(a, b); },
                  +[](const value&a, const value&b) { return sub(a, b); },
                  +[](const value&a, const value&b) { return mul(a, b); }}) {
    EXPECT_HAS(error_of(f,
                        [&] {
                          set_vec_tile_shapes({1, 8, 32});
                          value a = view(f.in, {1, 8, 32}, {0, 0, 0});
                          op(a, cast(a, dtype::bf16));
                        }),
               "dtypes differ (f32 and bf16)");
  }
}

TEST(TileRules, UbBudget) {
  fixture f;
  // one [1, 8, 32] f32 tile is 1 KiB; mul holds its output and two inputs: 3 KiB
  const std::string msg = error_of(
      f,
      [&] {
        set_vec_tile_shapes({1, 8, 32});
        value a = view(f.in, {1, 8, 32}, {0, 0, 0});
        assemble(mul(a, a), {0, 0, 0}, f.out);
      },
      2048);
  EXPECT_HAS(msg, "UB overflow");
  EXPECT_HAS(msg, "op 'view' with tile");
  EXPECT_HAS(msg, "needs 1024 bytes more with 2048 live; the UB holds 2048 bytes");
  EXPECT_TRUE(f.out_untouched());
  const auto report = f.run(
      [&] {
        set_vec_tile_shapes({1, 8, 32});
        value a = view(f.in, {1, 8, 32}, {0, 0, 0});
        assemble(mul(a, a), {0, 0, 0}, f.out);
      },
      3072);
  EXPECT_EQ(report.peak_ub_bytes, 3072u);
}

TEST(TileLoop, ChunksFollowTheUnrollFormula) {
  auto chunks = loop_chunks(0, 13, 1, {8, 4, 2});
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ((std::vector<std::int64_t>{chunks[0].begin, chunks[0].end, chunks[0].factor}),
            (std::vector<std::int64_t>{0, 8, 8}));
  EXPECT_EQ((std::vector<std::int64_t>{chunks[1].begin, chunks[1].end, chunks[1].factor}),
            (std::vector<std::int64_t>{8, 12, 4}));
  EXPECT_EQ((std::vector<std::int64_t>{chunks[2].begin, chunks[2].end, chunks[2].factor}),
            (std::vector<std::int64_t>{12, 13, 1}));
  auto same = loop_chunks(0, 13, 1, {2, 8, 4, 8});
  ASSERT_EQ(same.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(same[i].end, chunks[i].end);
  auto over = loop_chunks(0, 3, 1, {8});  // a factor above the trip count: no stretch
  ASSERT_EQ(over.size(), 1u);
  EXPECT_EQ(over[0].begin, 0);
  EXPECT_EQ(over[0].end, 3);
  EXPECT_EQ(over[0].factor, 1);
  auto stepped = loop_chunks(0, 13, 2, {4});  // 7 trips: [0, 8) by 4, then [8, 13) by 1
  ASSERT_EQ(stepped.size(), 2u);
  EXPECT_EQ(stepped[0].end, 8);
  EXPECT_EQ(stepped[1].begin, 8);
  EXPECT_EQ(stepped[1].end, 13);
  EXPECT_THROW(loop_chunks(0, 4, 0, {}), error);
  EXPECT_THROW(loop_chunks(0, 4, 1, {0}), error);
}

TEST(TileLoop, BodySeesEveryIndexAndOnlyInnermostLoopsUnroll) {
  fixture f;
  std::vector<std::int64_t> seen;
  const auto report =
      f.run([&] { loop(0, 13, 2, "i", {4}, [&](std::int64_t i) { seen.push_back(i); }); });
  // the body runs in the checking pass and again in the executing pass
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 2, 4, 6, 8, 10, 12, 0, 2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(report.chunks.size(), 2u);
  EXPECT_HAS(error_of(f,
                      [] {
                        loop(0, 4, 1, "outer", {2}, [](std::int64_t) {
                          loop(0, 2, 1, "inner", {1}, [](std::int64_t) {});
                        });
                      }),
             "loop 'inner' is nested in loop 'outer', which is unrolled");
  EXPECT_EQ(error_of(f,
                     [] {
                       loop(0, 4, 1, "outer", {1}, [](std::int64_t) {
                         loop(0, 4, 1, "inner", {4, 2}, [](std::int64_t) {});
                       });
                     }),
            "");
}

TEST(TileValidShape, ReadsZerosPastItAndAssemblesOnlyIt) {
  fixture f;
  f.run([&] {
    set_vec_tile_shapes({1, 8, 32});
    value v = view(f.in, {1, 8, 32}, {1, 0, 0}, shape_t{1, 5, 32});  // rows 5..7 read as 0
    value w = view(f.in, {1, 8, 32}, {2, 0, 0});
    assemble(add(mul(w, 0.0), v), {0, 0, 0}, f.out);  // valid [1, 5, 32]: 5 rows written
    assemble(sum(v, 1, true), {3, 0, 0}, f.out);      // the zeros add nothing
  });
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 32; ++c) {
      EXPECT_EQ(f.out_data[r * 32 + c], r < 5 ? f.in_data[(8 + r) * 32 + c] : -1.0f)
          << r << "," << c;
    }
  }
  for (int c = 0; c < 32; ++c) {
    float want = 0;
    for (int r = 0; r < 5; ++r) want += f.in_data[(8 + r) * 32 + c];
    EXPECT_EQ(f.out_data[3 * 8 * 32 + c], want);
    EXPECT_EQ(f.out_data[3 * 8 * 32 + 32 + c], -1.0f);
  }
}

// Runs `make` on small inputs and returns the assembled result, as doubles.
std::vector<float> evaluate(const std::vector<float>& a_data, const shape_t& a_shape,
                            const std::vector<float>& b_data, const shape_t& b_shape,
                            const shape_t& out_shape,
                            const std::function<value(const value&, const value&)>& make,
                            const shape_t& tile) {
  std::vector<float> a = a_data, b = b_data;
  std::int64_t n = 1;
  for (auto d : out_shape) n *= d;
  std::vector<float> out(static_cast<std::size_t>(n), -1.0f);
  tensor ta("a", tensor_view::contiguous(a.data(), dtype::f32, a_shape));
  tensor tb("b", tensor_view::contiguous(b.data(), dtype::f32, b_shape));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, out_shape));
  run_kernel("ops", {ta, tb}, {to}, [&] {
    set_vec_tile_shapes(tile);
    assemble(make(view(ta, a_shape, shape_t(a_shape.size(), 0)),
                  view(tb, b_shape, shape_t(b_shape.size(), 0))),
             shape_t(out_shape.size(), 0), to);
  });
  return out;
}

TEST(TileOps, ElementwiseAndBroadcast) {
  std::vector<float> a(2 * 8), b(3 * 8);
  for (int i = 0; i < 16; ++i) a[i] = 1.0f + i;
  for (int i = 0; i < 24; ++i) b[i] = 0.5f * (i + 1);
  const shape_t as = {2, 1, 8}, bs = {1, 3, 8}, os = {2, 3, 8};
  auto at = [&](const std::vector<float>& v, int i, int j, int k, bool is_a) {
    return is_a ? v[i * 8 + k] : v[j * 8 + k];
  };
  const std::vector<std::pair<std::function<value(const value&, const value&)>,
                              std::function<float(float, float)>>>
      ops = {{[](auto& x, auto& y) { return add(x, y); }, [](float x, float y) { return x + y; }},
             {[](auto& x, auto& y) { return sub(x, y); }, [](float x, float y) { return x - y; }},
             {[](auto& x, auto& y) { return mul(x, y); }, [](float x, float y) { return x * y; }},
             {[](auto& x, auto& y) { return div(x, y); }, [](float x, float y) { return x / y; }},
             {[](auto& x, auto& y) { return add(neg(x), rsqrt(y)); },
              [](float x, float y) { return -x + 1.0f / std::sqrt(y); }}};
  for (const auto& [make, want] : ops) {
    const auto out = evaluate(a, as, b, bs, os, make, {1, 2, 8});
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 8; ++k)
          EXPECT_FLOAT_EQ(out[(i * 3 + j) * 8 + k],
                          want(at(a, i, j, k, true), at(b, i, j, k, false)));
  }
}

TEST(TileOps, SumConcatGatherInterleaveExpandReshape) {
  std::vector<float> a(4 * 16), b(4 * 16);
  for (int i = 0; i < 64; ++i) a[i] = static_cast<float>(i), b[i] = 100.0f + i;
  const shape_t s = {4, 16};
  auto sum_keep =
      evaluate(a, s, b, s, {4, 1}, [](auto& x, auto&) { return sum(x, -1, true); }, {4, 8});
  auto sum_drop = evaluate(a, s, b, s, {16}, [](auto& x, auto&) { return sum(x, 0, false); }, {8});
  for (int r = 0; r < 4; ++r) {
    float want = 0;
    for (int c = 0; c < 16; ++c) want += a[r * 16 + c];
    EXPECT_EQ(sum_keep[r], want);
  }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(sum_drop[c], a[c] + a[16 + c] + a[32 + c] + a[48 + c]);
  auto cat_last = evaluate(a, s, b, s, {4, 32},
                           [](auto& x, auto& y) {
                             return concat({x, y}, -1);
                           },
                           {4, 8});
  auto cat_first = evaluate(a, s, b, s, {8, 16},
                            [](auto& x, auto& y) {
                              return concat({x, y}, 0);
                            },
                            {3, 8});
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 32; ++c)
      EXPECT_EQ(cat_last[r * 32 + c], c < 16 ? a[r * 16 + c] : b[r * 16 + c - 16]);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 16; ++c)
      EXPECT_EQ(cat_first[r * 16 + c], r < 4 ? a[r * 16 + c] : b[(r - 4) * 16 + c]);
  auto even =
      evaluate(a, s, b, s, {4, 8}, [](auto& x, auto&) { return deinterleave(x).first; }, {4, 8});
  auto odd = evaluate(a, s, b, s, {4, 8}, [](auto& x, auto&) { return gathermask(x, 2); }, {4, 8});
  auto even2 =
      evaluate(a, s, b, s, {4, 8}, [](auto& x, auto&) { return gathermask(x, 1); }, {4, 8});
  auto odd2 =
      evaluate(a, s, b, s, {4, 8}, [](auto& x, auto&) { return deinterleave(x).second; }, {4, 8});
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(even[r * 8 + k], a[r * 16 + 2 * k]);
      EXPECT_EQ(even2[r * 8 + k], a[r * 16 + 2 * k]);
      EXPECT_EQ(odd[r * 8 + k], a[r * 16 + 2 * k + 1]);
      EXPECT_EQ(odd2[r * 8 + k], a[r * 16 + 2 * k + 1]);
    }
  auto round_trip = evaluate(a, s, b, s, s,
                             [](auto& x, auto&) {
                               auto [e, o] = deinterleave(x);
                               return interleave(e, o);
                             },
                             {4, 8});
  EXPECT_EQ(round_trip, a);
  std::vector<float> row(16);
  for (int i = 0; i < 16; ++i) row[i] = 3.0f * i;
  auto expanded = evaluate(row, {1, 16}, b, s, {4, 16},
                           [](auto& x, auto&) {
                             return expand_clone(x, {4, 16});
                           },
                           {2, 8});
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 16; ++c) EXPECT_EQ(expanded[r * 16 + c], row[c]);
  auto reshaped = evaluate(a, s, b, s, {8, 8},
                           [](auto& x, auto&) {
                             return add(reshape(x, {8, 8}), 1.0);
                           },
                           {8, 8});
  for (int i = 0; i < 64; ++i) EXPECT_EQ(reshaped[i], a[i] + 1.0f);
  fixture f;
  EXPECT_HAS(error_of(f,
                      [&] {
                        reshape(view(f.in, {1, 8, 16}, {0, 0, 0}), {8, 16});
                      }),
             "must be a fully valid view of contiguous memory");
}

TEST(TileOps, CastModesAndBf16Rounding) {
  std::vector<float> a = {1.00390625f, 1.01171875f, -1.00390625f, 1.5f, 2.7f, -2.7f, 0.0f, 1.0f};
  a.resize(16, 1.0f);
  auto run_mode = [&](cast_mode m) {
    std::vector<float> in = a;
    std::vector<std::uint16_t> out(16);
    tensor ti("in", tensor_view::contiguous(in.data(), dtype::f32, {16}));
    tensor to("out", tensor_view::contiguous(out.data(), dtype::bf16, {16}));
    run_kernel("cast", {ti}, {to}, [&] {
      set_vec_tile_shapes({16});
      assemble(cast(view(ti, {16}, {0}), dtype::bf16, m), {0}, to);
    });
    std::vector<float> v;
    for (auto b : out) v.push_back(bf16_bits_to_f32(b));
    return v;
  };
  const auto rint = run_mode(cast_mode::rint);
  EXPECT_EQ(rint[0], 1.0f);            // 1 + 2^-8: a tie, to even
  EXPECT_EQ(rint[1], 1.0f + 0x1p-6f);  // 1 + 3 * 2^-8: a tie, to even (up)
  EXPECT_EQ(rint[2], -1.0f);
  EXPECT_EQ(run_mode(cast_mode::round)[0], 1.0f + 0x1p-7f);  // ties away from zero
  EXPECT_EQ(run_mode(cast_mode::trunc)[4], 2.6875f);         // 2.7 toward zero
  EXPECT_EQ(run_mode(cast_mode::floor)[5], -2.703125f);      // -2.7 down
  EXPECT_EQ(run_mode(cast_mode::ceil)[4], 2.703125f);        // 2.7 up
  EXPECT_EQ(run_mode(cast_mode::ceil)[5], -2.6875f);
  // arithmetic on bf16 values rounds each result to bf16
  std::vector<std::uint16_t> x(16, f32_to_bf16_bits(1.0f)), y(16, f32_to_bf16_bits(0x1p-8f)),
      out(16);
  tensor tx("x", tensor_view::contiguous(x.data(), dtype::bf16, {16}));
  tensor ty("y", tensor_view::contiguous(y.data(), dtype::bf16, {16}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::bf16, {16}));
  run_kernel("bf16", {tx, ty}, {to}, [&] {
    set_vec_tile_shapes({16});
    value v = add(add(view(tx, {16}, {0}), view(ty, {16}, {0})), view(ty, {16}, {0}));
    assemble(v, {0}, to);
  });
  EXPECT_EQ(bf16_bits_to_f32(out[0]),
            1.0f);  // (1 + 2^-8) rounds to 1 at each add; fp32 would give 1 + 2^-7
}

TEST(TileReport, PeakUbIsTiledNotWholeView) {
  std::vector<float> in(4 * 64 * 32, 1.0f), out(in.size());
  tensor ti("in", tensor_view::contiguous(in.data(), dtype::f32, {4, 64, 32}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, {4, 64, 32}));
  const auto report = run_kernel("peak", {ti}, {to}, [&] {
    set_vec_tile_shapes({1, 8, 32});
    value v = view(ti, {4, 64, 32}, {0, 0, 0});
    assemble(add(mul(v, v), 1.0), {0, 0, 0}, to);
  });
  EXPECT_GT(report.peak_ub_bytes, 0u);
  EXPECT_LT(report.peak_ub_bytes, 4u * 64 * 32 * 4);
  EXPECT_EQ(report.tiles, 4 * 8);
  EXPECT_EQ(report.assembles, 1);
  for (float v : out) EXPECT_EQ(v, 2.0f);
}

TEST(TileRules, OpsOutsideAKernelAreErrors) {
  std::vector<float> d(32);
  tensor t("t", tensor_view::contiguous(d.data(), dtype::f32, {32}));
  try {
    view(t, {32}, {0});
    FAIL();
  } catch (const error& e) {
    EXPECT_HAS(std::string(e.what()), "outside a kernel");
  }
}

}  // namespace
