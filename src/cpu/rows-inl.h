// Row kernels of the rotation: rows of whole vectors in output order, adjacent pairs with angle
// rows in L1, and the choice between them for one block of heads.
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_ROWS_INL_H_
#undef TILEROPE_CPU_ROWS_INL_H_
#else
#define TILEROPE_CPU_ROWS_INL_H_
#endif

#include "cpu/rows_16bit-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- rows of whole vectors whose pairs are not whole vectors ---------------------------------
// When r/2 is not a multiple of the vector but the row is (AVX-512 at head dims 48, 80, 112),
// the pair-at-a-time path ends each row with an overlapped vector and cannot stream. Taken in
// output order instead, every vector stored is one of the row's own:
//     y_j = x_j C_j + x_partner(j) S_j
// partner(j) = j + r/2 or j - r/2 for halves (the middle vector, which holds r/2, takes its
// partners from the last vector's upper half and the first vector's lower half), j ^ 1 for
// adjacent pairs (a swap within the vector); C_j is the cos of j's element of its pair, S_j
// the sin negated for a pair's first element. The products are y_a = x_a ca - x_b sa and
// y_b = x_b cb + x_a sb, bit for bit.
#if HWY_TARGET != HWY_SCALAR
// How many vectors such a row has (else 0): every dim rotated, the layout kept, r/2 at least
// one vector but not a multiple of it, the row an odd number of vectors up to 7. 16-bit halves
// take it only when the output streams: widening each vector and joining its partner put three
// shuffles on every vector, but streamed, the output skips its reads for ownership
// (docs/performance.md, "Performance decisions"). Not streamed, bf16 with AVX512-BF16 takes
// rotate_block_lane_pairs_tail.
inline int output_order_vectors(const cpu_plan& p, std::int64_t lanes, bool streaming) {
  const std::int64_t half = p.rotary_dim / 2, D = p.head_dim;
  if (p.qk_norm || p.rotary_dim != D || p.in_pairs != p.out_pairs) return 0;
  if (p.in_pairs == pairs::halves && p.x_type != dtype::f32 && !streaming) return 0;
  if (half < lanes || half % lanes == 0 || D % lanes != 0) return 0;
  const std::int64_t vectors = D / lanes;
  return vectors <= 7 ? static_cast<int>(vectors) : 0;
}

// A token's C and S rows (above) of NV vectors, held in registers across a block's heads.
template <pairs P, int NV>
struct output_angles {
  vf32 c[NV], s[NV];
  HWY_INLINE output_angles(df32 d, const token_angles& a, std::int64_t half) {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    HWY_ALIGN float rows[2 * NV * max_f32_lanes];
    float* C = rows;
    float* S = rows + NV * n;
    for (std::int64_t i = 0;; i += n) {
      i = std::min(i, half - n);  // the last vector of frequencies overlaps the one before
      const vf32 ca = hn::LoadU(d, a.ca + i), sa = hn::Neg(hn::LoadU(d, a.sa + i));
      const vf32 cb = hn::LoadU(d, a.cb + i), sb = hn::LoadU(d, a.sb + i);
      if constexpr (P == pairs::halves) {
        hn::StoreU(ca, d, C + i);
        hn::StoreU(cb, d, C + half + i);
        hn::StoreU(sa, d, S + i);
        hn::StoreU(sb, d, S + half + i);
      } else {
        hn::StoreInterleaved2(ca, cb, d, C + 2 * i);
        hn::StoreInterleaved2(sa, sb, d, S + 2 * i);
      }
      if (i == half - n) break;
    }
    for (int v = 0; v < NV; ++v) {
      c[v] = hn::Load(d, C + v * n);
      s[v] = hn::Load(d, S + v * n);
    }
  }
};

// One row [NV vectors] in output order: read whole before any of it is stored (in place reads
// only original values), each partner vector joined from two of the row's vectors (r/2 is
// m + 1/2 vectors, m = NV / 2), then stored as whole vectors (streamed by streaming_io).
template <class IO, pairs P, int NV>
HWY_INLINE void rotate_row_output_order(df32 d, const typename IO::storage* x,
                                        typename IO::storage* y, const output_angles<P, NV>& f) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  constexpr int middle = NV / 2;  // the vector holding r/2 (halves)
  vf32 xs[NV], ys[NV];
  for (int v = 0; v < NV; ++v) xs[v] = IO::load(d, x + v * n);
  for (int v = 0; v < NV; ++v) {
    vf32 partner;
    if constexpr (P == pairs::adjacent) {
      partner = hn::Reverse2(d, xs[v]);
    } else if (v < middle) {  // x[v n + half, + n): the upper half of v + m, the lower of v + m + 1
      partner = hn::ConcatLowerUpper(d, xs[v + middle + 1], xs[v + middle]);
    } else if (v > middle) {
      partner = hn::ConcatLowerUpper(d, xs[v - middle], xs[v - middle - 1]);
    } else {
      partner = hn::ConcatLowerUpper(d, xs[0], xs[NV - 1]);
    }
    ys[v] = hn::MulAdd(xs[v], f.c[v], hn::Mul(partner, f.s[v]));
  }
  // stored two vectors at a time (one subnormal test for both with AVX512-BF16)
  for (int v = 0; v + 1 < NV; v += 2)
    store_pair<IO, pairs::halves>(d, ys[v], ys[v + 1], y, v * n, n);
  IO::store(d, ys[NV - 1], y + (NV - 1) * n);
}

