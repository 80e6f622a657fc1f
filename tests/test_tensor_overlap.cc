// tensor_view basics and the exact overlap test used by validation.

#include <gtest/gtest.h>

#include <vector>

#include "core/overlap.h"
#include "tilerope/tensor.h"

namespace {

using namespace tilerope;
using detail::same_view;
using detail::view_overlaps_itself;
using detail::views_share_memory;

TEST(TensorView, ContiguousStridesAndNumel) {
  float buf[24];
  const auto v = tensor_view::contiguous(buf, dtype::f32, {2, 3, 4});
  EXPECT_EQ(v.strides_string(), "[12, 4, 1]");
  EXPECT_EQ(v.shape_string(), "[2, 3, 4]");
  EXPECT_EQ(v.numel(), 24);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.element({1, 2, 3}), static_cast<void*>(buf + 23));
  const tensor t(dtype::bf16, {3, 5});
  EXPECT_EQ(t.bytes(), 30u);
  const tensor c = t.clone();
  EXPECT_NE(c.data(), t.data());
}

// q and k cut from one packed qkv buffer [T, Hq + 2 Hk, D] share no element, although their
// address ranges interleave; the same holds in BSHD, and a one-head shift is an overlap.
TEST(Overlap, PackedQkvViewsAreDisjoint) {
  const std::int64_t T = 1000, Hq = 32, Hk = 8, D = 128, W = Hq + 2 * Hk;
  std::vector<std::uint16_t> qkv(T * W * D);
  auto* base = qkv.data();
  const tensor_view q(base, dtype::bf16, {T, Hq, D}, {W * D, D, 1});
  const tensor_view k(base + Hq * D, dtype::bf16, {T, Hk, D}, {W * D, D, 1});
  const tensor_view v(base + (Hq + Hk) * D, dtype::bf16, {T, Hk, D}, {W * D, D, 1});
  EXPECT_FALSE(views_share_memory(q, k));
  EXPECT_FALSE(views_share_memory(k, v));
  EXPECT_FALSE(views_share_memory(q, v));
  EXPECT_TRUE(views_share_memory(q, q));
  const tensor_view k_shifted(base + (Hq - 1) * D, dtype::bf16, {T, Hk, D}, {W * D, D, 1});
  EXPECT_TRUE(views_share_memory(q, k_shifted));
  const tensor_view k_one_elem(base + Hq * D - 1, dtype::bf16, {T, Hk, D}, {W * D, D, 1});
  EXPECT_TRUE(views_share_memory(q, k_one_elem));
  // the last token's k against the first token's q of a later buffer position
  const tensor_view q_next(base + W * D, dtype::bf16, {T - 1, Hq, D}, {W * D, D, 1});
  EXPECT_FALSE(views_share_memory(q_next, k));
  EXPECT_TRUE(views_share_memory(q_next, q));
}

TEST(Overlap, BhsdAndMixedStrides) {
  const std::int64_t B = 2, H = 4, S = 6, D = 16;
  std::vector<float> buf(B * H * S * D);
  const tensor_view bhsd(buf.data(), dtype::f32, {B, S, H, D}, {H * S * D, D, S * D, 1});
  const tensor_view heads01(buf.data(), dtype::f32, {B, S, 2, D}, {H * S * D, D, S * D, 1});
  const tensor_view heads23(buf.data() + 2 * S * D, dtype::f32, {B, S, 2, D},
                            {H * S * D, D, S * D, 1});
  EXPECT_FALSE(views_share_memory(heads01, heads23));
  EXPECT_TRUE(views_share_memory(bhsd, heads23));
  // A transposed view of the same bytes (different strides): rows still coincide.
  const tensor_view flat = tensor_view::contiguous(buf.data() + 5 * D, dtype::f32, {1, 1, D});
  EXPECT_TRUE(views_share_memory(bhsd, flat));
  EXPECT_FALSE(view_overlaps_itself(bhsd));
}

