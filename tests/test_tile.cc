// The tile layer: every rule broken once inside run_kernel (and its message checked), the
// checking pass that writes nothing, loop chunking, valid_shape, the UB accounting, and the
// ops' arithmetic on small data against values computed here.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tilerope/dtype.h"
#include "tilerope/error.h"
#include "tilerope/tile.h"

namespace {

using namespace tilerope;
using namespace tilerope::tile;
using tile::tensor;

constexpr float sentinel = -1.0f;

// A kernel over in [4, 8, 32] f32 (element i holds i) and out [4, 8, 32] f32 (the sentinel).
struct fixture {
  std::vector<float> in_data = std::vector<float>(4 * 8 * 32);
  std::vector<float> out_data = std::vector<float>(4 * 8 * 32, sentinel);
  tensor in{"in", tensor_view::contiguous(in_data.data(), dtype::f32, {4, 8, 32})};
  tensor out{"out", tensor_view::contiguous(out_data.data(), dtype::f32, {4, 8, 32})};

  fixture() {
    for (std::size_t i = 0; i < in_data.size(); ++i) in_data[i] = static_cast<float>(i);
  }
  kernel_report run(const std::function<void()>& body, std::size_t ub = 192 * 1024) {
    return run_kernel("test", {in}, {out}, body, {ub});
  }
  float in_at(int b, int r, int c) const { return in_data[(b * 8 + r) * 32 + c]; }
  float out_at(int b, int r, int c) const { return out_data[(b * 8 + r) * 32 + c]; }
  bool out_untouched() const {
    for (float v : out_data)
      if (v != sentinel) return false;
    return true;
  }
};

// The what() of the tilerope::error that running `body` in f's kernel raises ("" if none).
std::string error_of(fixture& f, const std::function<void()>& body, std::size_t ub = 192 * 1024) {
  try {
    f.run(body, ub);
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

// The what() of the tilerope::error that `fn` raises ("" if none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult contains(const std::string& message, const std::string& needle) {
  if (message.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << message << "\" does not contain \"" << needle << "\"";
}

using chunk_tuple = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

std::vector<chunk_tuple> as_tuples(const std::vector<loop_chunk>& chunks) {
  std::vector<chunk_tuple> out;
  for (const auto& c : chunks) out.emplace_back(c.begin, c.end, c.factor);
  return out;
}

// How many elements of `out` no longer hold the sentinel.
std::int64_t count_written(const std::vector<float>& out) {
  return std::count_if(out.begin(), out.end(), [](float v) { return v != sentinel; });
}

std::int64_t numel(const shape_t& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// An f32 input of the small op tests.
struct input {
  std::vector<float> data;
  shape_t shape;
};

// Views each input whole, assembles make(views) (created under `tile`) into an f32 output of
// out_shape filled with the sentinel, and returns the output.
std::vector<float> evaluate(const std::vector<input>& inputs, const shape_t& out_shape,
                            const shape_t& tile,
                            const std::function<value(const std::vector<value>&)>& make) {
  std::vector<std::vector<float>> data;
  for (const auto& x : inputs) data.push_back(x.data);
  std::vector<tensor> tensors;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    tensors.emplace_back("in" + std::to_string(k),
                         tensor_view::contiguous(data[k].data(), dtype::f32, inputs[k].shape));
  }
  std::vector<float> out(static_cast<std::size_t>(numel(out_shape)), sentinel);
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, out_shape));
  run_kernel("ops", tensors, {to}, [&] {
    std::vector<value> views;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      views.push_back(view(tensors[k], inputs[k].shape, shape_t(inputs[k].shape.size(), 0)));
    }
    set_vec_tile_shapes(tile);
    assemble(make(views), shape_t(out_shape.size(), 0), to);
  });
  return out;
}

std::vector<float> iota(std::int64_t n, float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = offset + scale * static_cast<float>(i);
  return v;
}

// ---- tile shape rules ----------------------------------------------------------------------

TEST(TileRules, TileRankAboveFour) {
  fixture f;
  const std::string msg = error_of(f, [] { set_vec_tile_shapes({1, 1, 1, 8, 32}); });
  EXPECT_TRUE(contains(msg, "set_vec_tile_shapes[1, 1, 1, 8, 32]"));
  EXPECT_TRUE(contains(msg, "a tile has 1..4 dims, got 5"));
  EXPECT_TRUE(contains(error_of(f, [] { set_vec_tile_shapes({}); }), "got 0"));
  EXPECT_EQ(error_of(f, [] { set_vec_tile_shapes({1, 1, 8, 32}); }), "");
}

TEST(TileRules, TileDimNotPositive) {
  fixture f;
  std::string msg = error_of(f, [] { set_vec_tile_shapes({1, 0, 32}); });
  EXPECT_TRUE(contains(msg, "[1, 0, 32]"));
  EXPECT_TRUE(contains(msg, "every dim must be > 0"));
  msg = error_of(f, [] { set_vec_tile_shapes({-2, 8, 32}); });
  EXPECT_TRUE(contains(msg, "[-2, 8, 32]"));
  EXPECT_TRUE(contains(msg, "every dim must be > 0"));
}

TEST(TileRules, LastTileDimNotAMultipleOf32Bytes) {
  fixture f;
  const std::string msg = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 12});
    neg(view(f.in, {1, 8, 32}, {0, 0, 0}));
  });
  EXPECT_TRUE(contains(msg, "op 'neg'"));
  EXPECT_TRUE(contains(msg, "tile shape [1, 8, 12]"));
  EXPECT_TRUE(contains(msg, "last dim (12) * sizeof(f32) = 48 bytes"));
  EXPECT_TRUE(contains(msg, "not a multiple of 32 bytes"));
  // the rule is on the op's dtype: 8 bf16 elements are 16 bytes, 16 are 32
  const std::string bf16_msg = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 8});
    cast(view(f.in, {1, 8, 32}, {0, 0, 0}), dtype::bf16);
  });
  EXPECT_TRUE(contains(bf16_msg, "op 'cast'"));
  EXPECT_TRUE(contains(bf16_msg, "sizeof(bf16) = 16 bytes"));
  EXPECT_EQ(error_of(f,
                     [&] {
                       set_vec_tile_shapes({1, 8, 16});
                       cast(view(f.in, {1, 8, 32}, {0, 0, 0}), dtype::bf16);
                     }),
            "");
  EXPECT_TRUE(f.out_untouched());
}

TEST(TileRules, TileOf32BytesRunsAndComputes) {
  fixture f;  // an f32 tile [1, 8, 8]: 4 tiles per [1, 8, 32] view
  const auto report = f.run([&] {
    set_vec_tile_shapes({1, 8, 8});
    assemble(neg(view(f.in, {1, 8, 32}, {1, 0, 0})), {0, 0, 0}, f.out);
  });
  EXPECT_EQ(report.tiles, 4);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 32; ++c) EXPECT_EQ(f.out_at(0, r, c), -f.in_at(1, r, c));
  EXPECT_EQ(f.out_at(1, 0, 0), sentinel);
}

TEST(TileRules, TileRankDiffersFromOutputRank) {
  fixture f;
  const std::string msg = error_of(f, [&] {
    set_vec_tile_shapes({8, 32});
    neg(view(f.in, {1, 8, 32}, {0, 0, 0}));
  });
  EXPECT_TRUE(contains(msg, "op 'neg'"));
  EXPECT_TRUE(contains(msg, "tile shape [8, 32] has rank 2"));
  EXPECT_TRUE(contains(msg, "the op's output [1, 8, 32] has rank 3"));
}

TEST(TileRules, OpWithNoTileShape) {
  fixture f;
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  neg(view(f.in, {1, 8, 32}, {0, 0, 0}));
                                }),
                       "op 'neg': no tile shape set"));
  // the tile shape is kernel state: it does not survive into the executing pass's start
  int calls = 0;
  const std::string msg = error_of(f, [&] {
    if (calls++ == 0) set_vec_tile_shapes({1, 8, 32});
    add(view(f.in, {1, 8, 32}, {0, 0, 0}), 1.0);
  });
  EXPECT_TRUE(contains(msg, "op 'add': no tile shape set"));
  EXPECT_EQ(calls, 2);
}

// ---- concat rules --------------------------------------------------------------------------

// The error of concat(make()) in f's kernel under tile [1, 8, 32].
std::string concat_error(fixture& f, const std::function<std::vector<value>()>& make,
                         int dim = -1) {
  return error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 32});
    concat(make(), dim);
  });
}

TEST(TileConcat, OneInput) {
  fixture f;
  const std::string msg = concat_error(f, [&] {
    return std::vector<value>{view(f.in, {1, 8, 32}, {0, 0, 0})};
  });
  EXPECT_TRUE(contains(msg, "op 'concat': 1 inputs; concat takes 2..128"));
}

