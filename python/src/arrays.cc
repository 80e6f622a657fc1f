// DLPack arrays as tilerope views (arrays.h).
#include "arrays.h"

#include <cstdint>
#include <string>
#include <vector>

#include "tilerope/dtype.h"
#include "tilerope/error.h"

namespace nb = nanobind;

namespace tilerope::python {
namespace {

std::string device_name(const array& a) {
  switch (a.device_type()) {
    case nb::device::cuda::value:
      return "cuda:" + std::to_string(a.device_id());
    case nb::device::cuda_host::value:
      return "cuda_host";
    case nb::device::rocm::value:
      return "rocm:" + std::to_string(a.device_id());
    case nb::device::metal::value:
      return "mps";
    default:
      return "device type " + std::to_string(a.device_type());
  }
}

std::string dtype_name(nb::dlpack::dtype t) {
  std::string code;
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int:
      code = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      code = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      code = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      code = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      code = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      code = "code" + std::to_string(t.code) + "_";
      break;
  }
  return code + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

std::optional<dtype> tilerope_dtype(nb::dlpack::dtype t) {
  if (t.lanes != 1) return std::nullopt;
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  if (code == nb::dlpack::dtype_code::Float && t.bits == 32) return dtype::f32;
  if (code == nb::dlpack::dtype_code::Float && t.bits == 16) return dtype::f16;
  if (code == nb::dlpack::dtype_code::Bfloat && t.bits == 16) return dtype::bf16;
  if (code == nb::dlpack::dtype_code::Int && t.bits == 32) return dtype::i32;
  if (code == nb::dlpack::dtype_code::Int && t.bits == 64) return dtype::i64;
  return std::nullopt;
}

}  // namespace

/// The view of a CPU array, named `name` in every error.
tensor_view view_of(const array& a, const char* name) {
  if (a.device_type() != nb::device::cpu::value) {
    throw nb::value_error((std::string(name) + " is on " + device_name(a) +
                           ": this build of tilerope runs on the CPU only (no CUDA backend); "
                           "pass CPU tensors")
                              .c_str());
  }
  const std::optional<dtype> t = tilerope_dtype(a.dtype());
  if (!t) {
    throw nb::type_error((std::string(name) + " has dtype " + dtype_name(a.dtype()) +
                          "; tilerope takes float32, float16 and bfloat16 data and int32 or "
                          "int64 positions")
                             .c_str());
  }
  if (a.ndim() > static_cast<std::size_t>(max_rank)) {
    throw error(std::string(name) + " has rank " + std::to_string(a.ndim()) +
                "; tilerope's views have rank <= " + std::to_string(max_rank));
  }
  std::vector<std::int64_t> shape(a.ndim()), strides(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<std::int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  return tensor_view(a.data(), *t, shape, strides);
}

}  // namespace tilerope::python
