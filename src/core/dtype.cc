#include "tilerope/dtype.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/enum_names.h"
#include "tilerope/error.h"

namespace tilerope {

namespace {
constexpr detail::enum_name<dtype> dtype_names[] = {
    {dtype::f32, "f32"},           {dtype::f16, "f16"},
    {dtype::bf16, "bf16"},         {dtype::i32, "i32"},
    {dtype::i64, "i64"},           {dtype::f32, "float32", true},
    {dtype::f16, "float16", true}, {dtype::bf16, "bfloat16", true},
    {dtype::i32, "int32", true},   {dtype::i64, "int64", true}};
}  // namespace

std::string_view to_string(dtype t) { return detail::name_of(dtype_names, t); }

dtype dtype_from_string(std::string_view name) {
  return detail::value_named(dtype_names, name, "dtype");
}

namespace {
std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
}  // namespace

std::uint16_t f32_to_f16_bits(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  const int exp = static_cast<int>(abs >> 23);    // biased fp32 exponent
  if (exp >= 113) {                               // normal f16 (unbiased >= -14)
    // Re-bias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
    const std::uint32_t rebased = abs - (112u << 23);
    const std::uint32_t lsb = (rebased >> 13) & 1u;
    return static_cast<std::uint16_t>(sign | ((rebased + 0xfffu + lsb) >> 13));
  }
  if (exp < 102) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal f16: value = m * 2^-24 with m = mantissa (implicit 1 included) >> shift.
  const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const int shift = 126 - exp;  // 14 .. 24
  const std::uint32_t kept = mant >> shift;
  const std::uint32_t rest = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  const std::uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  return static_cast<std::uint16_t>(sign | rounded);
}

float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
  // zero or subnormal: mant * 2^-24, exact in fp32
  const float magnitude = static_cast<float>(mant) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

std::uint16_t f32_to_bf16_bits(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

float bf16_bits_to_f32(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

namespace {
// fp64 -> 16-bit float, rounded once. Going through fp32 could round twice, so the fp32 route
// gives a candidate and its neighbour on the far side of value decides, ties to even.
std::uint16_t round_f64_to_half(double value, std::uint16_t (*to_bits)(float),
                                float (*from_bits)(std::uint16_t), std::uint16_t inf_bits) {
  const float f = static_cast<float>(value);
  const std::uint16_t h = to_bits(f);
  if (static_cast<double>(f) == value || !std::isfinite(value)) return h;
  const std::uint16_t sign = h & 0x8000u;
  const std::uint16_t mag = h & 0x7fffu;
  if (mag == inf_bits) {  // the fp32 route overflowed: Inf from half an ulp past the largest
    const double largest = from_bits(inf_bits - 1);
    const double ulp = largest - static_cast<double>(from_bits(inf_bits - 2));
    return std::fabs(value) >= largest + ulp / 2
               ? h
               : static_cast<std::uint16_t>(sign | (inf_bits - 1));
  }
  const double here = from_bits(h);
  const bool above = std::fabs(here) > std::fabs(value);
  const std::uint16_t other_mag = above ? (mag == 0 ? 0 : mag - 1) : mag + 1;
  const std::uint16_t other = sign | other_mag;
  const double d_here = std::fabs(here - value);
  const double d_other = std::fabs(static_cast<double>(from_bits(other)) - value);
  return (d_other < d_here || (d_other == d_here && (other & 1u) == 0)) ? other : h;
}
}  // namespace

double load_as_f64(const void* data, dtype t, std::size_t i) {
  switch (t) {
    case dtype::f32:
      return static_cast<const float*>(data)[i];
    case dtype::f16:
      return f16_bits_to_f32(static_cast<const std::uint16_t*>(data)[i]);
    case dtype::bf16:
      return bf16_bits_to_f32(static_cast<const std::uint16_t*>(data)[i]);
    case dtype::i32:
      return static_cast<const std::int32_t*>(data)[i];
    case dtype::i64:
      return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
  }
  return 0;
}

void store_from_f64(void* data, dtype t, std::size_t i, double value) {
  switch (t) {
    case dtype::f32:
      static_cast<float*>(data)[i] = static_cast<float>(value);
      return;
    case dtype::f16:
      static_cast<std::uint16_t*>(data)[i] =
          round_f64_to_half(value, f32_to_f16_bits, f16_bits_to_f32, 0x7c00u);
      return;
    case dtype::bf16:
      static_cast<std::uint16_t*>(data)[i] =
          round_f64_to_half(value, f32_to_bf16_bits, bf16_bits_to_f32, 0x7f80u);
      return;
    case dtype::i32:
      static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(value);
      return;
    case dtype::i64:
      static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(value);
      return;
  }
}

}  // namespace tilerope
