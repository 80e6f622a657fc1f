#include "output_cache.h"

#include <nanobind/ndarray.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "tilerope/error.h"
#include "tilerope/tensor.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tilerope::python {
namespace {

constexpr std::size_t huge_page = std::size_t{1} << 21;

// TILEROPE_OUTPUT_CACHE_BYTES, else 1 GiB.
std::size_t default_limit() {
  const char* v = std::getenv("TILEROPE_OUTPUT_CACHE_BYTES");
  if (!v) return std::size_t{1} << 30;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || v[0] == '-') {
    throw error("TILEROPE_OUTPUT_CACHE_BYTES ('" + std::string(v) +
                "') must be a non-negative integer (bytes)");
  }
  return static_cast<std::size_t>(n);
}

// Freed buffers by size (a multiple of 2 MiB). Never destroyed: tensors may be freed after
// static destructors have run, at interpreter exit.
class cache {
 public:
  void* take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
    }
    void* p = std::aligned_alloc(huge_page, bytes);
    if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, bytes, MADV_HUGEPAGE);  // a hint: fewer, larger faults on the first write
#endif
    return p;
  }

  void give(void* p, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + bytes <= limit_) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  std::size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }
  std::size_t limit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }
  void set_limit(std::size_t limit) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limit_ = limit;
    }
    trim();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bytes, p] : free_) std::free(p);
    free_.clear();
    cached_ = 0;
  }

 private:
  void trim() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end() && cached_ > limit_;) {
      std::free(it->second);
      cached_ -= it->first;
      it = free_.erase(it);
    }
  }

  std::mutex mutex_;
  std::unordered_multimap<std::size_t, void*> free_;
  std::size_t cached_ = 0;
  std::size_t limit_ = default_limit();
};

cache& the_cache() {
  static cache* c = new cache();
  return *c;
}

// DLPack's DLManagedTensor, with room for the shape and strides it points to.
struct managed_tensor {
  nanobind::dlpack::dltensor tensor;
  void* manager_ctx;
  void (*deleter)(managed_tensor*);
  std::int64_t shape[max_rank];
  std::int64_t strides[max_rank];
  std::size_t bytes;
};

void release(managed_tensor* m) {
  the_cache().give(m->tensor.data, m->bytes);
  delete m;
}

// A capsule nobody consumed still owns its tensor.
void release_unconsumed(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<managed_tensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    m->deleter(m);
  }
}

nanobind::dlpack::dtype dlpack_dtype(dtype t) {
  nanobind::dlpack::dtype d;
  d.code = static_cast<std::uint8_t>(t == dtype::bf16 ? nanobind::dlpack::dtype_code::Bfloat
                                                      : nanobind::dlpack::dtype_code::Float);
  d.bits = static_cast<std::uint8_t>(8 * size_of(t));
  d.lanes = 1;
  return d;
}

}  // namespace

PyObject* cached_empty(const std::vector<std::int64_t>& shape,
                       const std::vector<std::int64_t>& strides, dtype type) {
  if (!is_floating(type) || shape.size() != strides.size() || shape.empty() ||
      shape.size() > static_cast<std::size_t>(max_rank)) {
    throw error("cached_empty: a floating dtype and 1 to " + std::to_string(max_rank) +
                " dims with as many strides are needed");
  }
  std::int64_t span = 1;  // elements from the first to one past the last
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0 || strides[i] < 0) {
      throw error("cached_empty: dims must be > 0 and strides >= 0");
    }
    span += (shape[i] - 1) * strides[i];
  }
  const std::size_t bytes =
      (static_cast<std::size_t>(span) * size_of(type) + huge_page - 1) / huge_page * huge_page;
  auto* m = new managed_tensor{};
  m->bytes = bytes;
  m->deleter = release;
  m->tensor.data = the_cache().take(bytes);
  m->tensor.device = {nanobind::device::cpu::value, 0};
  m->tensor.ndim = static_cast<std::int32_t>(shape.size());
  m->tensor.dtype = dlpack_dtype(type);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    m->shape[i] = shape[i];
    m->strides[i] = strides[i];
  }
  m->tensor.shape = m->shape;
  m->tensor.strides = m->strides;
  PyObject* capsule = PyCapsule_New(m, "dltensor", release_unconsumed);
  if (!capsule) release(m);
  return capsule;
}

std::size_t output_cache_bytes() { return the_cache().bytes(); }
std::size_t output_cache_limit() { return the_cache().limit(); }
void set_output_cache_limit(std::size_t bytes) { the_cache().set_limit(bytes); }
void empty_output_cache() { the_cache().clear(); }

}  // namespace tilerope::python
