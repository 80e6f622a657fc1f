#pragma once
// DLPack arrays (torch tensors, numpy arrays) as tilerope views: no copy, CPU only, and an error
// naming the argument for any other device or dtype.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "tilerope/tensor.h"

namespace tilerope::python {

using array = nanobind::ndarray<>;
using optional_array = std::optional<array>;

/// The view of a CPU array, named `name` in every error.
tensor_view view_of(const array& a, const char* name);

}  // namespace tilerope::python
