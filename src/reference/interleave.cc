// Interleaved RoPE (even/odd pairs), with the interleaved output and the split-half output
// of the NPU-compatible form, through deinterleave or through gathermask.
#include <algorithm>

#include "reference/reference.h"

namespace tilerope::reference {

using namespace tile;
using tile::tensor;

kernel_report interleave_rope(const tensor_view& x_mem, const tensor_view& cos_mem,
                              const tensor_view& sin_mem, interleave_output output,
                              interleave_path path, const tensor_view& out_mem,
                              const tile_config& cfg) {
  constexpr std::int64_t s_tile = 8;
  const std::int64_t B = x_mem.shape[0], N = x_mem.shape[1], S = x_mem.shape[2];
  const std::int64_t D = x_mem.shape[3], half = D / 2;
  const bool table_per_token = cos_mem.shape[2] != 1;  // [B, 1, S, D], or [B, 1, 1, D] for all S
  tensor x("x", x_mem), cos("cos", cos_mem), sin("sin", sin_mem), out("out", out_mem);
  const auto split = [&](const value& v) {
    if (path == interleave_path::deinterleave) return deinterleave(v);
    return std::pair{gathermask(v, 1), gathermask(v, 2)};
  };

  return run_kernel(
      "interleave_rope", {x, cos, sin}, {out},
      [&] {
        loop(0, B, 1, "batch", {1}, [&](std::int64_t b) {
          loop(0, (S + s_tile - 1) / s_tile, 1, "seq", {2, 1}, [&](std::int64_t i) {
            const std::int64_t s0 = i * s_tile, cur = std::min(s_tile, S - s0);
            set_vec_tile_shapes(
                cfg.tile.value_or(shape_t{1, std::min<std::int64_t>(N, 8), s_tile, half}));
            value xs =
                cast(view(x, {1, N, s_tile, D}, {b, 0, s0, 0}, shape_t{1, N, cur, D}), dtype::f32);
            const std::int64_t ts = table_per_token ? s_tile : 1;
            const shape_t t_at = {b, 0, table_per_token ? s0 : 0, 0};
            const shape_t t_valid = {1, 1, table_per_token ? cur : 1, D};
            value c = cast(view(cos, {1, 1, ts, D}, t_at, t_valid), dtype::f32);  // (1, 1, St|1, D)
            value s = cast(view(sin, {1, 1, ts, D}, t_at, t_valid), dtype::f32);  // (1, 1, St|1, D)
            auto [xe, xo] = split(xs);                                            // (1, N, St, D/2)
            value y;
            if (output == interleave_output::interleaved) {
              auto [ce, co] = split(c);  // positional tables: the entries at 2k and 2k+1
              auto [se, so] = split(s);
              value ye = sub(mul(xe, ce), mul(xo, se));
              value yo = add(mul(xo, co), mul(xe, so));
              y = interleave(ye, yo);  // (1, N, St, D)
            } else {
              const shape_t h = {1, 1, ts, half};
              value c1 = view(c, h, {0, 0, 0, 0}), c2 = view(c, h, {0, 0, 0, half});
              value s1 = view(s, h, {0, 0, 0, 0}), s2 = view(s, h, {0, 0, 0, half});
              value ye = sub(mul(xe, c1), mul(xo, s1));
              value yo = add(mul(xe, s2), mul(xo, c2));
              y = concat({ye, yo}, -1);  // (1, N, St, D): split-half layout
            }
            assemble(cast(y, x_mem.type), {b, 0, s0, 0}, out);
          });
        });
      },
      {cfg.ub_bytes});
}

}  // namespace tilerope::reference