TEST(TileConcat, OneHundredTwentyNineInputs) {
  fixture f;
  const std::string msg = concat_error(f, [&] {
    return std::vector<value>(129, view(f.in, {1, 8, 8}, {0, 0, 0}));
  });
  EXPECT_TRUE(contains(msg, "op 'concat': 129 inputs; concat takes 2..128"));
  EXPECT_EQ(concat_error(
                f,
                [&] {
                  return std::vector<value>(128, view(f.in, {1, 8, 32}, {0, 0, 0}));
                },
                0),
            "");
}

TEST(TileConcat, MixedDtype) {
  fixture f;
  const std::string msg = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 32});
    value a = view(f.in, {1, 8, 32}, {0, 0, 0});
    concat({a, a, cast(a, dtype::bf16)}, -1);
  });
  EXPECT_TRUE(contains(msg, "op 'concat': input 2 is bf16, input 0 is f32"));
}

TEST(TileConcat, MixedRank) {
  fixture f;
  const std::string msg = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 32});
    value a = view(f.in, {1, 8, 32}, {0, 0, 0});
    concat({a, reshape(a, {8, 32})}, -1);
  });
  EXPECT_TRUE(contains(msg, "op 'concat': input 1 [8, 32] and input 0 [1, 8, 32] differ in rank"));
}

TEST(TileConcat, UnequalOtherDims) {
  fixture f;
  const std::string msg = concat_error(f, [&] {
    return std::vector<value>{view(f.in, {1, 8, 16}, {0, 0, 0}), view(f.in, {1, 4, 16}, {0, 0, 0})};
  });
  EXPECT_TRUE(contains(msg, "input 1 [1, 4, 16] and input 0 [1, 8, 16] differ in dim 1"));
  EXPECT_TRUE(contains(msg, "(not the concat dim 2)"));
  // along dim 1 the same inputs are fine, as are different sizes along the concat dim
  EXPECT_EQ(concat_error(
                f,
                [&] {
                  return std::vector<value>{view(f.in, {1, 8, 16}, {0, 0, 0}),
                                            view(f.in, {1, 4, 16}, {0, 0, 0})};
                },
                1),
            "");
}

TEST(TileConcat, PartiallyValidConcatDim) {
  fixture f;
  const std::string msg = concat_error(f, [&] {
    return std::vector<value>{view(f.in, {1, 8, 16}, {0, 0, 0}),
                              view(f.in, {1, 8, 16}, {0, 0, 0}, shape_t{1, 8, 12})};
  });
  EXPECT_TRUE(contains(msg, "input 1 is valid for 12 of 16 along the concat dim 2"));
  EXPECT_TRUE(contains(msg, "it must be fully valid"));
  // a partially valid other dim is allowed: the result carries the smaller valid shape
  fixture g;
  g.run([&] {
    set_vec_tile_shapes({1, 8, 32});
    value c = concat(
        {view(g.in, {1, 8, 16}, {0, 0, 0}), view(g.in, {1, 8, 16}, {0, 0, 16}, shape_t{1, 5, 16})},
        -1);
    EXPECT_EQ(c.valid_shape(), (shape_t{1, 5, 32}));
    assemble(c, {0, 0, 0}, g.out);
  });
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 32; ++c) EXPECT_EQ(g.out_at(0, r, c), r < 5 ? g.in_at(0, r, c) : sentinel);
}

// ---- bounds, cycles, inputs and outputs ----------------------------------------------------

TEST(TileRules, ViewOutOfBounds) {
  fixture f;
  const std::string msg = error_of(f, [&] { view(f.in, {2, 8, 32}, {3, 0, 0}); });
  EXPECT_TRUE(contains(msg, "view of 'in' with shape [2, 8, 32] at offsets [3, 0, 0]"));
  EXPECT_TRUE(contains(msg, "of [4, 8, 32] is out of bounds"));
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  view(f.in, {1, 8, 16}, {0, 0, 20});
                                }),
                       "at offsets [0, 0, 20]"));
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  view(f.in, {1, 8, 32}, {-1, 0, 0});
                                }),
                       "is out of bounds"));
  EXPECT_TRUE(contains(error_of(f, [&] { view(f.in, {8, 32}, {0, 0}); }), "ranks differ"));
  // a window of a value is checked against the value's shape
  const std::string of_value = error_of(f, [&] {
    value a = view(f.in, {1, 8, 32}, {0, 0, 0});
    view(a, {1, 8, 16}, {0, 0, 24});
  });
  EXPECT_TRUE(contains(of_value, "view of a [1, 8, 32] value with shape [1, 8, 16]"));
  EXPECT_TRUE(contains(of_value, "is out of bounds"));
  // a tail window may reach past the end when its valid region does not
  EXPECT_EQ(error_of(f, [&] { view(f.in, {2, 8, 32}, {3, 0, 0}, shape_t{1, 8, 32}); }), "");
}

TEST(TileRules, AssembleOutOfBounds) {
  fixture f;
  const std::string msg = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 32});
    assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {4, 0, 0}, f.out);
  });
  EXPECT_TRUE(contains(msg, "assemble into 'out' with shape [1, 8, 32] at offsets [4, 0, 0]"));
  EXPECT_TRUE(contains(msg, "is out of bounds"));
  EXPECT_TRUE(
      contains(error_of(f,
                        [&] {
                          set_vec_tile_shapes({1, 8, 32});
                          assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {0, 1, 0}, f.out);
                        }),
               "at offsets [0, 1, 0]"));
  // only the valid region must fit
  EXPECT_EQ(
      error_of(
          f,
          [&] {
            set_vec_tile_shapes({1, 8, 32});
            assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0}, shape_t{1, 4, 32})), {3, 4, 0}, f.out);
          }),
      "");
  EXPECT_EQ(f.out_at(3, 4, 0), -f.in_at(0, 0, 0));
  EXPECT_EQ(f.out_at(3, 3, 0), sentinel);
}

TEST(TileRules, AssembleIntoATensorViewedInTheKernel) {
  // One tensor registered as input and output: the kernel views it and assembles into it.
  std::vector<float> data(8 * 32, 2.0f);
  tensor t("t", tensor_view::contiguous(data.data(), dtype::f32, {8, 32}));
  const std::string msg = error_of([&] {
    run_kernel("cycle", {t}, {t}, [&] {
      set_vec_tile_shapes({8, 32});
      assemble(neg(view(t, {8, 32}, {0, 0})), {0, 0}, t);
    });
  });
  EXPECT_TRUE(contains(msg, "'t'"));
  for (float v : data) EXPECT_EQ(v, 2.0f);
  // viewing an output after assembling into it is the cycle the other way round
  fixture f;
  const std::string after = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 32});
    assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {0, 0, 0}, f.out);
    view(f.out, {1, 8, 32}, {0, 0, 0});
  });
  EXPECT_TRUE(contains(after, "view of output 'out' after assembling into it"));
  EXPECT_TRUE(contains(after, "a cycle"));
  EXPECT_TRUE(f.out_untouched());
}

TEST(TileRules, AssembleIntoAnInput) {
  fixture f;
  const std::vector<float> before = f.in_data;
  const std::string msg = error_of(f, [&] {
    set_vec_tile_shapes({1, 8, 32});
    assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {1, 0, 0}, f.in);
  });
  EXPECT_TRUE(contains(msg, "assemble into 'in': it is not an output of kernel 'test'"));
  EXPECT_EQ(f.in_data, before);
}

TEST(TileRules, ViewOfAnOutputBeforeItIsWritten) {
  fixture f;
  const std::string msg = error_of(f, [&] { view(f.out, {1, 8, 32}, {0, 0, 0}); });
  EXPECT_TRUE(contains(msg, "view of output 'out': reading a kernel output before it is written"));
}

TEST(TileRules, UnregisteredTensorsAndOpsOutsideAKernel) {
  fixture f;
  std::vector<float> d(32);
  tensor stray("stray", tensor_view::contiguous(d.data(), dtype::f32, {32}));
  EXPECT_TRUE(contains(error_of(f, [&] { view(stray, {32}, {0}); }),
                       "view of 'stray': the tensor is not an input or output of kernel 'test'"));
  EXPECT_TRUE(contains(error_of([&] { view(stray, {32}, {0}); }),
                       "tile op 'view' called outside a kernel"));
  EXPECT_TRUE(contains(error_of([] { set_vec_tile_shapes({8}); }), "outside a kernel"));
  EXPECT_TRUE(contains(error_of(f, [&] { f.run([] {}); }), "kernels do not nest"));
  EXPECT_TRUE(contains(error_of(
                           f, [] {}, 16),
                       "UB of 16 bytes is too small"));
}

