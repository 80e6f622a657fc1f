#pragma once
// The q and k buffers of a rope_case, the views the kernel gets into them, and reading them
// back as fp64 for the golden (internal to run_case).

#include <cstdint>
#include <random>
#include <vector>

#include "check/rope_case.h"
#include "tilerope/tensor.h"

namespace tilerope::check {

using bytes = std::vector<unsigned char>;

// One x buffer holding `total_heads` heads per token, in the case's layout.
struct x_buffer {
  bytes data;
  std::int64_t total_heads = 0;
};

// A view of heads [h0, h0 + heads) of a buffer laid out as the case says.
tensor_view head_view(const rope_case& c, x_buffer& buf, std::int64_t h0, std::int64_t heads);

// A zeroed buffer of `total_heads` heads per token.
x_buffer make_buffer(const rope_case& c, std::int64_t total_heads);

// Every element drawn from N(0, 1), rounded to `t`.
void fill_normal(x_buffer& buf, dtype t, std::mt19937_64& rng);

// Dense [B*S, H, D] fp64 copy of view v's elements as they are in `from` (a buffer of the
// same size as the one v points into, starting at `base`).
std::vector<double> gather(const rope_case& c, const tensor_view& v, const unsigned char* base,
                           const unsigned char* from);

// q and k of a case: one packed [.., Hq + 2 Hk, D] buffer (v last, left untouched), or q and k
// apart; the inputs as drawn; and the outputs: the inputs themselves in place, else buffers
// of the same layout filled with NaN bytes.
struct case_tensors {
  std::vector<x_buffer> in, out;
  std::vector<bytes> before;  // `in` as drawn, to compare against and to check untouched
  tensor_view q, k, q_out, k_out;
};

// Draws q and k from N(0, 1) with `rng`.
case_tensors make_case_tensors(const rope_case& c, std::mt19937_64& rng);

}  // namespace tilerope::check
