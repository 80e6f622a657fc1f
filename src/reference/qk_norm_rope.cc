// Qwen3 QK RMSNorm + RoPE, fused: BS_TILE tokens at a time, the tail carried by valid_shape.
#include <algorithm>

#include "reference/reference.h"

namespace tilerope::reference {

using namespace tile;
using tile::tensor;

kernel_report qk_norm_rope(const tensor_view& x_mem, const tensor_view& w_mem,
                           const tensor_view& cos_mem, const tensor_view& sin_mem, double eps,
                           const tensor_view& out_mem, const tile_config& cfg) {
  constexpr std::int64_t bs_tile = 8;
  const std::int64_t S = x_mem.shape[0], N = x_mem.shape[1], D = x_mem.shape[2], half = D / 2;
  // weight [D] seen as [1, 1, D]; cos/sin [S, D] as [S, 1, D]: broadcast over heads
  const tensor_view w3(w_mem.data, w_mem.type, {1, 1, D}, {D, D, 1});
  const auto per_token = [&](const tensor_view& t) {
    return tensor_view(t.data, t.type, {t.shape[0], 1, D}, {t.strides[0], D, 1});
  };
  tensor x("x", x_mem), w("weight", w3), cos("cos", per_token(cos_mem)),
      sin("sin", per_token(sin_mem));
  tensor out("out", out_mem);
  const std::int64_t blocks = (S + bs_tile - 1) / bs_tile;

  return run_kernel(
      "qk_norm_rope", {x, w, cos, sin}, {out},
      [&] {
        loop(0, blocks, 1, "bs", {8, 4, 2, 1}, [&](std::int64_t i) {
          const std::int64_t s0 = i * bs_tile;
          const std::int64_t cur = std::min(bs_tile, S - s0);
          set_vec_tile_shapes(
              cfg.tile.value_or(shape_t{bs_tile, std::min<std::int64_t>(N, 4), half}));
          value xs = cast(view(x, {bs_tile, N, D}, {s0, 0, 0}, shape_t{cur, N, D}),
                          dtype::f32);  // (8, N, D)
          value mean_sq =
              mul(sum(mul(xs, xs), -1, true), 1.0 / static_cast<double>(D));  // (8, N, 1)
          value wf = cast(view(w, {1, 1, D}, {0, 0, 0}), dtype::f32);         // (1, 1, D)
          value h = mul(mul(xs, rsqrt(add(mean_sq, eps))), wf);               // (8, N, D)
          value x_left = view(h, {bs_tile, N, half}, {0, 0, 0});              // (8, N, D/2)
          value x_right = view(h, {bs_tile, N, half}, {0, 0, half});          // (8, N, D/2)
          const shape_t rows = {bs_tile, 1, half};
          const shape_t valid_rows = {cur, 1, half};
          value cos_l = cast(view(cos, rows, {s0, 0, 0}, valid_rows), dtype::f32);  // (8, 1, D/2)
          value sin_l = cast(view(sin, rows, {s0, 0, 0}, valid_rows), dtype::f32);  // (8, 1, D/2)
          value o1 = sub(mul(x_left, cos_l), mul(x_right, sin_l));                  // (8, N, D/2)
          value o2 = add(mul(x_right, cos_l), mul(x_left, sin_l));                  // (8, N, D/2)
          assemble(cast(concat({o1, o2}, -1), x_mem.type), {s0, 0, 0}, out);        // (cur, N, D)
        });
      },
      {cfg.ub_bytes});
}

}  // namespace tilerope::reference