TEST(TileRules, MixedDtypesInArithmetic) {
  fixture f;
  const std::vector<std::pair<const char*, value (*)(const value&, const value&)>> ops = {
      {"add", [](const value& a, const value& b) { return add(a, b); }},
      {"sub", [](const value& a, const value& b) { return sub(a, b); }},
      {"mul", [](const value& a, const value& b) { return mul(a, b); }},
      {"div", [](const value& a, const value& b) { return div(a, b); }}};
  for (const auto& entry : ops) {
    const char* name = entry.first;
    const auto op = entry.second;
    const std::string msg = error_of(f, [&] {
      set_vec_tile_shapes({1, 8, 32});
      value a = view(f.in, {1, 8, 32}, {0, 0, 0});
      op(a, cast(a, dtype::bf16));
    });
    EXPECT_TRUE(contains(msg, std::string("op '") + name + "': dtypes differ (f32 and bf16)"));
    EXPECT_TRUE(contains(msg, "cast one first"));
  }
  EXPECT_TRUE(contains(
      error_of(f,
               [&] {
                 set_vec_tile_shapes({1, 8, 32});
                 assemble(cast(view(f.in, {1, 8, 32}, {0, 0, 0}), dtype::bf16), {0, 0, 0}, f.out);
               }),
      "assemble of a bf16 value into f32 tensor 'out'"));
}

// ---- the checking pass ---------------------------------------------------------------------

TEST(TileCheckingPass, AnErrorAfterAValidAssembleWritesNothing) {
  fixture f;
  int runs = 0;
  const std::string msg = error_of(f, [&] {
    ++runs;
    set_vec_tile_shapes({1, 8, 32});
    assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {0, 0, 0}, f.out);  // valid
    assemble(neg(view(f.in, {1, 8, 32}, {1, 0, 0})), {4, 0, 0}, f.out);  // out of bounds
  });
  EXPECT_TRUE(contains(msg, "out of bounds"));
  EXPECT_EQ(runs, 1);  // raised in the checking pass
  EXPECT_TRUE(f.out_untouched());
  // a valid body runs twice, and only the second pass writes
  runs = 0;
  f.run([&] {
    ++runs;
    set_vec_tile_shapes({1, 8, 32});
    assemble(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {0, 0, 0}, f.out);
  });
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(f.out_at(0, 7, 31), -f.in_at(0, 7, 31));
}

// ---- the UB budget -------------------------------------------------------------------------

TEST(TileUb, OverflowNamesOpTileAndBytesAndWritesNothing) {
  fixture f;
  // tiles of [1, 8, 32] f32 are 1 KiB: add(mul(a, a), 1) holds add's tile, then needs mul's
  const std::string msg = error_of(
      f,
      [&] {
        set_vec_tile_shapes({1, 8, 32});
        assemble(view(f.in, {1, 8, 32}, {3, 0, 0}), {3, 0, 0}, f.out);  // a copy: 1 KiB fits
        loop(0, 3, 1, "b", {1}, [&](std::int64_t b) {
          value a = view(f.in, {1, 8, 32}, {b, 0, 0});
          assemble(add(mul(a, a), 1.0), {b, 0, 0}, f.out);
        });
      },
      1536);
  EXPECT_TRUE(contains(msg, "UB overflow in kernel 'test'"));
  EXPECT_TRUE(contains(msg, "op 'mul' with tile [1, 8, 32]"));
  EXPECT_TRUE(contains(msg, "needs 1024 bytes more with 1024 live; the UB holds 1536 bytes"));
  EXPECT_TRUE(f.out_untouched());
}

TEST(TileUb, ExactFitRunsAndBf16CountsTwoBytes) {
  fixture f;
  auto body = [&] {
    set_vec_tile_shapes({1, 8, 32});
    value a = view(f.in, {1, 8, 32}, {0, 0, 0});
    assemble(mul(a, a), {0, 0, 0}, f.out);  // mul's tile and both inputs: 3 KiB
  };
  EXPECT_TRUE(contains(error_of(f, body, 3071), "UB overflow"));
  EXPECT_TRUE(f.out_untouched());
  const auto report = f.run(body, 3072);
  EXPECT_EQ(report.peak_ub_bytes, 3072u);
  EXPECT_EQ(report.ub_budget_bytes, 3072u);
  EXPECT_EQ(f.out_at(0, 2, 5), f.in_at(0, 2, 5) * f.in_at(0, 2, 5));
  // the same graph on bf16 values takes half the bytes
  std::vector<std::uint16_t> x(8 * 32, f32_to_bf16_bits(3.0f)), y(8 * 32);
  tensor tx("x", tensor_view::contiguous(x.data(), dtype::bf16, {8, 32}));
  tensor ty("y", tensor_view::contiguous(y.data(), dtype::bf16, {8, 32}));
  const auto half = run_kernel("bf16", {tx}, {ty},
                               [&] {
                                 set_vec_tile_shapes({8, 32});
                                 value a = view(tx, {8, 32}, {0, 0});
                                 assemble(mul(a, a), {0, 0}, ty);
                               },
                               {1536});
  EXPECT_EQ(half.peak_ub_bytes, 1536u);
  EXPECT_EQ(bf16_bits_to_f32(y[0]), 9.0f);
}

TEST(TileUb, OverflowInAViewNamesTheTileNotTheWholeView) {
  fixture f;
  // a [4, 8, 32] view read in [1, 8, 32] tiles: the view's tile buffer is 1 KiB
  const std::string msg = error_of(
      f,
      [&] {
        set_vec_tile_shapes({1, 8, 32});
        assemble(neg(view(f.in, {4, 8, 32}, {0, 0, 0})), {0, 0, 0}, f.out);
      },
      1536);
  EXPECT_TRUE(contains(msg, "op 'view' with tile [1, 8, 32] needs 1024 bytes more"));
  EXPECT_TRUE(f.out_untouched());
}

TEST(TileUb, CheckingPassCatchesAnOverflowInALaterTileOfAConcat) {
  // concat({a, deep}, -1) in [1, 8, 32] tiles: the first tile reads only `a` (2 KiB live);
  // the second evaluates deep = add(mul(a, a), a), which holds 5 KiB. The program does not
  // fit 4 KiB, so the checking pass must raise and nothing may be written.
  std::vector<float> in(8 * 32), out(8 * 64, sentinel);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = 0.25f * static_cast<float>(i);
  tensor ti("in", tensor_view::contiguous(in.data(), dtype::f32, {1, 8, 32}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, {1, 8, 64}));
  auto body = [&] {
    set_vec_tile_shapes({1, 8, 32});
    value a = view(ti, {1, 8, 32}, {0, 0, 0});
    assemble(concat({a, add(mul(a, a), a)}, -1), {0, 0, 0}, to);
  };
  const std::string overflow = error_of([&] { run_kernel("later", {ti}, {to}, body, {4096}); });
  EXPECT_TRUE(contains(overflow, "UB overflow"));
  EXPECT_EQ(count_written(out), 0) << "the checking pass must raise before any write";
  // with room for the second tile it runs, and peaks at that tile's need
  const auto report = run_kernel("later", {ti}, {to}, body, {8192});
  EXPECT_EQ(report.peak_ub_bytes, 5u * 1024);
  EXPECT_EQ(out[64 + 40], in[32 + 8] * in[32 + 8] + in[32 + 8]);
}

TEST(TileUb, CheckingPassCatchesAnOverflowInAPartiallyValidLaterTile) {
  // gathermask(view(neg(x), {1, 32}, valid {1, 31}), 1) in [1, 8] tiles: the first tile reads
  // x[0, 16) fully valid (40 floats live); the second reads x[16, 32) valid for 15, which
  // zero-fills through a temporary (54 floats live). 200 bytes fit the first, not the second.
  std::vector<float> x = iota(32, 1.0f, 2.0f), out(16, sentinel);
  tensor tx("x", tensor_view::contiguous(x.data(), dtype::f32, {1, 32}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, {1, 16}));
  auto body = [&] {
    set_vec_tile_shapes({1, 8});
    value v = view(neg(view(tx, {1, 32}, {0, 0})), {1, 32}, {0, 0}, shape_t{1, 31});
    assemble(gathermask(v, 1), {0, 0}, to);
  };
  const std::string msg = error_of([&] { run_kernel("tail", {tx}, {to}, body, {200}); });
  EXPECT_TRUE(contains(msg, "UB overflow"));
  EXPECT_EQ(count_written(out), 0) << "the checking pass must raise before any write";
  run_kernel("tail", {tx}, {to}, body, {512});
  for (int k = 0; k < 16; ++k) EXPECT_EQ(out[k], -x[2 * k]);
}

// ---- loops ---------------------------------------------------------------------------------

