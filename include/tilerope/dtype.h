#pragma once
/// \file dtype.h
/// Element types and the fp32 <-> f16 / bf16 conversions.
///
/// fp32 -> f16 and fp32 -> bf16 round to nearest, ties to even, as PyTorch's `.to()` does:
/// NaN stays NaN (quiet), +-Inf and signed zero are kept, f16 subnormals are produced
/// correctly, values past the largest finite f16 become +-Inf. f16 / bf16 -> fp32 is exact.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tilerope {

/// Element types. f32, f16 and bf16 hold tensor data; i32 and i64 hold positions.
enum class dtype : std::uint8_t { f32, f16, bf16, i32, i64 };

/// "f32", "f16", "bf16", "i32", "i64".
std::string_view to_string(dtype t);

/// Parses the names of to_string (also "float32", "float16", "bfloat16", "int32", "int64").
/// Throws tilerope::error for any other name.
dtype dtype_from_string(std::string_view name);

/// Bytes per element (0 for a value outside the enum).
constexpr std::size_t size_of(dtype t) {
  switch (t) {
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::i64:
      return 8;
  }
  return 0;
}

/// True for f32, f16, bf16.
constexpr bool is_floating(dtype t) {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

/// IEEE binary16, stored as its bit pattern.
struct f16 {
  std::uint16_t bits;
};
/// bfloat16 (the upper half of an fp32), stored as its bit pattern.
struct bf16 {
  std::uint16_t bits;
};

/// fp32 -> f16 bits, round to nearest even.
std::uint16_t f32_to_f16_bits(float x);
/// f16 bits -> fp32, exact.
float f16_bits_to_f32(std::uint16_t bits);
/// fp32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN of the same sign.
std::uint16_t f32_to_bf16_bits(float x);
/// bf16 bits -> fp32, exact.
float bf16_bits_to_f32(std::uint16_t bits);

/// Reads element `i` of a contiguous buffer of type `t` as fp64 (positions as integers).
double load_as_f64(const void* data, dtype t, std::size_t i);
/// Writes `value` into element `i`, rounding once to type `t` (integers truncate).
void store_from_f64(void* data, dtype t, std::size_t i, double value);

}  // namespace tilerope
