// The ceiling loops (ceiling.h): one body per vector width, the wide ones compiled for their
// instruction set and run only where the CPU has it.

#include "ceiling.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace tilerope::bench {

namespace {

// Iterations [0, n) in chunks taken by whichever thread is free, about 16 per thread, as the
// kernels take their tokens (run_rope_cpu): a thread the machine slows down does not hold up
// the loop, for the ceiling as for the kernel.
template <class F>
void for_chunks(std::size_t n, int threads, F&& f) {
  const std::size_t chunk = std::max<std::size_t>(1, n / (16 * static_cast<std::size_t>(threads)));
  std::atomic<std::size_t> next{0};
#pragma omp parallel num_threads(threads)
  for (std::size_t lo = next.fetch_add(chunk); lo < n; lo = next.fetch_add(chunk))
    f(lo, std::min(n, lo + chunk));
}

// What the loops add is a zero the compiler cannot see (read from a volatile): v + 0, o & 0.
volatile int ceiling_zero = 0;

inline void prefetch_ahead(const unsigned char* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + ceiling_prefetch_bytes), _MM_HINT_T0);
}

// The loop bodies over the vectors [lo, hi) of `W` bytes, written once through a vector type's
// operations; a prefetch every 64 bytes of each buffer read in the prefetching form.
#define TILEROPE_CEILING_LOOPS(W, VEC, LOAD, STORE, STREAM, SET1, ADD, AND, TARGET)            \
  template <bool Prefetch>                                                                     \
  TARGET void rmw_range_##W(unsigned char* v, const unsigned char* o, std::size_t lo,          \
                            std::size_t hi, int z) {                                           \
    const VEC zero = SET1(z);                                                                  \
    for (std::size_t i = lo; i < hi; ++i) {                                                    \
      unsigned char* at = v + i * W;                                                           \
      if (Prefetch && (i * W) % 64 == 0) {                                                     \
        prefetch_ahead(at);                                                                    \
        if (o) prefetch_ahead(o + i * W);                                                      \
      }                                                                                        \
      const VEC add = o ? AND(LOAD(reinterpret_cast<const VEC*>(o + i * W)), zero) : zero;     \
      STORE(reinterpret_cast<VEC*>(at), ADD(LOAD(reinterpret_cast<const VEC*>(at)), add));     \
    }                                                                                          \
  }                                                                                            \
  template <bool Streaming, bool Prefetch>                                                     \
  TARGET void copy_range_##W(const unsigned char* s, const unsigned char* o, unsigned char* d, \
                             std::size_t lo, std::size_t hi, int z) {                          \
    const VEC zero = SET1(z);                                                                  \
    for (std::size_t i = lo; i < hi; ++i) {                                                    \
      if (Prefetch && (i * W) % 64 == 0) {                                                     \
        prefetch_ahead(s + i * W);                                                             \
        if (o) prefetch_ahead(o + i * W);                                                      \
      }                                                                                        \
      VEC x = LOAD(reinterpret_cast<const VEC*>(s + i * W));                                   \
      if (o) x = ADD(x, AND(LOAD(reinterpret_cast<const VEC*>(o + i * W)), zero));             \
      if (Streaming) {                                                                         \
        STREAM(reinterpret_cast<VEC*>(d + i * W), x);                                          \
      } else {                                                                                 \
        STORE(reinterpret_cast<VEC*>(d + i * W), x);                                           \
      }                                                                                        \
    }                                                                                          \
    if (Streaming) _mm_sfence();                                                               \
  }

#define TILEROPE_NO_TARGET
TILEROPE_CEILING_LOOPS(16, __m128i, _mm_load_si128, _mm_store_si128, _mm_stream_si128,
                       _mm_set1_epi32, _mm_add_epi32, _mm_and_si128, TILEROPE_NO_TARGET)
TILEROPE_CEILING_LOOPS(32, __m256i, _mm256_load_si256, _mm256_store_si256, _mm256_stream_si256,
                       _mm256_set1_epi32, _mm256_add_epi32, _mm256_and_si256,
                       __attribute__((target("avx2"))))