TEST(TileLoop, ChunksOfThirteenBy842) {
  EXPECT_EQ(as_tuples(loop_chunks(0, 13, 1, {8, 4, 2})),
            (std::vector<chunk_tuple>{{0, 8, 8}, {8, 12, 4}, {12, 13, 1}}));
}

TEST(TileLoop, UnsortedAndDuplicatedFactorsGiveTheSameChunks) {
  EXPECT_EQ(as_tuples(loop_chunks(0, 13, 1, {2, 8, 4, 8})),
            (std::vector<chunk_tuple>{{0, 8, 8}, {8, 12, 4}, {12, 13, 1}}));
  EXPECT_EQ(as_tuples(loop_chunks(0, 13, 1, {1, 4, 1, 2, 8})),
            (std::vector<chunk_tuple>{{0, 8, 8}, {8, 12, 4}, {12, 13, 1}}));
}

TEST(TileLoop, FactorAboveTheTripCountYieldsNoStretch) {
  EXPECT_EQ(as_tuples(loop_chunks(0, 3, 1, {8})), (std::vector<chunk_tuple>{{0, 3, 1}}));
  fixture f;
  std::vector<std::int64_t> seen;
  kernel_report report;
  EXPECT_EQ(error_of([&] {
              report = f.run(
                  [&] { loop(0, 3, 1, "i", {8}, [&](std::int64_t i) { seen.push_back(i); }); });
            }),
            "");                                                   // no error, no warning
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2}));  // once per pass
  EXPECT_EQ(as_tuples(report.chunks), (std::vector<chunk_tuple>{{0, 3, 1}}));
}

TEST(TileLoop, StepTwoKeepsTheLastPartialStep) {
  EXPECT_EQ(as_tuples(loop_chunks(0, 13, 2, {4})),
            (std::vector<chunk_tuple>{{0, 8, 4}, {8, 13, 1}}));
  fixture f;
  std::vector<std::int64_t> seen;
  const auto report =
      f.run([&] { loop(0, 13, 2, "i", {4}, [&](std::int64_t i) { seen.push_back(i); }); });
  const std::vector<std::int64_t> pass = {0, 2, 4, 6, 8, 10, 12};
  std::vector<std::int64_t> both = pass;
  both.insert(both.end(), pass.begin(), pass.end());
  EXPECT_EQ(seen, both);
  EXPECT_EQ(as_tuples(report.chunks), (std::vector<chunk_tuple>{{0, 8, 4}, {8, 13, 1}}));
}

TEST(TileLoop, BodySeesStartPlusMultiplesOfStepInOrder) {
  struct loop_case {
    std::int64_t start, stop, step;
    std::vector<std::int64_t> unroll;
  };
  const std::vector<loop_case> cases = {{0, 13, 1, {8, 4, 2}}, {5, 18, 1, {4}},   {3, 20, 3, {2}},
                                        {0, 20, 3, {4}},       {-5, 0, 2, {2}},   {7, 7, 1, {4}},
                                        {0, 1, 1, {}},         {2, 31, 4, {8, 2}}};
  for (const auto& c : cases) {
    std::vector<std::int64_t> want;
    for (std::int64_t i = c.start; i < c.stop; i += c.step) want.push_back(i);
    fixture f;
    std::vector<std::int64_t> seen;
    const auto report = f.run([&] {
      seen.clear();  // keep the executing pass's indices
      loop(c.start, c.stop, c.step, "i", c.unroll, [&](std::int64_t i) { seen.push_back(i); });
    });
    EXPECT_EQ(seen, want) << c.start << " " << c.stop << " " << c.step;
    const auto chunks = loop_chunks(c.start, c.stop, c.step, c.unroll);
    EXPECT_EQ(as_tuples(report.chunks), as_tuples(chunks));
    // the chunks tile [start, stop) without gaps, each a whole number of unrolled steps
    std::int64_t at = c.start;
    for (const auto& ch : chunks) {
      EXPECT_EQ(ch.begin, at);
      const std::int64_t trips = (ch.end - ch.begin + c.step - 1) / c.step;
      EXPECT_EQ(trips % ch.factor, 0) << ch.begin << " " << ch.end << " " << ch.factor;
      at = ch.end;
    }
    EXPECT_EQ(at, std::max(c.start, c.stop));
  }
}

TEST(TileLoop, ChunksOfNestedLoopsAreRecordedInOrder) {
  fixture f;
  const auto report = f.run([&] {
    loop(0, 2, 1, "outer", {1},
         [&](std::int64_t) { loop(0, 3, 1, "inner", {2}, [](std::int64_t) {}); });
  });
  EXPECT_EQ(as_tuples(report.chunks),
            (std::vector<chunk_tuple>{{0, 2, 1}, {0, 2, 2}, {2, 3, 1}, {0, 2, 2}, {2, 3, 1}}));
}

TEST(TileLoop, BadStepOrFactor) {
  EXPECT_TRUE(contains(error_of([] { loop_chunks(0, 4, 0, {}); }), "step (0) must be > 0"));
  EXPECT_TRUE(contains(error_of([] { loop_chunks(0, 4, -1, {}); }), "step (-1) must be > 0"));
  EXPECT_TRUE(contains(error_of([] {
                         loop_chunks(0, 4, 1, {4, 0});
                       }),
                       "unroll factor (0) must be >= 1"));
}

TEST(TileLoop, LoopInsideAnUnrolledLoopIsAnError) {
  fixture f;
  const std::string msg = error_of(f, [] {
    loop(0, 4, 1, "outer", {2},
         [](std::int64_t) { loop(0, 2, 1, "inner", {1}, [](std::int64_t) {}); });
  });
  EXPECT_TRUE(contains(msg, "loop 'inner' is nested in loop 'outer', which is unrolled"));
  EXPECT_TRUE(contains(msg, "only the innermost loop may be unrolled"));
  // a factor above the trip count still makes the loop an unrolled one
  EXPECT_TRUE(contains(error_of(f,
                                [] {
                                  loop(0, 2, 1, "outer", {8}, [](std::int64_t) {
                                    loop(0, 2, 1, "inner", {}, [](std::int64_t) {});
                                  });
                                }),
                       "nested in loop 'outer'"));
}

TEST(TileLoop, UnrolledLoopInsideAPlainLoopIsFine) {
  fixture f;
  int calls = 0;
  EXPECT_EQ(error_of(f,
                     [&] {
                       loop(0, 4, 1, "outer", {1}, [&](std::int64_t) {
                         loop(0, 4, 1, "inner", {4, 2}, [&](std::int64_t) { ++calls; });
                       });
                       // after the unrolled loop ends, a new outer loop may nest again
                       loop(0, 2, 1, "again", {}, [&](std::int64_t) {
                         loop(0, 2, 1, "inner2", {2}, [&](std::int64_t) { ++calls; });
                       });
                     }),
            "");
  EXPECT_EQ(calls, 2 * (16 + 4));
}

// ---- valid_shape ---------------------------------------------------------------------------

TEST(TileValidShape, AssembleWritesOnlyTheValidRegion) {
  fixture f;
  f.run([&] {
    set_vec_tile_shapes({1, 4, 32});
    value v = view(f.in, {1, 8, 32}, {1, 0, 0}, shape_t{1, 5, 32});
    value r = add(mul(v, 2.0), 0.0);
    EXPECT_EQ(r.shape(), (shape_t{1, 8, 32}));
    EXPECT_EQ(r.valid_shape(), (shape_t{1, 5, 32}));
    assemble(r, {2, 0, 0}, f.out);
  });
  for (int b = 0; b < 4; ++b)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 32; ++c) {
        const float want = b == 2 && r < 5 ? 2.0f * f.in_at(1, r, c) : sentinel;
        EXPECT_EQ(f.out_at(b, r, c), want) << b << "," << r << "," << c;
      }
}

