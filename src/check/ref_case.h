#pragma once
// Check cases of the source material's variants: golden vs the tile-layer reference kernel,
// and golden vs the production kernel where one computes the same thing.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reference/reference.h"
#include "tilerope/dtype.h"

namespace tilerope::check {

enum class ref_kernel { skeleton, vision, mrope, qk_norm_rope, interleave };
std::string_view to_string(ref_kernel k);
ref_kernel ref_kernel_from_string(std::string_view name);
std::vector<std::string> ref_kernel_names();

struct ref_case {
  std::string name;
  ref_kernel kernel = ref_kernel::vision;
  dtype x_type = dtype::f32;
  std::int64_t batch = 1;    // skeleton, mrope, interleave
  std::int64_t seq = 31;     // S
  std::int64_t heads = 16;   // N (vision, qk_norm_rope, interleave) or Hq (mrope)
  std::int64_t k_heads = 2;  // vision, mrope
  std::int64_t head_dim = 128;
  std::array<int, 3> section = {16, 24, 24};  // mrope
  bool table_seq1 = false;                    // interleave: cos/sin [B, 1, 1, D]
  reference::interleave_output output = reference::interleave_output::split_half;
  reference::interleave_path path = reference::interleave_path::deinterleave;
  double eps = 1e-6;  // qk_norm_rope
  std::uint64_t seed = 1;
  std::optional<double> atol, rtol;
  reference::tile_config tiles;
};

struct ref_result {
  double max_abs_err = 0, max_rel_err = 0;  // reference kernel vs golden
  std::optional<double> prod_max_abs_err;   // production kernel vs golden
  double atol = 0, rtol = 0;
  bool pass = false;
  std::string problem;
  std::string shape;
  tile::kernel_report report;  // of the reference kernel (the last call for two-call kernels)
};

ref_result run_ref_case(const ref_case& c);
std::string ref_variant_of(const ref_case& c);

}  // namespace tilerope::check