TEST(Overlap, SelfOverlapAndSameView) {
  float buf[64];
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f32, {4, 2, 8}, {8, 0, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f32, {4, 8}, {4, 1})));
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf, dtype::f32, {4, 8}, {16, 1})));
  // strides that do not nest, rows still apart (starts 0, 7, 14, 9, 16, 23) or meeting
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf, dtype::f32, {2, 3, 2}, {9, 7, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f32, {2, 3, 2}, {8, 7, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f32, {2, 3, 3}, {9, 7, 1})));
  const auto a = tensor_view::contiguous(buf, dtype::f32, {4, 8});
  EXPECT_TRUE(same_view(a, tensor_view::contiguous(buf, dtype::f32, {4, 8})));
  EXPECT_FALSE(same_view(a, tensor_view::contiguous(buf, dtype::f32, {8, 4})));
  EXPECT_FALSE(views_share_memory(a, tensor_view::contiguous(buf + 32, dtype::f32, {4, 8})));
  EXPECT_FALSE(views_share_memory(a, tensor_view::contiguous(nullptr, dtype::f32, {0, 8})));
}

// Views whose rows nest in their own order of dims are decided without sorting; views that do
// not (a stride short of the span inside it, negative or zero strides, dims out of order) are
// sorted and decided as before. Both answers, at the boundary, in two element sizes.
TEST(Overlap, SelfOverlapInTheViewsOwnOrder) {
  float buf[64];
  // rows of 4 touching end to start, and one element short of it
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf, dtype::f32, {3, 4}, {4, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f32, {3, 4}, {3, 1})));
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf, dtype::f16, {3, 4}, {4, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f16, {3, 4}, {3, 1})));
  // the outer stride must clear the span of both inner dims (4 + 2 * 4 = 12)
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf, dtype::f32, {2, 3, 4}, {12, 4, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f32, {2, 3, 4}, {11, 4, 1})));
  // a size-1 dim's stride is never used
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf, dtype::f32, {3, 1, 4}, {4, 0, 1})));
  // a negative stride: the same rows mirrored
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf + 8, dtype::f32, {3, 4}, {-4, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf + 8, dtype::f32, {3, 4}, {-3, 1})));
  // dims out of order: rows 2i + 8j of 2 elements tile [0, 24) once; one more element meets
  EXPECT_FALSE(view_overlaps_itself(tensor_view(buf, dtype::f32, {4, 3, 2}, {2, 8, 1})));
  EXPECT_TRUE(view_overlaps_itself(tensor_view(buf, dtype::f32, {4, 3, 3}, {2, 8, 1})));
}

TEST(Overlap, ByteExtents) {
  float buf[64];
  const auto at = [&](const float* p) {
    return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(p));
  };
  const detail::byte_span rows = detail::byte_extent(tensor_view(buf, dtype::f32, {3, 4}, {16, 1}));
  EXPECT_EQ(rows.lo, at(buf));
  EXPECT_EQ(rows.hi, at(buf + 36));
  // a negative stride reaches below its pointer
  const detail::byte_span down =
      detail::byte_extent(tensor_view(buf + 32, dtype::f32, {3, 4}, {-16, 1}));
  EXPECT_EQ(down.lo, at(buf));
  EXPECT_EQ(down.hi, at(buf + 36));
  // no elements: an empty span, meeting nothing, not even a view around its pointer
  const tensor_view empty(buf + 8, dtype::f32, {0, 4}, {4, 1});
  const detail::byte_span none = detail::byte_extent(empty);
  EXPECT_EQ(none.lo, none.hi);
  EXPECT_FALSE(detail::spans_meet(none, rows));
  EXPECT_FALSE(detail::spans_meet(rows, none));
  EXPECT_FALSE(views_share_memory(empty, tensor_view::contiguous(buf, dtype::f32, {64})));
  // spans that touch end to start do not meet; one byte more does
  const detail::byte_span first{0, 16}, next{16, 32}, into{15, 32};
  EXPECT_FALSE(detail::spans_meet(first, next));
  EXPECT_TRUE(detail::spans_meet(first, into));
  EXPECT_TRUE(detail::spans_meet(into, first));
}

}  // namespace
