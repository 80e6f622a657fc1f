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
// (16-bit rows). Asked for a row at a time, spread among the rows' loads; asked for a whole
// block of heads at once before its rows, the same distance measured slower (bf16 rope-neox in
// place, one thread, Intel: 0.22-0.23 ns per element, 0.18-0.19 a row at a time, 0.25-0.26
// without). A prefetch never faults: the lines past a buffer's end cost a request, nothing else.
//
// Rows of a multiple of 256 bytes ask for lines from 128 bytes into a 256-byte block of the
// address space: `ahead` plus 0 to 255 bytes, the same for every row of a tensor whose strides
// are multiples of 256 bytes, so that each line is still asked for once. On the Intel class,
// where in such a block the lines begin mattered more than how far ahead they are. Rope-neox
// bf16 in place, Qwen3-8B, one thread, 256 MiB flushed between runs, against a
// read-modify-write of the same bytes (medians): q and k starting 0, 16, 64, 80 and 2048 bytes
// into a page read 0.71, 0.72, 0.92, 0.91 and 0.70 of it at 2048 bytes ahead, and 1.05, 1.03,
// 1.04, 1.02 and 0.93 with the lines from 128 bytes into a block. A distance alone suits one
// start: 2048 + 64 bytes ahead read 0.88-0.94 for q and k at the start of a page and 1.06 for
// them 64 bytes in, 2048 + 128 bytes 1.04 and 0.91-0.93 (docs/performance.md).
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
