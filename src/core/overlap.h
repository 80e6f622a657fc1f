#pragma once
// Exact memory-overlap tests between strided views, used by argument validation.

#include "tilerope/tensor.h"

namespace tilerope::detail {

// True when some byte belongs to an element of both views.
bool views_share_memory(const tensor_view& a, const tensor_view& b);

// True when two distinct indices of the view address overlapping bytes (the last dim taken as
// contiguous). Exact for views whose strides nest and for any view of up to 2^22 rows; a larger
// view whose strides do not nest is reported as overlapping.
bool view_overlaps_itself(const tensor_view& v);

// Same pointer, dtype, shape and strides: the one overlap in-place operation allows.
bool same_view(const tensor_view& a, const tensor_view& b);

}  // namespace tilerope::detail
