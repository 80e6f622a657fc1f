#include "tilerope/tensor.h"

#include <string>

#include "core/view_check.h"
#include "tilerope/error.h"

namespace tilerope {

namespace {
constexpr std::uint64_t max_elements = std::uint64_t{1} << 60;

std::string join(const std::int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

void init(tensor_view& t, const std::int64_t* shape, std::size_t shape_rank,
          const std::int64_t* strides, std::size_t strides_rank) {
  if (shape_rank > static_cast<std::size_t>(max_rank)) {
    throw error("tensor rank (" + std::to_string(shape_rank) +
                ") must be <= " + std::to_string(max_rank));
  }
  if (shape_rank != strides_rank) {
    throw error("tensor shape " + join(shape, static_cast<int>(shape_rank)) + " and strides " +
                join(strides, static_cast<int>(strides_rank)) + " differ in rank");
  }
  t.rank = static_cast<int>(shape_rank);
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  detail::check_view("tensor", t);
}

std::vector<std::int64_t> row_major_strides(const std::int64_t* shape, std::size_t rank) {
  std::vector<std::int64_t> strides(rank);
  std::int64_t s = 1;
  for (std::size_t i = rank; i-- > 0;) {
    strides[i] = s;
    const std::int64_t dim = shape[i] > 0 ? shape[i] : 1;
    if (__builtin_mul_overflow(s, dim, &s) || s > static_cast<std::int64_t>(max_elements)) {
      throw error("tensor shape " + join(shape, static_cast<int>(rank)) +
                  " has more than 2^60 elements");
    }
  }
  return strides;
}
}  // namespace

namespace detail {

void check_view(const char* name, const tensor_view& v) {
  if (v.rank < 0 || v.rank > max_rank) {
    throw error(std::string(name) + " rank (" + std::to_string(v.rank) + ") must be in [0, " +
                std::to_string(max_rank) + "]");
  }
  if (static_cast<unsigned>(v.type) > static_cast<unsigned>(dtype::i64)) {
    throw error(std::string(name) + " dtype (" + std::to_string(static_cast<int>(v.type)) +
                ") is not a dtype");
  }
  // Every element count and offset computed from a view fits in int64, bytes included: the
  // product of the dims (0s counted as 1) and the farthest element are below 2^60.
  std::uint64_t count = 1, extent = 0;
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] < 0) {
      throw error(std::string(name) + " shape " + v.shape_string() + " has a negative dim");
    }
    const auto dim = static_cast<std::uint64_t>(v.shape[i]);
    const auto stride = static_cast<std::uint64_t>(v.strides[i]);
    const std::uint64_t magnitude = v.strides[i] < 0 ? 0 - stride : stride;
    std::uint64_t reach = 0;
    if (__builtin_mul_overflow(count, dim > 0 ? dim : 1, &count) || count > max_elements ||
        __builtin_mul_overflow(dim > 0 ? dim - 1 : 0, magnitude, &reach) ||
        __builtin_add_overflow(extent, reach, &extent) || extent > max_elements) {
      throw error(std::string(name) + " shape " + v.shape_string() + " with strides " +
                  v.strides_string() + " spans more than 2^60 elements");
    }
  }
}

}  // namespace detail

tensor_view::tensor_view(void* data, dtype type, std::initializer_list<std::int64_t> shape,
                         std::initializer_list<std::int64_t> strides)
    : data(data), type(type) {
  init(*this, shape.begin(), shape.size(), strides.begin(), strides.size());
}

tensor_view::tensor_view(void* data, dtype type, const std::vector<std::int64_t>& shape,
                         const std::vector<std::int64_t>& strides)
    : data(data), type(type) {
  init(*this, shape.data(), shape.size(), strides.data(), strides.size());
}

tensor_view tensor_view::contiguous(void* data, dtype type,
                                    std::initializer_list<std::int64_t> shape) {
  return contiguous(data, type, std::vector<std::int64_t>(shape));
}

tensor_view tensor_view::contiguous(void* data, dtype type,
                                    const std::vector<std::int64_t>& shape) {
  if (shape.size() > static_cast<std::size_t>(max_rank)) {
    throw error("tensor rank (" + std::to_string(shape.size()) +
                ") must be <= " + std::to_string(max_rank));
  }
  return tensor_view(data, type, shape, row_major_strides(shape.data(), shape.size()));
}

std::int64_t tensor_view::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool tensor_view::is_contiguous() const {
  const auto expected = row_major_strides(shape.data(), static_cast<std::size_t>(rank));
  for (int i = 0; i < rank; ++i) {
    if (shape[i] > 1 && strides[i] != expected[static_cast<std::size_t>(i)]) return false;
  }
  return true;
}

std::string tensor_view::shape_string() const { return join(shape.data(), rank); }
std::string tensor_view::strides_string() const { return join(strides.data(), rank); }

void* tensor_view::element(std::initializer_list<std::int64_t> index) const {
  std::int64_t offset = 0;
  int i = 0;
  for (std::int64_t v : index) offset += v * strides[static_cast<std::size_t>(i++)];
  return static_cast<unsigned char*>(data) + offset * static_cast<std::int64_t>(size_of(type));
}

tensor::tensor(dtype type, std::vector<std::int64_t> shape) : shape_(std::move(shape)) {
  view_ = tensor_view::contiguous(nullptr, type, shape_);
  storage_.assign(static_cast<std::size_t>(view_.numel()) * size_of(type), 0);
  view_.data = storage_.empty() ? nullptr : storage_.data();
}

tensor tensor::clone() const {
  tensor copy(type(), shape_);
  copy.storage_ = storage_;
  copy.view_.data = copy.storage_.empty() ? nullptr : copy.storage_.data();
  return copy;
}

}  // namespace tilerope
