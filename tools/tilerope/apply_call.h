#pragma once
/// \file apply_call.h
/// One `tilerope apply` call: built from the request (every input file read, checked and
/// viewed), run into memory, and only then written out (internal to the apply files).

#include <cstdint>
#include <optional>
#include <vector>

#include "apply_options.h"
#include "npy.h"
#include "tilerope/freqs.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"
#include "tilerope/rope_config.h"

namespace tilerope::cli {

/// The inputs read, the output buffers and the views the library call gets into them. The
/// views point into the buffers held here, so a call is built in place and never copied.
struct apply_call {
  apply_call() = default;
  apply_call(const apply_call&) = delete;
  apply_call& operator=(const apply_call&) = delete;

  std::optional<rope_config> config;  ///< --config
  npy_array q;
  std::optional<npy_array> k;
  std::vector<unsigned char> q_out, k_out;  ///< out of place: the files are written at the end
  rope_tensors x;
  std::int64_t head_dim = 0, tokens = 0, rotary = 0;
  rope_options options;  ///< the request's, with rotary_dim
  std::vector<int> mrope_axes;
  npy_array ids;                           ///< --positions as read
  std::vector<unsigned char> ids_by_axis;  ///< vision: [S, 2] as [2, S]
  std::optional<vision_2d_frequencies> vision_freqs;
  rope_positions positions = rope_positions::none();
  npy_array cos_rows, sin_rows;  ///< --cos, --sin
  rope_table tables;             ///< --table f32 | x
  rope_angles angles;
  qk_norm norm;  ///< the request's, with the weights
  npy_array q_weight, k_weight, grad_q, grad_k;
  std::vector<float> q_weight_grad, k_weight_grad;  ///< qk-norm-rope --backward: float32 [D]
  qk_norm_rope_grad_tensors grads;                  ///< qk-norm-rope --backward
};

/// Reads every input file, in the order the flags' help lists them, and builds the views,
/// positions, angles and norm of the call. Whatever the files must agree on (ranks, shapes,
/// dtypes, the config's head_dim, the section's sum) is a tilerope::error naming the file.
void build_apply_call(const apply_request& request, apply_call& call);

/// The variant, out of place into the call's output buffers: rope_apply, qk_norm_rope_apply or
/// qk_norm_rope_backward. The library validates every argument before it writes.
void run_apply_call(const apply_request& request, const apply_call& call);

/// Every output written beside its destination first, then all renamed, so that a failed
/// write leaves every destination as it was.
void write_apply_outputs(const apply_request& request, const apply_call& call);

}  // namespace tilerope::cli