template <class IO, pairs P, int NV>
HWY_NOINLINE void rotate_block_output_order(df32 d, const cpu_plan& p, const cpu_block& blk,
                                            const typename IO::storage* in,
                                            typename IO::storage* out, const token_angles& a) {
  const output_angles<P, NV> f(d, a, p.rotary_dim / 2);
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    prefetch_row(in + h * blk.in_h, p.head_dim, p.prefetch_bytes);
    rotate_row_output_order<IO, P, NV>(d, in + h * blk.in_h, out + h * blk.out_h, f);
  }
}
#else
inline int output_order_vectors(const cpu_plan&, std::int64_t, bool) { return 0; }
#endif

// ---- adjacent pairs in output order, angle rows in L1 -----------------------------------------
// Without the held path (fewer than 16 lanes), adjacent pairs taken a vector of pairs at a time
// are split into even and odd lanes on load and joined again on store: with AVX2, f32 takes
// eight shuffles per two vectors. In output order (above) a vector's partners are its own
// lanes swapped, one in-block shuffle per vector:
//     y_j = x_j C_j + x_(j^1) S_j
// with the token's C and S rows (r floats each) expanded into L1 once per token, and every
// store a whole vector of the row's own (so out-of-place f32 streams). bf16 without a native
// conversion keeps the split (a widening load and a shift per vector in, the pack's rounding
// out, where the split takes one shift or mask each way), as does f16 with SSE4 (converted in
// software either way); f32 with SSE4, no faster in cache, takes it for its streamed stores
// (docs/performance.md, "Performance decisions").
#if HWY_TARGET != HWY_SCALAR
template <class IO>
inline bool takes_adjacent_rows(const cpu_plan& p, std::int64_t lanes) {
  using plain = typename IO::plain;
  constexpr bool f16c = HWY_TARGET <= HWY_AVX2;
  if (std::is_same_v<plain, bf16_io> || (std::is_same_v<plain, f16_io> && !f16c)) return false;
  return lanes < 16 && !p.qk_norm && p.in_pairs == pairs::adjacent &&
         p.out_pairs == pairs::adjacent && p.rotary_dim % lanes == 0;
}

// C and S of a token: C_2i = ca_i, C_2i+1 = cb_i, S_2i = -sa_i, S_2i+1 = sb_i.
HWY_INLINE void expand_adjacent_angles(df32 d, const token_angles& a, std::int64_t half, float* C,
                                       float* S) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + n <= half; i += n) {
    hn::StoreInterleaved2(hn::LoadU(d, a.ca + i), hn::LoadU(d, a.cb + i), d, C + 2 * i);
    hn::StoreInterleaved2(hn::Neg(hn::LoadU(d, a.sa + i)), hn::LoadU(d, a.sb + i), d, S + 2 * i);
  }
  for (; i < half; ++i) {
    C[2 * i] = a.ca[i];
    C[2 * i + 1] = a.cb[i];
    S[2 * i] = -a.sa[i];
    S[2 * i + 1] = a.sb[i];
  }
}

template <class IO>
HWY_NOINLINE void rotate_block_adjacent(df32 d, const cpu_plan& p, const cpu_block& blk,
                                        const typename IO::storage* in, typename IO::storage* out,
                                        const float* C, const float* S) {
  using T = typename IO::storage;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t rotary = p.rotary_dim, pass = p.head_dim - rotary;
  auto rotated = [&](vf32 x, std::int64_t j) {
    x = in_register(x);
    return hn::MulAdd(x, hn::LoadU(d, C + j), hn::Mul(hn::Reverse2(d, x), hn::LoadU(d, S + j)));
  };
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    const T* x = in + h * blk.in_h;
    T* y = out + h * blk.out_h;
    prefetch_row(x, p.head_dim, p.prefetch_bytes);
    if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
    for (std::int64_t j = 0; j < rotary; j += n)
      IO::store(d, rotated(IO::load(d, x + j), j), y + j);
  }
}