TILEROPE_CEILING_LOOPS(64, __m512i, _mm512_load_si512, _mm512_store_si512, _mm512_stream_si512,
                       _mm512_set1_epi32, _mm512_add_epi32, _mm512_and_si512,
                       __attribute__((target("avx512f"))))
#undef TILEROPE_CEILING_LOOPS
#undef TILEROPE_NO_TARGET

template <bool Prefetch>
void rmw_range(int width, unsigned char* v, const unsigned char* o, std::size_t lo, std::size_t hi,
               int z) {
  if (width == 64) return rmw_range_64<Prefetch>(v, o, lo, hi, z);
  if (width == 32) return rmw_range_32<Prefetch>(v, o, lo, hi, z);
  rmw_range_16<Prefetch>(v, o, lo, hi, z);
}

template <bool Streaming, bool Prefetch>
void copy_range(int width, const unsigned char* s, const unsigned char* o, unsigned char* d,
                std::size_t lo, std::size_t hi, int z) {
  if (width == 64) return copy_range_64<Streaming, Prefetch>(s, o, d, lo, hi, z);
  if (width == 32) return copy_range_32<Streaming, Prefetch>(s, o, d, lo, hi, z);
  copy_range_16<Streaming, Prefetch>(s, o, d, lo, hi, z);
}

}  // namespace

std::string loop_form::name() const {
  if (width == 0) return "memcpy";
  return std::to_string(width) + "-byte, " + (streaming ? "streaming" : "normal") + " stores" +
         (prefetch ? ", prefetch " + std::to_string(ceiling_prefetch_bytes) : "");
}

std::vector<loop_form> loop_forms(bool copy, bool reads_other) {
  std::vector<int> widths = {16};
  if (__builtin_cpu_supports("avx2")) widths.push_back(32);
  if (__builtin_cpu_supports("avx512f")) widths.push_back(64);
  std::vector<loop_form> forms;
  for (int w : widths)
    for (bool streaming : {false, true})
      for (bool prefetch : {false, true})
        if (copy || !streaming) forms.push_back({w, streaming, prefetch});
  if (copy && !reads_other) forms.push_back({0, false, false});
  return forms;
}

void rmw(unsigned char* p, const unsigned char* other, std::size_t bytes, int threads,
         loop_form f) {
  const int z = ceiling_zero;
  const auto w = static_cast<std::size_t>(f.width);
  for_chunks(bytes / w, threads, [=](std::size_t lo, std::size_t hi) {
    f.prefetch ? rmw_range<true>(f.width, p, other, lo, hi, z)
               : rmw_range<false>(f.width, p, other, lo, hi, z);
  });
  // the 16-byte vectors past the last whole wide one
  rmw_range_16<false>(p, other, bytes / w * w / 16, bytes / 16, z);
}

void copy(const unsigned char* from, const unsigned char* other, unsigned char* to,
          std::size_t bytes, int threads, loop_form f) {
  if (f.width == 0) {
    for_chunks((bytes + 63) / 64, threads, [=](std::size_t lo, std::size_t hi) {
      std::memcpy(to + lo * 64, from + lo * 64, std::min(bytes, hi * 64) - lo * 64);
    });
    return;
  }
  const int z = ceiling_zero;
  const auto w = static_cast<std::size_t>(f.width);
  for_chunks(bytes / w, threads, [=](std::size_t lo, std::size_t hi) {
    if (f.streaming) {
      f.prefetch ? copy_range<true, true>(f.width, from, other, to, lo, hi, z)
                 : copy_range<true, false>(f.width, from, other, to, lo, hi, z);
    } else {
      f.prefetch ? copy_range<false, true>(f.width, from, other, to, lo, hi, z)
                 : copy_range<false, false>(f.width, from, other, to, lo, hi, z);
    }
  });
  copy_range_16<false, false>(from, other, to, bytes / w * w / 16, bytes / 16, z);
}

}  // namespace tilerope::bench
