// The reference skeleton of rope.md, line for line.
#include "reference/reference.h"

namespace tilerope::reference {

using namespace tile;
using tile::tensor;

kernel_report rope_skeleton(const tensor_view& a_mem, const tensor_view& cos_mem,
                            const tensor_view& sin_mem, const tensor_view& out_mem,
                            const tile_config& cfg) {
  tensor a("a", a_mem), cos("cos", cos_mem), sin("sin", sin_mem), out("out", out_mem);
  const shape_t sl = a.shape();  // e.g. [B, S, D]
  const std::int64_t batch = sl[0];
  const shape_t inner(sl.begin() + 1, sl.end());  // [S, D]
  const std::int64_t half = sl.back() / 2;
  shape_t one_inner = {1};
  one_inner.insert(one_inner.end(), inner.begin(), inner.end());  // [1, S, D]
  shape_t one_half = one_inner;
  one_half.back() = half;  // [1, S, D/2]
  const shape_t zeros(sl.size(), 0);
  shape_t at_half = zeros;
  at_half.back() = half;

  return run_kernel("rope_skeleton", {a, cos, sin}, {out},
                    [&] {
                      loop(0, batch, 1, "batch", {1}, [&](std::int64_t i) {
                        shape_t at_i = zeros;
                        at_i[0] = i;
                        value a_s = view(a, one_inner, at_i);      // (1, S, D)
                        value cos_s = view(cos, one_inner, at_i);  // (1, S, D)
                        value sin_s = view(sin, one_inner, at_i);  // (1, S, D)
                        set_vec_tile_shapes(cfg.tile.value_or(one_inner));
                        value neg_a2 = neg(view(a_s, one_half, at_half));  // (1, S, D/2)
                        value a1 = view(a_s, one_half, zeros);             // (1, S, D/2)
                        value rot = concat({neg_a2, a1}, -1);              // (1, S, D)
                        value r = add(mul(a_s, cos_s), mul(rot, sin_s));   // (1, S, D)
                        assemble(r, at_i, out);
                      });
                    },
                    {cfg.ub_bytes});
}

}  // namespace tilerope::reference
