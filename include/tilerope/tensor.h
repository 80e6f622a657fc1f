#pragma once
/// \file tensor.h
/// Non-owning strided views (`tensor_view`) and an owning, contiguous `tensor`.
///
/// Strides are in elements, not bytes. Kernels require the last dimension to be contiguous
/// (stride 1); the outer strides are free, so a view can be cut from a packed buffer:
///
///     qkv: [T, Hq + 2*Hk, D] contiguous
///     q = view(qkv.data,               shape {T, Hq, D}, strides {(Hq+2Hk)*D, D, 1})
///     k = view(qkv.data + Hq*D,        shape {T, Hk, D}, strides {(Hq+2Hk)*D, D, 1})

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tilerope/dtype.h"

namespace tilerope {

inline constexpr int max_rank = 5;

/// A pointer, an element type, and up to five dims with strides in elements.
struct tensor_view {
  void* data = nullptr;
  dtype type = dtype::f32;
  int rank = 0;
  std::array<std::int64_t, max_rank> shape{};
  std::array<std::int64_t, max_rank> strides{};

  tensor_view() = default;
  /// A view with explicit strides (in elements). Throws tilerope::error when rank > 5, the
  /// ranks of `shape` and `strides` differ, or a dim is negative.
  tensor_view(void* data, dtype type, std::initializer_list<std::int64_t> shape,
              std::initializer_list<std::int64_t> strides);
  tensor_view(void* data, dtype type, const std::vector<std::int64_t>& shape,
              const std::vector<std::int64_t>& strides);

  /// A row-major contiguous view of `shape`.
  static tensor_view contiguous(void* data, dtype type, std::initializer_list<std::int64_t> shape);
  static tensor_view contiguous(void* data, dtype type, const std::vector<std::int64_t>& shape);

  /// Product of the dims (1 for rank 0).
  std::int64_t numel() const;
  /// True when the strides are those of a row-major contiguous tensor of this shape.
  bool is_contiguous() const;
  /// "[8, 32, 128]".
  std::string shape_string() const;
  /// "[4096, 128, 1]".
  std::string strides_string() const;
  /// Address of element `index` (rank entries).
  void* element(std::initializer_list<std::int64_t> index) const;
};

/// An owning, contiguous, zero-initialised tensor.
class tensor {
 public:
  tensor() = default;
  tensor(dtype type, std::vector<std::int64_t> shape);
  tensor(tensor&&) = default;
  tensor& operator=(tensor&&) = default;
  tensor(const tensor&) = delete;  // use clone(): a copy must rebind its view
  tensor& operator=(const tensor&) = delete;
  tensor clone() const;

  tensor_view view() const { return view_; }
  operator tensor_view() const { return view_; }
  void* data() const { return view_.data; }
  dtype type() const { return view_.type; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const { return view_.numel(); }
  std::size_t bytes() const { return storage_.size(); }

 private:
  std::vector<std::int64_t> shape_;
  std::vector<unsigned char> storage_;
  tensor_view view_;
};

}  // namespace tilerope
