// Multimodal RoPE (Qwen2-VL / Qwen2.5-VL text path): the mrope_section expansion of the
// three position planes, done in the kernel; q and k (different head counts) in one call.
#include <string>

#include "reference/reference.h"
#include "tilerope/error.h"

namespace tilerope::reference {

using namespace tile;
using tile::tensor;

kernel_report mrope(const tensor_view& q_mem, const tensor_view& k_mem, const tensor_view& cos_mem,
                    const tensor_view& sin_mem, std::array<int, 3> section,
                    const tensor_view& q_out_mem, const tensor_view& k_out_mem,
                    const tile_config& cfg) {
  const std::int64_t B = q_mem.shape[0], Hq = q_mem.shape[1], S = q_mem.shape[2];
  const std::int64_t D = q_mem.shape[3], Hk = k_mem.shape[1], half = D / 2;
  if (section[0] + section[1] + section[2] != half) {
    throw error("mrope_section [" + std::to_string(section[0]) + ", " + std::to_string(section[1]) +
                ", " + std::to_string(section[2]) + "] must sum to head_dim/2 (" +
                std::to_string(half) + ")");
  }
  tensor q("q", q_mem), k("k", k_mem), cos("cos", cos_mem), sin("sin", sin_mem);
  tensor q_out("q_out", q_out_mem), k_out("k_out", k_out_mem);
  const dtype out_type = q_mem.type;

  // cos = cat([c[i % 3] for i, c in enumerate(cos.split(section * 2, -1))], -1)
  const auto sectioned = [&](const tensor& table, std::int64_t b, std::int64_t s) {
    std::vector<value> chunks;
    std::int64_t at = 0;
    for (int i = 0; i < 6; ++i) {
      const std::int64_t width = section[i % 3];
      chunks.push_back(view(table, {1, 1, 1, width}, {i % 3, b, s, at}));  // (1, 1, 1, w)
      at += width;
    }
    return cast(concat(chunks, -1), dtype::f32);  // (1, 1, 1, D)
  };

  return run_kernel(
      "mrope", {q, k, cos, sin}, {q_out, k_out},
      [&] {
        loop(0, B, 1, "batch", {1}, [&](std::int64_t b) {
          loop(0, S, 1, "seq", {4, 2, 1}, [&](std::int64_t s) {
            set_vec_tile_shapes(cfg.tile.value_or(shape_t{1, Hq, 1, D}));
            value cos_s = sectioned(cos, b, s);  // (1, 1, 1, D), broadcast over heads
            value sin_s = sectioned(sin, b, s);  // (1, 1, 1, D)
            for (auto [x, out, heads] : {std::tuple{&q, &q_out, Hq}, std::tuple{&k, &k_out, Hk}}) {
              value xs =
                  cast(view(*x, {1, heads, 1, D}, {b, 0, s, 0}), dtype::f32);  // (1, H, 1, D)
              value x1 = view(xs, {1, heads, 1, half}, {0, 0, 0, 0});          // (1, H, 1, D/2)
              value x2 = view(xs, {1, heads, 1, half}, {0, 0, 0, half});       // (1, H, 1, D/2)
              value rot = concat({neg(x2), x1}, -1);                           // (1, H, 1, D)
              value y = add(mul(xs, cos_s), mul(rot, sin_s));                  // (1, H, 1, D)
              assemble(cast(y, out_type), {b, 0, s, 0}, *out);
            }
          });
        });
      },
      {cfg.ub_bytes});
}

}  // namespace tilerope::reference
