#include <cstdint>
#include <vector>

#include "apply_call.h"
#include "npy.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"

namespace tilerope::cli {

void run_apply_call(const apply_request& r, const apply_call& call) {
  if (r.norm_backward) {
    qk_norm_rope_backward(r.style, call.grads, call.positions, call.angles, call.norm,
                          call.options);
  } else if (r.variant == apply_variant::qk_norm_rope) {
    qk_norm_rope_apply(r.style, call.x, call.positions, call.angles, call.norm, call.options);
  } else {
    rope_options options = call.options;
    options.backward = r.args.backward;
    rope_apply(r.style, call.x, call.positions, call.angles, options);
  }
}

void write_apply_outputs(const apply_request& r, const apply_call& call) {
  const apply_args& a = r.args;
  const std::vector<std::int64_t> weight_shape = {call.head_dim};
  std::vector<pending_npy> outs;
  outs.emplace_back(a.out_q, call.q.descr, call.q.shape, call.q_out.data(), call.q_out.size());
  if (call.k) {
    outs.emplace_back(a.out_k, call.k->descr, call.k->shape, call.k_out.data(), call.k_out.size());
  }
  if (r.norm_backward && a.given("--out-q-weight-grad")) {
    outs.emplace_back(a.out_q_weight_grad, "<f4", weight_shape, call.q_weight_grad.data(),
                      call.q_weight_grad.size() * sizeof(float));
  }
  if (r.norm_backward && a.given("--out-k-weight-grad")) {
    outs.emplace_back(a.out_k_weight_grad, "<f4", weight_shape, call.k_weight_grad.data(),
                      call.k_weight_grad.size() * sizeof(float));
  }
  for (auto& o : outs) o.commit();
}

}  // namespace tilerope::cli