TEST(TileValidShape, ReadsZerosPastTheValidRegion) {
  fixture f;  // every element of `in` past a valid region is nonzero: reading it would show
  f.run([&] {
    set_vec_tile_shapes({1, 8, 32});
    // rows 5..7 of a view of in[1] read 0: the sum over rows is that of rows 0..4
    value rows = view(f.in, {1, 8, 32}, {1, 0, 0}, shape_t{1, 5, 32});
    assemble(sum(rows, 1, true), {0, 0, 0}, f.out);
    // columns 20..31 read 0 (the sum is taken in chunks of 8 columns, one of them partial)
    set_vec_tile_shapes({1, 8, 8});
    value cols = view(f.in, {1, 8, 32}, {2, 0, 0}, shape_t{1, 8, 20});
    assemble(sum(cols, -1, true), {1, 0, 0}, f.out);
    // a partially valid window of a computed value zero-fills too
    set_vec_tile_shapes({1, 8, 32});
    value computed =
        view(neg(view(f.in, {1, 8, 32}, {3, 0, 0})), {1, 8, 32}, {0, 0, 0}, shape_t{1, 3, 32});
    assemble(sum(computed, 1, true), {2, 0, 0}, f.out);
    // a tail window past the end of the tensor: the sum over its 2 blocks is block 3 alone
    value tail = view(f.in, {2, 8, 32}, {3, 0, 0}, shape_t{1, 8, 32});
    assemble(sum(tail, 0, true), {3, 0, 0}, f.out);
  });
  for (int c = 0; c < 32; ++c) {
    float want = 0;
    for (int r = 0; r < 5; ++r) want += f.in_at(1, r, c);
    EXPECT_EQ(f.out_at(0, 0, c), want) << c;
    EXPECT_EQ(f.out_at(0, 1, c), sentinel);
  }
  for (int r = 0; r < 8; ++r) {
    float want = 0;
    for (int c = 0; c < 20; ++c) want += f.in_at(2, r, c);
    EXPECT_EQ(f.out_at(1, r, 0), want) << r;
    EXPECT_EQ(f.out_at(1, r, 1), sentinel);
  }
  for (int c = 0; c < 32; ++c) {
    EXPECT_EQ(f.out_at(2, 0, c), -(f.in_at(3, 0, c) + f.in_at(3, 1, c) + f.in_at(3, 2, c)));
  }
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 32; ++c) EXPECT_EQ(f.out_at(3, r, c), f.in_at(3, r, c));
}

TEST(TileValidShape, PropagatesThroughOps) {
  fixture f;
  f.run([&] {
    set_vec_tile_shapes({1, 8, 32});
    value a = view(f.in, {1, 8, 32}, {0, 0, 0}, shape_t{1, 6, 32});
    value b = view(f.in, {1, 8, 32}, {1, 0, 0}, shape_t{1, 8, 24});
    EXPECT_EQ(add(a, b).valid_shape(), (shape_t{1, 6, 24}));  // the smaller of each dim
    EXPECT_EQ(sum(a, 1, true).valid_shape(), (shape_t{1, 1, 32}));
    set_vec_tile_shapes({1, 32});
    EXPECT_EQ(sum(b, 1, false).valid_shape(), (shape_t{1, 24}));
    set_vec_tile_shapes({1, 8, 32});
    EXPECT_EQ(view(a, {1, 4, 32}, {0, 4, 0}).valid_shape(), (shape_t{1, 2, 32}));  // clipped
    EXPECT_EQ(view(a, {1, 4, 32}, {0, 4, 0}).shape(), (shape_t{1, 4, 32}));
    EXPECT_EQ(concat({a, a}, 2).valid_shape(), (shape_t{1, 6, 64}));
    EXPECT_EQ(deinterleave(b).first.valid_shape(), (shape_t{1, 8, 12}));
  });
}

// ---- op semantics --------------------------------------------------------------------------

TEST(TileOps, ElementwiseOps) {
  const shape_t s = {2, 16};
  const std::vector<float> a = iota(32, 0.75f, -11.0f), b = iota(32, 0.5f, 0.25f);
  const std::vector<std::pair<std::function<value(const std::vector<value>&)>,
                              std::function<float(float, float)>>>
      ops = {
          {[](auto& v) { return neg(v[0]); }, [](float x, float) { return -x; }},
          {[](auto& v) { return add(v[0], v[1]); }, [](float x, float y) { return x + y; }},
          {[](auto& v) { return sub(v[0], v[1]); }, [](float x, float y) { return x - y; }},
          {[](auto& v) { return mul(v[0], v[1]); }, [](float x, float y) { return x * y; }},
          {[](auto& v) { return div(v[0], v[1]); }, [](float x, float y) { return x / y; }},
          {[](auto& v) { return rsqrt(v[1]); }, [](float, float y) { return 1.0f / std::sqrt(y); }},
          {[](auto& v) { return add(v[0], 2.5); }, [](float x, float) { return x + 2.5f; }},
          {[](auto& v) { return mul(v[0], -3.0); }, [](float x, float) { return x * -3.0f; }}};
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const auto out = evaluate({{a, s}, {b, s}}, s, {1, 8}, ops[k].first);
    for (int i = 0; i < 32; ++i)
      EXPECT_FLOAT_EQ(out[i], ops[k].second(a[i], b[i])) << k << " " << i;
  }
}

TEST(TileOps, Broadcasting) {
  const std::vector<float> a = iota(16, 1.0f, 1.0f), b = iota(24, 0.5f, 0.5f);  // [2,1,8] [1,3,8]
  const std::vector<std::pair<std::function<value(const std::vector<value>&)>,
                              std::function<float(float, float)>>>
      ops = {{[](auto& v) { return add(v[0], v[1]); }, [](float x, float y) { return x + y; }},
             {[](auto& v) { return sub(v[0], v[1]); }, [](float x, float y) { return x - y; }},
             {[](auto& v) { return mul(v[1], v[0]); }, [](float x, float y) { return x * y; }},
             {[](auto& v) { return div(v[0], v[1]); }, [](float x, float y) { return x / y; }}};
  for (std::size_t k = 0; k < ops.size(); ++k) {
    // a tile of [1, 2, 8]: the second tile of each block is partial along dim 1
    const auto out = evaluate({{a, {2, 1, 8}}, {b, {1, 3, 8}}}, {2, 3, 8}, {1, 2, 8}, ops[k].first);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int c = 0; c < 8; ++c)
          EXPECT_FLOAT_EQ(out[(i * 3 + j) * 8 + c], ops[k].second(a[i * 8 + c], b[j * 8 + c]))
              << k << " " << i << "," << j << "," << c;
  }
  // a lower-rank operand lines up with the trailing dims
  const std::vector<float> m = iota(48, 1.0f), row = iota(8, 10.0f);
  const auto out = evaluate({{m, {2, 3, 8}}, {row, {8}}}, {2, 3, 8}, {2, 3, 8},
                            [](auto& v) { return sub(v[0], v[1]); });
  for (int i = 0; i < 48; ++i) EXPECT_EQ(out[i], m[i] - row[i % 8]);
  fixture f;
  EXPECT_TRUE(
      contains(error_of(f,
                        [&] {
                          set_vec_tile_shapes({1, 8, 32});
                          add(view(f.in, {1, 8, 32}, {0, 0, 0}), view(f.in, {1, 4, 32}, {0, 0, 0}));
                        }),
               "op 'add': shapes [1, 8, 32] and [1, 4, 32] do not broadcast"));
}

TEST(TileOps, SumKeepdimTrueAndFalse) {
  const shape_t s = {2, 3, 16};
  const std::vector<float> x = iota(96, 0.5f, -7.0f);
  auto at = [&](int i, int j, int k) { return x[(i * 3 + j) * 16 + k]; };
  const auto over_rows =
      evaluate({{x, s}}, {2, 1, 16}, {1, 1, 8}, [](auto& v) { return sum(v[0], 1, true); });
  const auto over_blocks =
      evaluate({{x, s}}, {3, 16}, {2, 8}, [](auto& v) { return sum(v[0], 0, false); });
  const auto over_cols =
      evaluate({{x, s}}, {2, 3, 1}, {2, 2, 8}, [](auto& v) { return sum(v[0], -1, true); });
  const auto over_cols_drop =
      evaluate({{x, s}}, {2, 3}, {2, 8}, [](auto& v) { return sum(v[0], 2, false); });
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 16; ++k)
      EXPECT_EQ(over_rows[i * 16 + k], at(i, 0, k) + at(i, 1, k) + at(i, 2, k));
  for (int j = 0; j < 3; ++j)
    for (int k = 0; k < 16; ++k) EXPECT_EQ(over_blocks[j * 16 + k], at(0, j, k) + at(1, j, k));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      float want = 0;
      for (int k = 0; k < 16; ++k) want += at(i, j, k);
      EXPECT_FLOAT_EQ(over_cols[i * 3 + j], want);
      EXPECT_FLOAT_EQ(over_cols_drop[i * 3 + j], want);
    }
  fixture f;
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  set_vec_tile_shapes({1, 8, 32});
                                  sum(view(f.in, {1, 8, 32}, {0, 0, 0}), 3);
                                }),
                       "op 'sum': dim 3 is outside rank 3"));
}