#else
template <class IO>
inline bool takes_adjacent_rows(const cpu_plan&, std::int64_t) {
  return false;
}
#endif

// The heads of one block (q or k) of one token. Full (four angle vectors or two) is decided
// once per token.
template <class IO, pairs PIn, pairs POut, bool Full>
HWY_INLINE void rotate_block_rows(df32 d, const cpu_plan& p, const cpu_block& blk,
                                  const typename IO::storage* in, typename IO::storage* out,
                                  const token_angles& a, typename IO::storage* row_copy) {
  using T = typename IO::storage;
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim;
  const std::int64_t pass = p.head_dim - rotary;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const bool whole = half >= lanes;
  const int held = held_vectors(half, lanes);
  if (lanes >= 16 && held != 0) {
#ifdef TILEROPE_LANE_PAIRS
    if constexpr (takes_lane_pairs<IO, PIn, POut>()) {
      if (held != 1) {
        const token_angles la = lane_pair_angles(d, a, half, angle_rows_scratch(p));
        if (held == 4) {
          return rotate_block_held<IO, PIn, POut, Full, 4, true>(d, p, blk, in, out, la);
        }
        return rotate_block_held<IO, PIn, POut, Full, 2, true>(d, p, blk, in, out, la);
      }
    }
#endif
    if (held == 4) return rotate_block_held<IO, PIn, POut, Full, 4>(d, p, blk, in, out, a);
    if (held == 2) return rotate_block_held<IO, PIn, POut, Full, 2>(d, p, blk, in, out, a);
    return rotate_block_held<IO, PIn, POut, Full, 1>(d, p, blk, in, out, a);
  }
#ifdef TILEROPE_LANE_PAIRS
  if constexpr (takes_lane_pairs<IO, PIn, POut>() && std::is_same_v<IO, typename IO::plain>) {
    if (takes_lane_pairs_tail(half, lanes)) {
      return rotate_block_lane_pairs_tail<IO, Full>(d, p, blk, in, out, a);
    }
  }
#endif
#ifdef TILEROPE_BF16_BLOCKS
  if constexpr (std::is_same_v<T, std::uint16_t> && POut == pairs::halves) {
    if (takes_bf16_blocks<IO>(p, lanes)) {
      const token_angles b = block_ordered(d, a, half, angle_rows_scratch(p));
      for (std::int64_t h = 0; h < blk.heads; ++h) {
        const T* x = in + h * blk.in_h;
        T* y = out + h * blk.out_h;
        prefetch_row(x, p.head_dim, p.prefetch_bytes);
        if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
        if constexpr (PIn == pairs::adjacent && std::is_same_v<IO, typename IO::plain>) {
          if (x == y && (half == 4 * lanes || half == 8 * lanes)) {
            if (half == 4 * lanes) rotate_row_bf16_pairs_in_place<IO, Full, 2>(d, y, b, half);
            if (half == 8 * lanes) rotate_row_bf16_pairs_in_place<IO, Full, 4>(d, y, b, half);
            continue;
          }
        }
        x = readable_row<PIn, POut>(x, y, row_copy, rotary);  // pairs in place: a copy
        rotate_row_bf16_blocks<IO, Full, PIn>(d, x, y, b, half);
      }
      return;
    }
  }
#endif
  for (std::int64_t h = 0; h < blk.heads; ++h) {
    const T* x = in + h * blk.in_h;
    T* y = out + h * blk.out_h;
    prefetch_row(x, p.head_dim, p.prefetch_bytes);
    if (pass > 0 && x != y) std::memcpy(y + rotary, x + rotary, pass * sizeof(T));
    if constexpr (PIn != POut) {
      if (x == y && held != 0) {  // fewer than 16 lanes
        const memory_angles<Full> f{d, a, lanes};
        if (held == 1) rotate_row_vectors<IO, PIn, POut, 1>(d, y, y, f, half, no_pre{});
        if (held == 2) rotate_row_vectors<IO, PIn, POut, 2>(d, y, y, f, half, no_pre{});
        if (held == 4) rotate_row_vectors<IO, PIn, POut, 4>(d, y, y, f, half, no_pre{});
        continue;
      }
      if (x == y && half == 8 * lanes && takes_half_held<IO, PIn>()) {
        rotate_row_in_place_half_held<IO, PIn, POut, 8>(d, y, memory_angles<Full>{d, a, lanes},
                                                        half);
        continue;
      }
    }
    x = readable_row<PIn, POut>(x, y, row_copy, rotary);
    if (whole) {
      rotate_whole_vectors<IO, IO, PIn, POut, false, Full>(d, x, y, a, half);
    } else {
      rotate_row<IO, IO, PIn, POut>(d, x, y, a, half);
    }
  }
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_ROWS_INL_H_
