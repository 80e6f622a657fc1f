// Vision RoPE (a Qwen2.5-VL-style vision tower): q and k rotated in one kernel.
#include "reference/reference.h"

namespace tilerope::reference {

using namespace tile;
using tile::tensor;

kernel_report vision_rope(const tensor_view& q_mem, const tensor_view& k_mem,
                          const tensor_view& cos_mem, const tensor_view& sin_mem,
                          const tensor_view& q_out_mem, const tensor_view& k_out_mem,
                          const tile_config& cfg) {
  const std::int64_t S = q_mem.shape[0], N = q_mem.shape[1], D = q_mem.shape[2], half = D / 2;
  const std::int64_t Nk = k_mem.shape[1];
  // cos/sin [S, D] seen as [S, 1, D]: one row per token, broadcast over heads
  const auto per_token = [&](const tensor_view& t) {
    return tensor_view(t.data, t.type, {t.shape[0], 1, t.shape[1]}, {t.strides[0], t.shape[1], 1});
  };
  tensor q("q", q_mem), k("k", k_mem), cos("cos", per_token(cos_mem)),
      sin("sin", per_token(sin_mem));
  tensor q_out("q_out", q_out_mem), k_out("k_out", k_out_mem);
  const dtype out_type = q_mem.type;

  return run_kernel(
      "vision_rope", {q, k, cos, sin}, {q_out, k_out},
      [&] {
        loop(0, S, 1, "seq", {4, 2, 1}, [&](std::int64_t s) {
          set_vec_tile_shapes(cfg.tile.value_or(shape_t{1, N, D}));
          value cos_s = cast(view(cos, {1, 1, D}, {s, 0, 0}), dtype::f32);  // (1, 1, D)
          value sin_s = cast(view(sin, {1, 1, D}, {s, 0, 0}), dtype::f32);  // (1, 1, D)
          for (auto [x, out, heads] : {std::tuple{&q, &q_out, N}, std::tuple{&k, &k_out, Nk}}) {
            value xs = cast(view(*x, {1, heads, D}, {s, 0, 0}), dtype::f32);  // (1, H, D)
            value x1 = view(xs, {1, heads, half}, {0, 0, 0});                 // (1, H, D/2)
            value x2 = view(xs, {1, heads, half}, {0, 0, half});              // (1, H, D/2)
            value rot = concat({neg(x2), x1}, -1);                            // (1, H, D)
            value y = add(mul(xs, cos_s), mul(rot, sin_s));                   // (1, H, D)
            assemble(cast(y, out_type), {s, 0, 0}, *out);
          }
        });
      },
      {cfg.ub_bytes});
}

}  // namespace tilerope::reference