TEST(TileOps, ConcatAlongTheLastDimAndDimZero) {
  const shape_t s = {4, 16};
  const std::vector<float> a = iota(64, 1.0f), b = iota(64, 1.0f, 100.0f),
                           c = iota(32, 1.0f, -50.0f);
  // along the last dim, in [4, 8] tiles; and three inputs of widths 16, 8, 16 in [2, 16] tiles
  const auto last = evaluate({{a, s}, {b, s}}, {4, 32}, {4, 8}, [](auto& v) {
    return concat({v[0], v[1]}, -1);
  });
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 32; ++k)
      EXPECT_EQ(last[r * 32 + k], k < 16 ? a[r * 16 + k] : b[r * 16 + k - 16]) << r << "," << k;
  const auto three = evaluate({{a, s}, {c, {4, 8}}, {b, s}}, {4, 40}, {2, 16}, [](auto& v) {
    return concat({v[0], v[1], v[2]}, 1);
  });
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 40; ++k) {
      const float want = k < 16 ? a[r * 16 + k] : k < 24 ? c[r * 8 + k - 16] : b[r * 16 + k - 24];
      EXPECT_EQ(three[r * 40 + k], want) << r << "," << k;
    }
  // along dim 0, in [3, 8] tiles: the second tile straddles the two inputs
  const auto first = evaluate({{a, s}, {b, s}}, {8, 16}, {3, 8}, [](auto& v) {
    return concat({v[0], v[1]}, 0);
  });
  for (int r = 0; r < 8; ++r)
    for (int k = 0; k < 16; ++k)
      EXPECT_EQ(first[r * 16 + k], r < 4 ? a[r * 16 + k] : b[(r - 4) * 16 + k]) << r << "," << k;
}

TEST(TileOps, DeinterleaveAndGathermask) {
  const shape_t s = {4, 16};
  const std::vector<float> x = iota(64, 1.5f, 3.0f);
  auto run = [&](std::function<value(const value&)> pick) {
    return evaluate({{x, s}}, {4, 8}, {2, 8}, [&](auto& v) { return pick(v[0]); });
  };
  const auto even = run([](const value& v) { return deinterleave(v).first; });
  const auto odd = run([](const value& v) { return deinterleave(v).second; });
  const auto mask1 = run([](const value& v) { return gathermask(v, 1); });
  const auto mask2 = run([](const value& v) { return gathermask(v, 2); });
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(even[r * 8 + k], x[r * 16 + 2 * k]);
      EXPECT_EQ(odd[r * 8 + k], x[r * 16 + 2 * k + 1]);
      EXPECT_EQ(mask1[r * 8 + k], x[r * 16 + 2 * k]);
      EXPECT_EQ(mask2[r * 8 + k], x[r * 16 + 2 * k + 1]);
    }
  fixture f;
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  set_vec_tile_shapes({1, 8, 8});
                                  gathermask(view(f.in, {1, 8, 32}, {0, 0, 0}), 3);
                                }),
                       "op 'gathermask': mode 3 is not 1 (even) or 2 (odd)"));
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  set_vec_tile_shapes({1, 8, 8});
                                  deinterleave(view(f.in, {1, 8, 15}, {0, 0, 0}));
                                }),
                       "op 'deinterleave': last dim 15 must be even"));
}

TEST(TileOps, InterleaveIsTheInverseOfDeinterleave) {
  const shape_t s = {4, 32};
  const std::vector<float> x = iota(128, -0.5f, 9.0f);
  const auto round_trip = evaluate({{x, s}}, s, {2, 8}, [](auto& v) {
    auto [e, o] = deinterleave(v[0]);
    return interleave(e, o);
  });
  EXPECT_EQ(round_trip, x);
  // interleave(even, odd) places even[k] at 2k and odd[k] at 2k + 1
  const std::vector<float> e = iota(32, 1.0f), o = iota(32, 1.0f, 1000.0f);
  const auto mixed = evaluate({{e, {4, 8}}, {o, {4, 8}}}, {4, 16}, {4, 8},
                              [](auto& v) { return interleave(v[0], v[1]); });
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(mixed[r * 16 + 2 * k], e[r * 8 + k]);
      EXPECT_EQ(mixed[r * 16 + 2 * k + 1], o[r * 8 + k]);
    }
  fixture f;
  EXPECT_TRUE(contains(
      error_of(f,
               [&] {
                 set_vec_tile_shapes({1, 8, 8});
                 interleave(view(f.in, {1, 8, 16}, {0, 0, 0}), view(f.in, {1, 8, 8}, {0, 0, 0}));
               }),
      "must match in shape and dtype"));
}

TEST(TileOps, ExpandClone) {
  const std::vector<float> row = iota(16, 3.0f), col = iota(4, -2.0f, 1.0f);
  const auto rows = evaluate({{row, {1, 16}}}, {4, 16}, {3, 8}, [](auto& v) {
    return expand_clone(v[0], {4, 16});
  });
  const auto cols = evaluate({{col, {4, 1}}}, {4, 16}, {2, 8}, [](auto& v) {
    return expand_clone(v[0], {4, 16});
  });
  const auto ranked = evaluate({{row, {16}}}, {2, 3, 16}, {1, 2, 8}, [](auto& v) {
    return expand_clone(v[0], {2, 3, 16});
  });
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 16; ++k) {
      EXPECT_EQ(rows[r * 16 + k], row[k]);
      EXPECT_EQ(cols[r * 16 + k], col[r]);
    }
  for (int i = 0; i < 6 * 16; ++i) EXPECT_EQ(ranked[i], row[i % 16]);
  fixture f;
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  set_vec_tile_shapes({1, 8, 32});
                                  expand_clone(view(f.in, {1, 2, 32}, {0, 0, 0}), {1, 8, 32});
                                }),
                       "do not broadcast"));
}

TEST(TileOps, ReshapeOfAContiguousView) {
  const std::vector<float> x = iota(64, 1.0f);
  const auto flat = evaluate({{x, {4, 16}}}, {8, 8}, {8, 8}, [](auto& v) {
    return add(reshape(v[0], {8, 8}), 1.0);
  });
  for (int i = 0; i < 64; ++i) EXPECT_EQ(flat[i], x[i] + 1.0f);
  fixture f;
  f.run([&] {  // whole blocks 1..2 of `in` are contiguous: [2, 8, 32] as [16, 32]
    set_vec_tile_shapes({1, 4, 32});
    value r = reshape(view(f.in, {2, 8, 32}, {1, 0, 0}), {16, 32});
    value back = reshape(r, {1, 16, 32});
    assemble(neg(view(back, {1, 8, 32}, {0, 8, 0})), {0, 0, 0}, f.out);  // block 2
  });
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 32; ++c) EXPECT_EQ(f.out_at(0, r, c), -f.in_at(2, r, c));
}

TEST(TileOps, ReshapeOfANonContiguousViewIsAnError) {
  fixture f;
  const std::string msg = error_of(f, [&] { reshape(view(f.in, {1, 8, 16}, {0, 0, 0}), {8, 16}); });
  EXPECT_TRUE(
      contains(msg, "op 'reshape': [1, 8, 16] must be a fully valid view of contiguous memory"));
  EXPECT_TRUE(
      contains(error_of(f,
                        [&] {
                          reshape(view(f.in, {1, 8, 32}, {0, 0, 0}, shape_t{1, 7, 32}), {8, 32});
                        }),
               "must be a fully valid view"));
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  set_vec_tile_shapes({1, 8, 32});
                                  reshape(neg(view(f.in, {1, 8, 32}, {0, 0, 0})), {8, 32});
                                }),
                       "must be a fully valid view"));
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  reshape(view(f.in, {1, 8, 32}, {0, 0, 0}), {8, 16});
                                }),
                       "[1, 8, 32] has 256 elements, [8, 16] has 128"));
}

// Casts each of `values` (f32) to `to` with `mode` in a kernel; returns the results as f32.
std::vector<float> cast_all(const std::vector<float>& values, dtype to, cast_mode mode) {
  std::vector<float> in = values;
  in.resize(16, 0.0f);
  std::vector<std::uint16_t> out(16, 0xffff);
  tensor ti("in", tensor_view::contiguous(in.data(), dtype::f32, {16}));
  tensor to_t("out", tensor_view::contiguous(out.data(), to, {16}));
  run_kernel("cast", {ti}, {to_t}, [&] {
    set_vec_tile_shapes({16});
    assemble(cast(view(ti, {16}, {0}), to, mode), {0}, to_t);
  });
  std::vector<float> got;
  for (std::size_t i = 0; i < values.size(); ++i)
    got.push_back(to == dtype::bf16 ? bf16_bits_to_f32(out[i]) : f16_bits_to_f32(out[i]));
  return got;
}

