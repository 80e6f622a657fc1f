#pragma once
// The built-in cases, embedded in the binary: `tilerope check` runs them all, the kernel tests
// the rope ones on every SIMD target, `tilerope run` one reference-kernel case per kernel.

#include <vector>

#include "check/ref_case.h"
#include "check/rope_case.h"

namespace tilerope::check {

// Every style x dtype x head_dim, partial rotary, packed GQA, layouts, position forms, tables,
// backward, MRoPE, vision, QK RMSNorm + RoPE and interleaved RoPE, seeded.
std::vector<rope_case> builtin_cases();

// The reference-kernel cases: the article's smoke shapes and small ones.
std::vector<ref_case> builtin_ref_cases();

}  // namespace tilerope::check
