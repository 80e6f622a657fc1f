#include "check/case_tensors.h"

#include <algorithm>

namespace tilerope::check {

tensor_view head_view(const rope_case& c, x_buffer& buf, std::int64_t h0, std::int64_t heads) {
  const std::int64_t B = c.batch, S = c.tokens, D = c.head_dim, H = buf.total_heads;
  const auto es = static_cast<std::int64_t>(size_of(c.x_type));
  unsigned char* base = buf.data.data();
  switch (c.layout) {
    case x_layout::thd:
      return tensor_view(base + h0 * D * es, c.x_type, {S, heads, D}, {H * D, D, 1});
    case x_layout::bshd:
      return tensor_view(base + h0 * D * es, c.x_type, {B, S, heads, D}, {S * H * D, H * D, D, 1});
    case x_layout::bhsd:
      return tensor_view(base + h0 * S * D * es, c.x_type, {B, S, heads, D},
                         {H * S * D, D, S * D, 1});
  }
  return {};
}

x_buffer make_buffer(const rope_case& c, std::int64_t total_heads) {
  const std::int64_t b = c.layout == x_layout::thd ? 1 : c.batch;
  x_buffer buf;
  buf.total_heads = total_heads;
  buf.data.assign(
      static_cast<std::size_t>(b * c.tokens * total_heads * c.head_dim) * size_of(c.x_type), 0);
  return buf;
}

void fill_normal(x_buffer& buf, dtype t, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::size_t n = buf.data.size() / size_of(t);
  for (std::size_t i = 0; i < n; ++i) store_from_f64(buf.data.data(), t, i, normal(rng));
}

namespace {

// Element (b, s, h, d) of view v, read from `from` (a buffer of the same size as the one v
// points into, starting at `base`).
double read_at(const tensor_view& v, const unsigned char* base, const unsigned char* from,
               std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  const bool r4 = v.rank == 4;
  const std::int64_t e = r4 ? b * v.strides[0] + s * v.strides[1] + h * v.strides[2] + d
                            : s * v.strides[0] + h * v.strides[1] + d;
  const auto offset = static_cast<const unsigned char*>(v.data) - base;
  const auto es = static_cast<std::int64_t>(size_of(v.type));
  return load_as_f64(from + offset + e * es, v.type, 0);
}

}  // namespace

std::vector<double> gather(const rope_case& c, const tensor_view& v, const unsigned char* base,
                           const unsigned char* from) {
  const std::int64_t B = v.rank == 4 ? v.shape[0] : 1, S = c.tokens;
  const std::int64_t H = v.shape[v.rank - 2], D = c.head_dim;
  std::vector<double> out(static_cast<std::size_t>(B * S * H * D));
  std::size_t i = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d) out[i++] = read_at(v, base, from, b, s, h, d);
  return out;
}

case_tensors make_case_tensors(const rope_case& c, std::mt19937_64& rng) {
  case_tensors x;
  auto& in = x.in;
  if (c.packed) {
    in.push_back(make_buffer(c, c.q_heads + 2 * c.k_heads));
  } else {
    in.push_back(make_buffer(c, c.q_heads));
    if (c.k_heads) in.push_back(make_buffer(c, c.k_heads));
  }
  for (auto& b : in) fill_normal(b, c.x_type, rng);
  x.q = head_view(c, in[0], 0, c.q_heads);
  if (c.k_heads)
    x.k = c.packed ? head_view(c, in[0], c.q_heads, c.k_heads) : head_view(c, in[1], 0, c.k_heads);
  for (auto& b : in) x.before.push_back(b.data);

  auto& out = x.out;
  out = in;
  x.q_out = x.q, x.k_out = x.k;
  if (!c.inplace) {
    for (auto& b : out) std::fill(b.data.begin(), b.data.end(), 0xff);
    x.q_out = head_view(c, out[0], 0, c.q_heads);
    if (c.k_heads) {
      x.k_out = c.packed ? head_view(c, out[0], c.q_heads, c.k_heads)
                         : head_view(c, out[1], 0, c.k_heads);
    }
  }
  return x;
}

}  // namespace tilerope::check
