// Software prefetch of the rows ahead of the one being read.
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_PREFETCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_PREFETCH_INL_H_
#undef TILEROPE_CPU_PREFETCH_INL_H_
#else
#define TILEROPE_CPU_PREFETCH_INL_H_
#endif

#include "cpu/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- software prefetch -----------------------------------------------------------------------
// Each row's loop asks for the lines `ahead` bytes beyond the row (cpu_plan::prefetch_bytes),
// in the same buffer: the rows further on in a contiguous tensor, which the hardware prefetcher
// alone did not keep enough of in flight where a row's arithmetic is long against its bytes
// (16-bit rows). Asked for a row at a time, spread among the rows' loads: asked for a whole
// block of heads at once before its rows, the same distance measured slower. A prefetch never
// faults: the lines past a buffer's end cost a request, nothing else.
//
// Rows of a multiple of 256 bytes ask for lines from 128 bytes into a 256-byte block of the
// address space: `ahead` plus 0 to 255 bytes, the same for every row of a tensor whose strides
// are multiples of 256 bytes, so that each line is still asked for once. On the Intel class it
// mattered more where in such a block the lines begin than how far ahead they are, and a
// distance alone suits only one start of q and k in their pages (docs/performance.md,
// "Performance decisions").
template <class T>
HWY_INLINE void prefetch_row(const T* row, std::int64_t elements, std::int64_t ahead) {
  if (ahead == 0) return;
  const char* c = reinterpret_cast<const char*>(row) + ahead;
  const auto bytes = elements * static_cast<std::int64_t>(sizeof(T));
  if (bytes % 256 == 0) c += (128 - reinterpret_cast<std::uintptr_t>(c)) & 255;
  for (std::int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(c + b);
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_PREFETCH_INL_H_
