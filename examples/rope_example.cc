// The README's example: rotate q and k of a packed qkv buffer in place, Llama-3-style.
#include <tilerope/tilerope.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace tilerope;
  const std::int64_t T = 16, Hq = 32, Hk = 8, D = 128, W = Hq + 2 * Hk;

  // qkv: [T, Hq + 2*Hk, D] bf16, as a fused QKV projection writes it
  std::vector<std::uint16_t> qkv(T * W * D);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = f32_to_bf16_bits(std::sin(0.1f * i));
  const std::vector<std::uint16_t> before = qkv;

  rope_tensors x;
  x.q = tensor_view(qkv.data(), dtype::bf16, {T, Hq, D}, {W * D, D, 1});           // (T, Hq, D)
  x.k = tensor_view(qkv.data() + Hq * D, dtype::bf16, {T, Hk, D}, {W * D, D, 1});  // (T, Hk, D)

  // positions 100, 101, ... (a chunk of a longer prompt); tables in fp32
  const rope_table table = make_rope_table(4096, D, 500000.0);
  rope_apply(rope_style::neox, x, rope_positions::from_offset(100),
             rope_angles::from_table(table.cos, table.sin));

  // the same rotation computed here for q[3, 5, 7] and its partner dim 7 + 64
  const double angle = 103 * std::pow(500000.0, -2.0 * 7 / 128);
  const auto at = [&](const std::vector<std::uint16_t>& b, std::int64_t d) {
    return bf16_bits_to_f32(b[(3 * W + 5) * D + d]);
  };
  const double want = at(before, 7) * std::cos(angle) - at(before, 7 + 64) * std::sin(angle);
  const double got = at(qkv, 7);
  std::printf("q[3, 5, 7]: %.5f (expected %.5f)\n", got, want);
  return std::fabs(got - want) <= 1e-2 * (1 + std::fabs(want)) ? 0 : 1;
}