TEST(TileOps, CastF32ToBf16RintTiesToEven) {
  const float one_up = 1.0f + 0x1p-8f, three_up = 1.0f + 3 * 0x1p-8f;  // ties between bf16s
  const auto got =
      cast_all({one_up, three_up, -one_up, 1.0f + 0x1p-9f, 2.7f}, dtype::bf16, cast_mode::rint);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(got[2], -1.0f);
  EXPECT_EQ(got[3], 1.0f);
  EXPECT_EQ(got[4], 2.703125f);  // 2.7 lies between 2.6875 and 2.703125, nearer the latter
  // rint is the default mode
  std::vector<float> in(16, one_up);
  std::vector<std::uint16_t> out(16);
  tensor ti("in", tensor_view::contiguous(in.data(), dtype::f32, {16}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::bf16, {16}));
  run_kernel("cast", {ti}, {to}, [&] {
    set_vec_tile_shapes({16});
    assemble(cast(view(ti, {16}, {0}), dtype::bf16), {0}, to);
  });
  EXPECT_EQ(bf16_bits_to_f32(out[0]), 1.0f);
}

TEST(TileOps, CastModes) {
  const float tie = 1.0f + 0x1p-8f, up = 1.0f + 0x1p-7f;
  const std::vector<float> x = {tie, -tie, 2.7f, -2.7f, 1.5f, 0.0f, 1.0f};
  struct expected {
    cast_mode mode;
    std::vector<float> want;
  };
  const std::vector<expected> cases = {
      {cast_mode::round, {up, -up, 2.703125f, -2.703125f, 1.5f, 0.0f, 1.0f}},
      {cast_mode::trunc, {1.0f, -1.0f, 2.6875f, -2.6875f, 1.5f, 0.0f, 1.0f}},
      {cast_mode::floor, {1.0f, -up, 2.6875f, -2.703125f, 1.5f, 0.0f, 1.0f}},
      {cast_mode::ceil, {up, -1.0f, 2.703125f, -2.6875f, 1.5f, 0.0f, 1.0f}},
      {cast_mode::rint, {1.0f, -1.0f, 2.703125f, -2.703125f, 1.5f, 0.0f, 1.0f}}};
  for (const auto& c : cases) {
    EXPECT_EQ(cast_all(x, dtype::bf16, c.mode), c.want) << to_string(c.mode);
  }
  // f16 keeps 11 significant bits: 1 + 2^-11 is a tie between 1 and 1 + 2^-10
  const float f16_tie = 1.0f + 0x1p-11f;
  EXPECT_EQ(cast_all({f16_tie}, dtype::f16, cast_mode::rint)[0], 1.0f);
  EXPECT_EQ(cast_all({f16_tie}, dtype::f16, cast_mode::ceil)[0], 1.0f + 0x1p-10f);
  EXPECT_EQ(cast_all({f16_tie}, dtype::f16, cast_mode::round)[0], 1.0f + 0x1p-10f);
  EXPECT_EQ(cast_all({-f16_tie}, dtype::f16, cast_mode::floor)[0], -1.0f - 0x1p-10f);
  EXPECT_EQ(to_string(cast_mode::rint), "rint");
  EXPECT_EQ(to_string(cast_mode::floor), "floor");
}

TEST(TileOps, Bf16OpsRoundEachResult) {
  const float tiny = 0x1p-8f;  // half a bf16 ulp at 1
  std::vector<std::uint16_t> x(16, f32_to_bf16_bits(1.0f)), y(16, f32_to_bf16_bits(tiny));
  std::vector<std::uint16_t> out(16);
  std::vector<float> out32(16, sentinel);
  tensor tx("x", tensor_view::contiguous(x.data(), dtype::bf16, {16}));
  tensor ty("y", tensor_view::contiguous(y.data(), dtype::bf16, {16}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::bf16, {16}));
  tensor to32("out32", tensor_view::contiguous(out32.data(), dtype::f32, {16}));
  run_kernel("bf16", {tx, ty}, {to, to32}, [&] {
    set_vec_tile_shapes({16});
    value a = view(tx, {16}, {0});
    value b = view(ty, {16}, {0});
    // in bf16: 1 + 2^-8 rounds to 1 at each add; in f32 the two adds give 1 + 2^-7
    assemble(add(add(a, b), b), {0}, to);
    value a32 = cast(a, dtype::f32), b32 = cast(b, dtype::f32);
    assemble(add(add(a32, b32), b32), {0}, to32);
  });
  EXPECT_EQ(bf16_bits_to_f32(out[0]), 1.0f);
  EXPECT_EQ(out32[0], 1.0f + 0x1p-7f);
  // each op rounds: (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 -> 1 + 2^-6, then - 1 is exact
  auto run1 = [&](float xv, float yv, const std::function<value(const value&, const value&)>& op) {
    std::fill(x.begin(), x.end(), f32_to_bf16_bits(xv));
    std::fill(y.begin(), y.end(), f32_to_bf16_bits(yv));
    run_kernel("bf16", {tx, ty}, {to}, [&] {
      set_vec_tile_shapes({16});
      assemble(op(view(tx, {16}, {0}), view(ty, {16}, {0})), {0}, to);
    });
    return bf16_bits_to_f32(out[0]);
  };
  const float u = 1.0f + 0x1p-7f;
  EXPECT_EQ(run1(u, u, [](auto& p, auto& q) { return add(mul(p, q), -1.0); }), 0x1p-6f);
  EXPECT_EQ(run1(1.0f, 3.0f, [](auto& p, auto& q) { return div(p, q); }),
            bf16_bits_to_f32(f32_to_bf16_bits(1.0f / 3.0f)));
  EXPECT_EQ(run1(3.0f, 0.0f, [](auto& p, auto&) { return rsqrt(p); }),
            bf16_bits_to_f32(f32_to_bf16_bits(1.0f / std::sqrt(3.0f))));
  EXPECT_EQ(run1(1.0f, tiny, [](auto& p, auto& q) { return sub(p, neg(q)); }), 1.0f);
  EXPECT_EQ(run1(1.0f, 0.0f, [](auto& p, auto&) { return add(p, 0x1p-8); }), 1.0f);
}

// ---- the report ----------------------------------------------------------------------------

TEST(TileReport, PeakUbIsTiledNotWholeView) {
  std::vector<float> in = iota(4 * 64 * 32, 0.125f), out(in.size(), sentinel);
  tensor ti("in", tensor_view::contiguous(in.data(), dtype::f32, {4, 64, 32}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, {4, 64, 32}));
  const auto report = run_kernel("peak", {ti}, {to}, [&] {
    set_vec_tile_shapes({1, 8, 32});
    value v = view(ti, {4, 64, 32}, {0, 0, 0});
    assemble(add(mul(v, v), 1.0), {0, 0, 0}, to);
  });
  EXPECT_EQ(report.name, "peak");
  EXPECT_GT(report.peak_ub_bytes, 0u);
  EXPECT_LT(report.peak_ub_bytes, 4u * 64 * 32 * 4);
  EXPECT_GE(report.peak_ub_bytes, 1u * 8 * 32 * 4);      // at least one tile
  EXPECT_LE(report.peak_ub_bytes, 4u * 1 * 8 * 32 * 4);  // at most four tiles live
  EXPECT_EQ(report.ub_budget_bytes, 192u * 1024);
  EXPECT_EQ(report.tiles, 4 * (64 / 8));
  EXPECT_EQ(report.assembles, 1);
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i], in[i] * in[i] + 1.0f) << i;
}

TEST(TileReport, PartialTilesAndAssemblesInALoop) {
  std::vector<float> in = iota(4 * 64 * 32, 1.0f), out(in.size(), sentinel);
  tensor ti("in", tensor_view::contiguous(in.data(), dtype::f32, {4, 64, 32}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, {4, 64, 32}));
  const auto report = run_kernel("loop", {ti}, {to}, [&] {
    loop(0, 4, 1, "b", {2}, [&](std::int64_t b) {
      set_vec_tile_shapes({1, 24, 32});  // 64 rows: tiles of 24, 24 and 16
      assemble(neg(view(ti, {1, 64, 32}, {b, 0, 0})), {b, 0, 0}, to);
    });
  });
  EXPECT_EQ(report.assembles, 4);
  EXPECT_EQ(report.tiles, 4 * 3);
  EXPECT_EQ(as_tuples(report.chunks), (std::vector<chunk_tuple>{{0, 4, 2}}));
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i], -in[i]) << i;
}

}  // namespace

// ---- scalar sub / div, amax ----------------------------------------------------------------

namespace {

TEST(TileOps, ScalarSubAndDivBothWays) {
  const shape_t s = {2, 16};
  const std::vector<float> x = iota(32, 0.25f, 1.0f);
  const auto minus = evaluate({{x, s}}, s, {1, 8}, [](auto& v) { return sub(v[0], 3.0); });
  const auto over = evaluate({{x, s}}, s, {1, 8}, [](auto& v) { return div(v[0], 3.0); });
  const auto under = evaluate({{x, s}}, s, {1, 8}, [](auto& v) { return div(3.0, v[0]); });
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(minus[i], x[i] - 3.0f);
    EXPECT_EQ(over[i], x[i] / 3.0f);  // a true division, not a multiply by 1/3
    EXPECT_EQ(under[i], 3.0f / x[i]);
  }
}

