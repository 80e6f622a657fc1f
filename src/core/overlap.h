#pragma once
// Exact memory-overlap tests between strided views, used by argument validation.

#include "tilerope/tensor.h"

namespace tilerope::detail {

// [lo, hi): the bytes any element of a view may touch; empty (lo = hi) for no elements. Left
// unset by default: every call fills arrays of them (decode calls are short).
struct byte_span {
  std::int64_t lo, hi;
};
inline byte_span byte_extent(const tensor_view& v) {
  const auto es = static_cast<std::int64_t>(size_of(v.type));
  byte_span s;
  s.lo = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(v.data));
  s.hi = s.lo + es;
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] == 0) return {s.lo, s.lo};
    const std::int64_t reach = (v.shape[i] - 1) * v.strides[i] * es;
    (reach < 0 ? s.lo : s.hi) += reach;
  }
  return s;
}

// Spans that share no byte cannot overlap: the cheap test before views_share_memory.
inline bool spans_meet(byte_span a, byte_span b) {
  return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

// True when some byte belongs to an element of both views.
bool views_share_memory(const tensor_view& a, const tensor_view& b);

// True when two distinct indices of the view address overlapping bytes (the last dim taken as
// contiguous). Exact for views whose strides nest and for any view of up to 2^22 rows; a larger
// view whose strides do not nest is reported as overlapping.
bool view_overlaps_itself(const tensor_view& v);

// Same pointer, dtype, shape and strides: the one overlap in-place operation allows.
bool same_view(const tensor_view& a, const tensor_view& b);

}  // namespace tilerope::detail
