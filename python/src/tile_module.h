#pragma once
// tilerope._C.tile: the tile layer (include/tilerope/tile.h) for tilerope.pypto.

#include <nanobind/nanobind.h>

namespace tilerope::python {

void bind_tile(nanobind::module_ m);

}  // namespace tilerope::python
