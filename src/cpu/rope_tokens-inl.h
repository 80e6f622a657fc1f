// The token loop: blocks of heads per token (angles gathered in runs for MRoPE tables), and
// RoPE's own loop over them.
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_ROPE_TOKENS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_ROPE_TOKENS_INL_H_
#undef TILEROPE_CPU_ROPE_TOKENS_INL_H_
#else
#define TILEROPE_CPU_ROPE_TOKENS_INL_H_
#endif

#include "cpu/rows-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Multi-axis (MRoPE) angles gathered from a table, the rows of several positions per token:
// gathered for a run of tokens before those tokens' rows are rotated. Gathered token by token,
// between the rows, MRoPE ran far slower than RoPE in memory, much less so in cache (the more
// distinct table rows a token's axes read, the slower; docs/performance.md, "Performance
// decisions").
constexpr int angle_run = 64;

inline bool gathers_angles_in_runs(const cpu_plan& p) {
  return p.cos != nullptr && p.axis_of_frequency != nullptr;
}

// Per-thread scratch for a run's angles: angle_run slots of 4 * r/2 floats.
float* run_scratch(const cpu_plan& p) {
  thread_local std::vector<float> scratch;
  return line_aligned(scratch, static_cast<std::size_t>(angle_run * 2 * p.rotary_dim));
}

// fn on one block's rows of token (b, s): its first head row in and out.
template <class T, class Fn>
HWY_INLINE void call_on_block(const cpu_block& blk, std::int64_t b, std::int64_t s,
                              const token_angles& a, Fn& fn) {
  fn(b, s, a, blk, static_cast<const T*>(blk.in) + b * blk.in_b + s * blk.in_s,
     static_cast<T*>(blk.out) + b * blk.out_b + s * blk.out_s);
}

// Tokens [first, last): the angles once per token (into `angle_scratch` when they need it;
// MRoPE's for a run of tokens at a time, above), then fn(b, s, angles, block, in, out) for q's
// and k's heads of the token, in and out pointing at its first head row. Tokens taken one at a
// time set up no array of runs: its 64 entries weighed on a decode call's fixed cost
// (docs/performance.md, "Performance decisions"). No software prefetch: the hardware
// prefetchers follow these streams, and prefetching the rows two tokens ahead measured slower
// (docs/performance.md), as did prefetching MRoPE's table rows.
template <class T, class Fn>
HWY_INLINE void for_each_block(const cpu_plan& p, std::int64_t first, std::int64_t last,
                               float* angle_scratch, Fn&& fn) {
  auto blocks_of = [&](std::int64_t token, const token_angles& a) {
    const std::int64_t b = token / p.seq, s = token % p.seq;
    for (int k = 0; k < p.num_blocks; ++k) call_on_block<T>(p.blocks[k], b, s, a, fn);
  };
  if (!gathers_angles_in_runs(p) || last - first == 1) {
    for (std::int64_t t = first; t < last; ++t) {
      blocks_of(t, angles_for(p, t / p.seq, t % p.seq, angle_scratch));
    }
    return;
  }
  float* slots = run_scratch(p);
  token_angles run[angle_run];
  for (std::int64_t t0 = first; t0 < last; t0 += angle_run) {
    const int n = static_cast<int>(std::min<std::int64_t>(angle_run, last - t0));
    for (int j = 0; j < n; ++j) {
      run[j] = angles_for(p, (t0 + j) / p.seq, (t0 + j) % p.seq, slots + j * 2 * p.rotary_dim);
    }
    for (int j = 0; j < n; ++j) blocks_of(t0 + j, run[j]);
  }
}

// Tokens [first, last) as for_each_block, but in runs of `block_run` tokens taken a block at a
// time: q's heads of every token of the run, then k's, so that a thread reads one tensor's rows
// at a time (the angles taken again for each block). For QK RMSNorm's backward, whose three
// streams (g, x, dx) are each split over q and k; the forward kernels measured slower so and
// keep the token order (docs/performance.md, "Performance decisions"). MRoPE, which gathers its
// angles in runs already, keeps it too.
constexpr std::int64_t block_run = 16;

template <class T, class Fn>
HWY_INLINE void for_each_block_in_runs(const cpu_plan& p, std::int64_t first, std::int64_t last,
                                       float* angle_scratch, Fn&& fn) {
  if (gathers_angles_in_runs(p)) return for_each_block<T>(p, first, last, angle_scratch, fn);
  for (std::int64_t t0 = first; t0 < last; t0 += block_run) {
    const std::int64_t t1 = std::min(last, t0 + block_run);
    for (int k = 0; k < p.num_blocks; ++k) {
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t b = t / p.seq, s = t % p.seq;
        call_on_block<T>(p.blocks[k], b, s, angles_for(p, b, s, angle_scratch), fn);
      }
    }
  }
}

// Rows in output order (output_order_vectors, decided once per call) or through
// rotate_block_rows.
template <class IO, pairs PIn, pairs POut>
void rope_tokens_loop(const cpu_plan& p, std::int64_t first, std::int64_t last) {
  using T = typename IO::storage;
  const df32 d;
  float* scratch = thread_scratch(p);
  T* row_copy = reinterpret_cast<T*>(scratch + 2 * p.rotary_dim);
  [[maybe_unused]] const std::int64_t half = p.rotary_dim / 2;
  constexpr bool streams = !std::is_same_v<IO, typename IO::plain>;  // a streaming_io
  [[maybe_unused]] const int ordered =
      output_order_vectors(p, static_cast<std::int64_t>(hn::Lanes(d)), streams);
  [[maybe_unused]] const bool adjacent_rows =
      ordered == 0 && takes_adjacent_rows<IO>(p, static_cast<std::int64_t>(hn::Lanes(d)));
  [[maybe_unused]] float* C = adjacent_rows ? angle_rows_scratch(p) : nullptr;  // then S
  [[maybe_unused]] std::int64_t expanded = -1;  // the token whose C and S rows are expanded
  for_each_block<T>(p, first, last, scratch,
                    [&]([[maybe_unused]] std::int64_t b, [[maybe_unused]] std::int64_t s,
                        const token_angles& a, const cpu_block& blk, const T* in, T* out) {
#if HWY_TARGET != HWY_SCALAR
                      if constexpr (PIn == POut) {
                        switch (ordered) {
                          case 3:
                            return rotate_block_output_order<IO, PIn, 3>(d, p, blk, in, out, a);
                          case 5:
                            return rotate_block_output_order<IO, PIn, 5>(d, p, blk, in, out, a);
                          case 7:
                            return rotate_block_output_order<IO, PIn, 7>(d, p, blk, in, out, a);
                          default:
                            break;
                        }
                        if (adjacent_rows) {
                          float* S = C + p.rotary_dim;
                          if (b * p.seq + s != expanded) {  // q's block, or the token's first
                            expand_adjacent_angles(d, a, half, C, S);
                            expanded = b * p.seq + s;
                          }
                          return rotate_block_adjacent<IO>(d, p, blk, in, out, C, S);
                        }
                      }
#endif
                      if (a.full) {
                        rotate_block_rows<IO, PIn, POut, true>(d, p, blk, in, out, a, row_copy);
                      } else {
                        rotate_block_rows<IO, PIn, POut, false>(d, p, blk, in, out, a, row_copy);
                      }
                    });
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_ROPE_TOKENS_INL_H_