TEST(TileOps, AmaxTakesOnlyValidElements) {
  // all values negative: a padded 0 past the valid shape would win if it were read
  const shape_t s = {2, 3, 16};
  const std::vector<float> x = iota(96, -0.5f, -1.0f);
  auto at = [&](int i, int j, int k) { return x[(i * 3 + j) * 16 + k]; };
  const auto over_cols =
      evaluate({{x, s}}, {2, 3, 1}, {2, 2, 8}, [](auto& v) { return amax(v[0], -1, true); });
  const auto over_rows =
      evaluate({{x, s}}, {2, 16}, {2, 8}, [](auto& v) { return amax(v[0], 1, false); });
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(over_cols[i * 3 + j], at(i, j, 0));
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 16; ++k) EXPECT_EQ(over_rows[i * 16 + k], at(i, 0, k));
  // a view valid for 5 of 16 columns: the max of those 5, not the padded zeros
  std::vector<float> neg_data(16);
  for (int k = 0; k < 16; ++k) neg_data[k] = -1.0f - static_cast<float>(k);
  std::vector<float> out(1, sentinel);
  tensor in("in", tensor_view::contiguous(neg_data.data(), dtype::f32, {1, 16}));
  tensor to("out", tensor_view::contiguous(out.data(), dtype::f32, {1, 1}));
  run_kernel("amax", {in}, {to}, [&] {
    set_vec_tile_shapes({1, 8});
    assemble(amax(view(in, {1, 16}, {0, 0}, shape_t{1, 5}), -1, true), {0, 0}, to);
  });
  EXPECT_EQ(out[0], -1.0f);
  fixture f;
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  set_vec_tile_shapes({1, 8, 32});
                                  amax(view(f.in, {1, 8, 32}, {0, 0, 0}), -4);
                                }),
                       "op 'amax': dim -4 is outside rank 3"));
}

// ---- roles by use, shared memory, loop_scope ------------------------------------------------

TEST(TileRoles, ViewedIsAnInputAssembledIsAnOutput) {
  std::vector<float> a(8 * 32), b(8 * 32, sentinel), unused(8 * 32, 5.0f);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  tensor ta("a", tensor_view::contiguous(a.data(), dtype::f32, {8, 32}));
  tensor tb("b", tensor_view::contiguous(b.data(), dtype::f32, {8, 32}));
  tensor tu("unused", tensor_view::contiguous(unused.data(), dtype::f32, {8, 32}));
  const auto report = run_kernel("by_use", {tb, ta, tu}, [&] {
    set_vec_tile_shapes({8, 32});
    assemble(neg(view(ta, {8, 32}, {0, 0})), {0, 0}, tb);
  });
  EXPECT_EQ(report.assembles, 1);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], -a[i]);
  for (float v : unused) EXPECT_EQ(v, 5.0f);
  // after the kernel, the tensors belong to no kernel
  EXPECT_TRUE(contains(error_of([&] {
                         run_kernel("other", {ta}, {tb}, [&] { view(tu, {8, 32}, {0, 0}); });
                       }),
                       "view of 'unused': the tensor is not an input or output of kernel 'other'"));
}

TEST(TileRoles, ViewThenAssembleOneTensorIsACycle) {
  std::vector<float> a(8 * 32, 2.0f), b(8 * 32, sentinel);
  tensor ta("a", tensor_view::contiguous(a.data(), dtype::f32, {8, 32}));
  tensor tb("b", tensor_view::contiguous(b.data(), dtype::f32, {8, 32}));
  const std::string msg = error_of([&] {
    run_kernel("cycle", {ta, tb}, [&] {
      set_vec_tile_shapes({8, 32});
      assemble(neg(view(ta, {8, 32}, {0, 0})), {0, 0}, tb);
      assemble(neg(view(ta, {8, 32}, {0, 0})), {0, 0}, ta);
    });
  });
  EXPECT_TRUE(contains(msg, "assemble into 'a' after viewing it"));
  EXPECT_TRUE(contains(msg, "a cycle"));
  for (float v : a) EXPECT_EQ(v, 2.0f);
  for (float v : b) EXPECT_EQ(v, sentinel);  // the checking pass raised: nothing written
  const std::string after = error_of([&] {
    run_kernel("cycle", {ta, tb}, [&] {
      set_vec_tile_shapes({8, 32});
      assemble(neg(view(ta, {8, 32}, {0, 0})), {0, 0}, tb);
      view(tb, {8, 32}, {0, 0});
    });
  });
  EXPECT_TRUE(contains(after, "view of output 'b' after assembling into it"));
  for (float v : b) EXPECT_EQ(v, sentinel);
}

TEST(TileRoles, OutputSharingMemoryWithAnotherTensorIsAnError) {
  std::vector<float> data(8 * 32, 3.0f);
  // two tensors over one buffer, the second shifted by one row
  tensor whole("x", tensor_view::contiguous(data.data(), dtype::f32, {8, 32}));
  tensor shifted("y", tensor_view::contiguous(data.data() + 32, dtype::f32, {4, 32}));
  const auto body = [&] {
    set_vec_tile_shapes({4, 32});
    assemble(neg(view(whole, {4, 32}, {0, 0})), {0, 0}, shifted);
  };
  for (bool by_use : {false, true}) {
    const std::string msg = error_of([&] {
      if (by_use) {
        run_kernel("alias", {whole, shifted}, body);
      } else {
        run_kernel("alias", {whole}, {shifted}, body);
      }
    });
    EXPECT_TRUE(contains(msg, "input 'x' and output 'y' share memory")) << by_use;
    for (float v : data) EXPECT_EQ(v, 3.0f);
  }
  // two outputs over one buffer
  std::vector<float> in(4 * 32, 1.0f);
  tensor src("src", tensor_view::contiguous(in.data(), dtype::f32, {4, 32}));
  const std::string two = error_of([&] {
    run_kernel("alias", {src, whole, shifted}, [&] {
      set_vec_tile_shapes({4, 32});
      assemble(neg(view(src, {4, 32}, {0, 0})), {0, 0}, whole);
      assemble(neg(view(src, {4, 32}, {0, 0})), {0, 0}, shifted);
    });
  });
  EXPECT_TRUE(contains(two, "output 'x' and output 'y' share memory"));
  for (float v : data) EXPECT_EQ(v, 3.0f);
}

TEST(TileLoops, LoopScopeIteratedByTheCaller) {
  fixture f;
  std::vector<std::int64_t> seen;
  const auto report = f.run([&] {
    loop_scope outer(0, 2, 1, "outer", {1});
    for (std::size_t k = 0; k < outer.chunks().size(); ++k) {
      outer.begin_chunk(k);
      for (auto i = outer.chunks()[k].begin; i < outer.chunks()[k].end; ++i) {
        loop_scope inner(0, 5, 1, "inner", {4});
        for (std::size_t j = 0; j < inner.chunks().size(); ++j) {
          inner.begin_chunk(j);
          for (auto n = inner.chunks()[j].begin; n < inner.chunks()[j].end; ++n)
            seen.push_back(i * 10 + n);
        }
        // an unrolled scope still open: a loop inside it breaks the rule
        EXPECT_TRUE(contains(error_of([] { loop_scope(0, 1, 1, "in_unrolled", {}); }),
                             "only the innermost loop may be unrolled"));
      }
    }
  });
  // once in the checking pass, once in the executing pass
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 10, 11, 12, 13, 14,
                                             0, 1, 2, 3, 4, 10, 11, 12, 13, 14}));
  EXPECT_EQ(as_tuples(report.chunks),
            (std::vector<chunk_tuple>{{0, 2, 1}, {0, 4, 4}, {4, 5, 1}, {0, 4, 4}, {4, 5, 1}}));
  // a scope that outlives its kernel closes without touching any kernel
  std::optional<loop_scope> late;
  f.run([&] { late.emplace(0, 4, 1, "late", std::vector<std::int64_t>{2}); });
  std::vector<std::int64_t> after;
  f.run([&] {
    late.reset();  // from the previous pass: must not pop this kernel's loops
    loop(0, 2, 1, "outer", {2}, [&](std::int64_t i) { after.push_back(i); });
  });
  EXPECT_EQ(after, (std::vector<std::int64_t>{0, 1, 0, 1}));
  EXPECT_TRUE(contains(error_of(f,
                                [&] {
                                  loop_scope s(0, 4, 1, "s", {});
                                  s.begin_chunk(3);
                                }),
                       "loop: chunk 3 is not one of the loop's 1 chunks"));
}

}  // namespace
