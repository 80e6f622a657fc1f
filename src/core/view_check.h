#pragma once
// The invariants of a tensor_view that every size and offset computation relies on. The
// constructors enforce them; the API checks them again, as a view's fields are public.

#include "tilerope/tensor.h"

namespace tilerope::detail {

// Rank in [0, max_rank], a known dtype, no negative dim, and fewer than 2^60 elements both in
// the product of the dims and between the first and the farthest element. Throws
// tilerope::error naming `name` and the values.
void check_view(const char* name, const tensor_view& v);

}  // namespace tilerope::detail
