// Past 2^31 elements and 2^32 bytes: 64-bit indexing end to end. A dense bf16 q of
// 2^31 + 2^18 elements (4 GiB) rotated in place, its last tokens checked against the fp64
// golden; and strided views whose byte offsets pass 2^32 (and 2^34), in address space reserved
// without being touched, so they cost no memory.

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/rope.h"
#include "tilerope/runtime.h"

namespace {

using namespace tilerope;

// Anonymous memory: pages cost nothing until written.
struct mapping {
  void* p = MAP_FAILED;
  std::size_t bytes = 0;
  explicit mapping(std::size_t n) : bytes(n) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
             0);
  }
  ~mapping() {
    if (p != MAP_FAILED) munmap(p, bytes);
  }
  unsigned char* data() const { return static_cast<unsigned char*>(p); }
};

std::uint16_t bf16_bits_at(std::int64_t i) {  // 1.0 .. 1.99, then negated every other 128
  return static_cast<std::uint16_t>(0x3F80 + (i & 0x7F) + ((i >> 7) & 1) * 0x8000);
}

double bf16_value(std::uint16_t bits) {
  std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The golden rotation (neox, full rotary, computed fp64 angles) of row (t, h) of the pattern.
void expect_rows_match(const std::uint16_t* y, std::int64_t t, std::int64_t H, std::int64_t D,
                       const std::vector<double>& inv) {
  std::vector<double> c(D), s(D), x(D), want(D);
  for (std::int64_t i = 0; i < D / 2; ++i) {
    const double a = static_cast<double>(t) * inv[i];
    c[i] = c[i + D / 2] = std::cos(a);
    s[i] = s[i + D / 2] = std::sin(a);
  }
  const golden::tolerance tol = golden::tolerance_for(dtype::bf16);
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t row = (t * H + h) * D;
    for (std::int64_t d = 0; d < D; ++d) x[d] = bf16_value(bf16_bits_at(row + d));
    golden::rotate_row(golden::variant::neox, D, D, c.data(), s.data(), x.data(), want.data());
    for (std::int64_t d = 0; d < D; ++d) {
      const double got = bf16_value(y[row + d]);
      ASSERT_LE(std::fabs(got - want[d]), tol.atol + tol.rtol * std::fabs(want[d]))
          << "token " << t << " head " << h << " dim " << d << " (element " << row + d << ")";
    }
  }
}

TEST(Large, DenseBf16PastTwoToThe31ElementsInPlace) {
  const std::int64_t H = 32, D = 128;
  const std::int64_t T = (std::int64_t{1} << 31) / (H * D) + 64;  // 2^31 + 2^18 elements
  const std::int64_t n = T * H * D;
  mapping m(static_cast<std::size_t>(n) * 2);
  ASSERT_NE(m.p, MAP_FAILED) << "cannot map " << n * 2 << " bytes";
  auto* q = reinterpret_cast<std::uint16_t*>(m.data());
  for (std::int64_t i = 0; i < n; ++i) q[i] = bf16_bits_at(i);

  rope_tensors x;
  x.q = tensor_view::contiguous(q, dtype::bf16, {T, H, D});
  rope_apply(rope_style::neox, x, rope_positions::from_offset(0), rope_angles::from_theta(1e6));

  const std::vector<double> inv = golden::inv_freq(D, 1e6);
  for (std::int64_t t : {std::int64_t{0}, std::int64_t{1}, T / 2})
    expect_rows_match(q, t, H, D, inv);
  for (std::int64_t t = T - 64; t < T; ++t) expect_rows_match(q, t, H, D, inv);  // past 2^31
}

TEST(Large, StridedViewsPastTwoToThe32Bytes) {
  // q [3, 2, 64] f32 with a token stride of 2^31 + 64 elements: token 2 starts 2^34 bytes in;
  // k [3, 1, 64] interleaved in the same rows; out of place into a second such mapping.
  const std::int64_t T = 3, D = 64, stride = (std::int64_t{1} << 31) + 64;
  const std::size_t bytes = static_cast<std::size_t>((T - 1) * stride + 3 * D) * 4;
  mapping in(bytes), out(bytes);
  ASSERT_NE(in.p, MAP_FAILED);
  ASSERT_NE(out.p, MAP_FAILED);
  auto* xi = reinterpret_cast<float*>(in.data());
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t e = 0; e < 3 * D; ++e)
      xi[t * stride + e] = 0.01f * static_cast<float>(e + 7 * t) - 1;
  }
  rope_tensors x;
  x.q = tensor_view(in.data(), dtype::f32, {T, 2, D}, {stride, D, 1});
  x.k = tensor_view(in.data() + 2 * D * 4, dtype::f32, {T, 1, D}, {stride, D, 1});
  x.q_out = tensor_view(out.data(), dtype::f32, {T, 2, D}, {stride, D, 1});
  x.k_out = tensor_view(out.data() + 2 * D * 4, dtype::f32, {T, 1, D}, {stride, D, 1});
  const std::int64_t pos[T] = {5, 4000, 70000};
  rope_apply(rope_style::gptj, x,
             rope_positions::from_ids(
                 tensor_view::contiguous(const_cast<std::int64_t*>(pos), dtype::i64, {T})),
             rope_angles::from_theta(1e4));

  const std::vector<double> inv = golden::inv_freq(D, 1e4);
  const golden::tolerance tol = golden::tolerance_for(dtype::f32);
  const auto* yo = reinterpret_cast<const float*>(out.data());
  std::vector<double> c(D), s(D), row(D), want(D);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < D / 2; ++i) {
      c[2 * i] = c[2 * i + 1] = std::cos(static_cast<double>(pos[t]) * inv[i]);
      s[2 * i] = s[2 * i + 1] = std::sin(static_cast<double>(pos[t]) * inv[i]);
    }
    for (std::int64_t h = 0; h < 3; ++h) {
      const std::int64_t at = t * stride + h * D;  // k is head 2 of the row
      for (std::int64_t d = 0; d < D; ++d) row[d] = xi[at + d];
      golden::rotate_row(golden::variant::gptj, D, D, c.data(), s.data(), row.data(), want.data());
      for (std::int64_t d = 0; d < D; ++d) {
        ASSERT_LE(std::fabs(yo[at + d] - want[d]), tol.atol + tol.rtol * std::fabs(want[d]))
            << "token " << t << " head " << h << " dim " << d << " (byte " << (at + d) * 4 << ")";
      }
    }
  }
}

}  // namespace
