// QK RMSNorm + RoPE, forward: each row normalised (its weights folded into the angles where
// rows are held in registers), then rotated.
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_QK_NORM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_QK_NORM_INL_H_
#undef TILEROPE_CPU_QK_NORM_INL_H_
#else
#define TILEROPE_CPU_QK_NORM_INL_H_
#endif

#include "cpu/rope_tokens-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of x^2 over the first j elements of x (j returned: n rounded down to whole vectors), in
// fp32 as a vector whose lanes add up to it; two accumulators halve the dependent chain.
// `dot`: through IO::add_squares where the IO has it.
template <class IO>
HWY_INLINE vf32 squares_vector(df32 d, const typename IO::storage* x, std::int64_t n, bool dot,
                               std::int64_t& j) {
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  vf32 acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  j = 0;
  if constexpr (IO::dot_pairs) {
    if (dot) {
      for (; j + 4 * lanes <= n; j += 4 * lanes) {
        acc0 = IO::add_squares(acc0, load_u16_pairs(x + j));
        acc1 = IO::add_squares(acc1, load_u16_pairs(x + j + 2 * lanes));
      }
      if (j + 2 * lanes <= n) {
        acc0 = IO::add_squares(acc0, load_u16_pairs(x + j));
        j += 2 * lanes;
      }
    }
  }
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    vf32 v0, v1;
    if constexpr (IO::cheap_pairs) {
      IO::load_pairs(d, x + j, v0, v1);  // even and odd elements
    } else {
      v0 = IO::load(d, x + j);
      v1 = IO::load(d, x + j + lanes);
    }
    acc0 = hn::MulAdd(v0, v0, acc0);
    acc1 = hn::MulAdd(v1, v1, acc1);
  }
  if (j + lanes <= n) {
    const vf32 v = IO::load(d, x + j);
    acc0 = hn::MulAdd(v, v, acc0);
    j += lanes;
  }
  return hn::Add(acc0, acc1);
}

// Sum of x^2 over n elements, in fp32.
template <class IO>
HWY_INLINE float sum_of_squares(df32 d, const typename IO::storage* x, std::int64_t n,
                                bool dot = false) {
  std::int64_t j;
  float sum = hn::GetLane(hn::SumOfLanes(d, squares_vector<IO>(d, x, n, dot, j)));
  for (; j < n; ++j) {
    const float v = IO::load1(x + j);
    sum += v * v;
  }
  return sum;
}

// x r w for one vector of pair elements (w: the weights of those elements, in pair order).
template <class IO, bool HfRound>
HWY_INLINE vf32 normalised(df32 d, vf32 x, vf32 r, const float* w, std::int64_t i) {
  vf32 n = hn::Mul(x, r);
  if constexpr (HfRound) n = IO::round(d, n);
  vf32 hw = hn::Mul(n, hn::LoadU(d, w + i));
  if constexpr (HfRound) hw = IO::round(d, hw);
  return hw;
}

// One row of QK RMSNorm + RoPE with r/2 >= one vector: each vector of pairs is normalised in
// registers and rotated.
template <class IO, pairs PIn, pairs POut, bool HfRound, bool Full>
HWY_INLINE void norm_rotate_row(df32 d, const typename IO::storage* x, typename IO::storage* y,
                                const token_angles& a, std::int64_t half, float r, const float* wa,
                                const float* wb) {
  const vf32 rv = hn::Set(d, r);
  rotate_whole_vectors<IO, IO, PIn, POut, HfRound, Full>(
      d, x, y, a, half, [&](vf32 v, bool second, std::int64_t i) {
        return normalised<IO, HfRound>(d, v, rv, second ? wb : wa, i);
      });
}

// One 16-bit row of QK RMSNorm + RoPE whose r/2 is NV whole vectors: loaded whole before any
// of it is stored (rotate_row_vectors), each vector of pairs scaled by r and rotated through
// the angles with the block's weights folded in (fold_weights, once per token and block):
//     y_a = (x_a r) (wa ca) - (x_b r) (wb sa),   y_b = (x_b r) (wb cb) + (x_a r) (wa sb)
// as the f32 rows' folded_angles, two multiplies fewer per vector of pairs than x r w; loaded
// whole, a streamed row has no loads between its stores (docs/performance.md, "Performance
// decisions").
template <class IO, pairs PIn, pairs POut, int NV>
HWY_INLINE void norm_rotate_row_vectors(df32 d, const typename IO::storage* x,
                                        typename IO::storage* y, const token_angles& folded,
                                        std::int64_t half, float r) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  rotate_row_vectors<IO, PIn, POut, NV>(d, x, y, memory_angles<true>{d, folded, n}, half,
                                        scaled_by{hn::Set(d, r)});
}

// A token's angles at frequency i with one block's RMSNorm weights folded in: wa ca, wb sa,
// wb cb, wa sb (the weight of the element each angle multiplies).
HWY_INLINE void folded_at(df32 d, const token_angles& a, const float* wa, const float* wb,
                          std::int64_t i, vf32& ca, vf32& sa, vf32& cb, vf32& sb) {
  const vf32 va = hn::LoadU(d, wa + i), vb = hn::LoadU(d, wb + i);
  ca = hn::Mul(va, hn::LoadU(d, a.ca + i));
  sa = hn::Mul(vb, hn::LoadU(d, a.sa + i));
  cb = hn::Mul(vb, hn::LoadU(d, a.cb + i));
  sb = hn::Mul(va, hn::LoadU(d, a.sb + i));
}

// The folded angles of a token's r/2 frequencies written to `rows` (4 r/2 floats).
HWY_INLINE token_angles fold_weights(df32 d, const token_angles& a, const float* wa,
                                     const float* wb, std::int64_t half, float* rows) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  float* ca = rows;
  float* sa = rows + half;
  float* cb = rows + 2 * half;
  float* sb = rows + 3 * half;
  for (std::int64_t i = 0; i < half; i += n) {
    vf32 c, s, c2, s2;
    folded_at(d, a, wa, wb, i, c, s, c2, s2);
    hn::StoreU(c, d, ca + i);
    hn::StoreU(s, d, sa + i);
    hn::StoreU(c2, d, cb + i);
    hn::StoreU(s2, d, sb + i);
  }
  return token_angles{ca, sa, cb, sb, true};
}

#ifdef TILEROPE_BF16_BLOCKS
// fold_weights and block_ordered in one pass (r/2 a multiple of 2n), and whether every folded
// angle is at most `bound` in magnitude, NaN not: the largest of their bits with the sign
// shifted out, as u32 (that order is the order of magnitudes, NaN above all), against the
// bound's. One pass over the rows where there were three (the bound checked by Le and Abs over
// the stored rows).
HWY_INLINE token_angles folded_in_block_order(df32 d, const token_angles& a, const float* wa,
                                              const float* wb, std::int64_t half, float* rows,
                                              float bound, bool& within) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const hn::RebindToUnsigned<df32> du;
  auto most = hn::Zero(du);
  float* const to[4] = {rows, rows + half, rows + 2 * half, rows + 3 * half};
  for (std::int64_t i = 0; i < half; i += 2 * n) {
    vf32 v0[4], v1[4];
    folded_at(d, a, wa, wb, i, v0[0], v0[1], v0[2], v0[3]);
    folded_at(d, a, wa, wb, i + n, v1[0], v1[1], v1[2], v1[3]);
    for (int r = 0; r < 4; ++r) {
      vf32 first, second;
      to_block_order(d, v0[r], v1[r], first, second);
      hn::StoreU(first, d, to[r] + i);
      hn::StoreU(second, d, to[r] + i + n);
      most = hn::Max(most, hn::Max(hn::ShiftLeft<1>(hn::BitCast(du, v0[r])),
                                   hn::ShiftLeft<1>(hn::BitCast(du, v1[r]))));
    }
  }
  std::uint32_t bound_bits;
  std::memcpy(&bound_bits, &bound, sizeof bound_bits);
  within = hn::GetLane(hn::MaxOfLanes(du, most)) <= bound_bits << 1;
  return token_angles{to[0], to[1], to[2], to[3], true};
}
#endif

// Heads of a block whose RMSNorm sums are found together, forward and backward (4 to 8
// measured best).
constexpr std::int64_t norm_group = 4;

// r = 1 / sqrt(mean(x^2) + eps) of the block's heads [h0, h0 + norm_group) (fewer at its end)
// into r: independent sums, so that their latency overlaps. bf16 squares by vdpbf16ps where
// eps >= 2^-100, as in group_inverse_rms_vector.
template <class IO>
HWY_INLINE void group_inverse_rms(df32 d, const cpu_plan& p, const cpu_block& blk,
                                  const typename IO::storage* in, std::int64_t h0, float* r) {
  const float inv_d = 1.0f / static_cast<float>(p.head_dim);
  for (std::int64_t g = h0; g < std::min(h0 + norm_group, blk.heads); ++g) {
    const float mean =
        sum_of_squares<IO>(d, in + g * blk.in_h, p.head_dim, p.eps >= 0x1p-100f) * inv_d;
    r[g - h0] = 1.0f / std::sqrt(mean + p.eps);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR  // fixed-width vectors of 4, 8 or 16 lanes
// The lane sums of four vectors as one 128-bit vector [sum(a), sum(b), sum(c), sum(e)]: lanes
// paired within each 128-bit block, then the blocks added.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<float>> add_blocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(d) > 4) {
    const hn::Half<D> dh;
    return add_blocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}
HWY_INLINE hn::Vec<hn::Full128<float>> lane_sums4(df32 d, vf32 a, vf32 b, vf32 c, vf32 e) {
  const vf32 ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const vf32 ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  const hn::Repartition<double, df32> d64;
  const auto ab64 = hn::BitCast(d64, ab), ce64 = hn::BitCast(d64, ce);
  return add_blocks(d, hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, ab64, ce64)),
                               hn::BitCast(d, hn::InterleaveUpper(d64, ab64, ce64))));
}

// r = 1 / sqrt(mean(x^2) + eps) of four heads from their vectors of squares, into r[0, 4).
HWY_INLINE void store_inverse_rms4(df32 d, const cpu_plan& p, const vf32* acc, float* r) {
  const hn::Full128<float> d4;
  const auto mean = hn::Mul(lane_sums4(d, acc[0], acc[1], acc[2], acc[3]),
                            hn::Set(d4, 1.0f / static_cast<float>(p.head_dim)));
  hn::StoreU(hn::Div(hn::Set(d4, 1.0f), hn::Sqrt(hn::Add(mean, hn::Set(d4, p.eps)))), d4, r);
}
#endif

// group_inverse_rms for rows of whole vectors (x86, head_dim a multiple of the lanes): the
// four sums reduced together and one vector square root and division for the four heads, and
// with AVX512-BF16 the bf16 squares summed by vdpbf16ps where eps >= 2^-100: the squares it
// flushes (each under 2^-126) then change mean + eps by less than half its ulp. Else
// group_inverse_rms.
template <class IO>
HWY_INLINE void group_inverse_rms_vector(df32 d, const cpu_plan& p, const cpu_block& blk,
                                         const typename IO::storage* in, std::int64_t h0,
                                         float* r) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  if (lanes >= 4 && p.head_dim % lanes == 0) {
    const bool dot = p.eps >= 0x1p-100f;
    const std::int64_t heads = std::min(norm_group, blk.heads - h0);
    vf32 acc[norm_group];
    for (std::int64_t g = 0; g < norm_group; ++g) {
      std::int64_t j;
      acc[g] = g < heads ? squares_vector<IO>(d, in + (h0 + g) * blk.in_h, p.head_dim, dot, j)
                         : hn::Zero(d);
    }
    static_assert(norm_group == 4);
    store_inverse_rms4(d, p, acc, r);
    return;
  }
#endif
  group_inverse_rms<IO>(d, p, blk, in, h0, r);
}

// A token's angles with one block's RMSNorm weights folded in (fp32_once), held in registers
// across the block's heads: NV vectors of pairs (r/2 = NV lanes, NV = 1, 2, 4; with 32 vector
// registers the 4 NV of them leave room for the row), so that a row's only loads are its own
//     y_a = (x_a r) (wa ca) - (x_b r) (wb sa),   y_b = (x_b r) (wb cb) + (x_a r) (wa sb)
// two multiplies fewer per vector of pairs than x r w, and no angle or weight loads.
template <int NV>
struct folded_angles {
  static constexpr bool full = true;
  vf32 c[NV], s[NV], c2[NV], s2[NV];
  HWY_INLINE folded_angles(df32 d, const token_angles& a, const float* wa, const float* wb) {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    for (int v = 0; v < NV; ++v) folded_at(d, a, wa, wb, v * n, c[v], s[v], c2[v], s2[v]);
  }
  HWY_INLINE vf32 ca(int v) const { return c[v]; }
  HWY_INLINE vf32 sa(int v) const { return s[v]; }
  HWY_INLINE vf32 cb(int v) const { return c2[v]; }
  HWY_INLINE vf32 sb(int v) const { return s2[v]; }
};

// folded_angles in lane-pair order (bf16 halves with AVX512-BF16, NV even): each two vectors
// of a step put as their even lanes, then their odd ones, in registers
template <int NV>
struct folded_lane_pairs : folded_angles<NV> {
  HWY_INLINE folded_lane_pairs(df32 d, const token_angles& a, const float* wa, const float* wb)
      : folded_angles<NV>(d, a, wa, wb) {
#ifdef TILEROPE_LANE_PAIRS
    for (int v = 0; v < NV; v += 2) {
      for (vf32* x : {this->c, this->s, this->c2, this->s2}) to_lane_pairs(d, x[v], x[v + 1]);
    }
#endif
  }
};

// QK RMSNorm + RoPE (fp32_once) of one block of one token whose rows are NV whole vectors of
// pairs, through folded_angles held in registers; the sums in groups of four heads, each
// reduced on its own (reduced together, as in norm_rotate_block, they spilled the held angles).
// Out of line: inlined there, its registers were spilled for 16-bit x. LanePairs: the rows in
// lane-pair order (bf16 halves with AVX512-BF16, NV even), as rope's held rows.
template <class IO, pairs PIn, pairs POut, int NV, bool LanePairs = false>
HWY_NOINLINE void norm_rotate_block_held(df32 d, const cpu_plan& p, const cpu_block& blk,
                                         const typename IO::storage* in, typename IO::storage* out,
                                         const token_angles& a) {
  const std::int64_t half = p.rotary_dim / 2;
  using Folded = std::conditional_t<LanePairs, folded_lane_pairs<NV>, folded_angles<NV>>;
  const Folded f(d, a, blk.weight_a, blk.weight_b);
  float inv_rms[norm_group];
  for (std::int64_t hd = 0; hd < blk.heads; ++hd) {
    prefetch_row(in + hd * blk.in_h, p.head_dim, p.prefetch_bytes);
    if (hd % norm_group == 0) group_inverse_rms<IO>(d, p, blk, in, hd, inv_rms);
    const scaled_by r{hn::Set(d, inv_rms[hd % norm_group])};
    if constexpr (LanePairs) {
      rotate_row_lane_pairs<IO, NV>(d, in + hd * blk.in_h, out + hd * blk.out_h, f, half, r);
    } else {
      rotate_row_vectors<IO, PIn, POut, NV>(d, in + hd * blk.in_h, out + hd * blk.out_h, f, half,
                                            r);
    }
  }
}

// Where one block's QK RMSNorm sums ahead leave off for the next (norm_rotate_block_ahead):
// the block being taken (token, index in cpu_plan::blocks) and the end of this
// thread's tokens, set by the caller; the block whose first groups' r are in inv_rms, and the
// ring slot of its first group, set by norm_rotate_block_ahead.
struct norm_stream {
  static constexpr std::int64_t ring = 3 * norm_group;
  std::int64_t token = 0, last = 0;
  int block = 0;
  std::int64_t ready_token = -1;
  int ready_block = -1;
  std::int64_t ready_slot = 0;
  HWY_ALIGN float inv_rms[ring];
};

#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
#define TILEROPE_NORM_SUMS_AHEAD 1
// QK RMSNorm's sums taken inside the rotation's loop: the rotation of row h also
// sums the squares of the row two groups on (its `ahead` row: h + 2 * norm_group in the block,
// past it the blocks that follow), a step at a time, so that the sums need no loop of their
// own and their latency has two groups of rows to hide in. A thread's first two groups' sums
// are taken first, in the same order, so that a row's r does not depend on where it is summed.
// Two rows rotated together (their angle and weight loads shared), or the four rows of a group
// summed in one loop, measured slower in memory: rows stream best one at a time.
// With AVX-512 the rows not held in registers take it too (16-bit and f32 rows of neither 1, 2
// nor 4 vectors of pairs: head dim 256), where they took norm_rotate_block's own loop, whose
// next group's sums read four rows in a burst at each group's start (docs/performance.md,
// "Performance decisions"). Their weights are not folded into the angles once per block (as
// the bf16 rows without AVX-512 do): a block of 4 or 8 heads of 256 folds 512 angles for few
// rows.
constexpr std::int64_t norm_groups_ahead = 2;

// `rows.rotate(x, y, r, ahead, s)` rotates one row with its r and, where `ahead` is not null,
// adds the squares of that row into s[0] and s[1]; `rows.squares(x, s)` adds a row's squares
// in the same order.
//
// The rows summed ahead run on past the block: the rotation of a block's last two groups sums
// the first groups of the blocks that follow it in this thread's tokens (q then k of each
// token, up to st.last), and their r wait in st.inv_rms for those blocks, which then take no
// sums of their own first. Taken per block, the first two groups' sums (8 rows) went alone and
// the last two groups' rotations without sums: a block of 8 heads was all one and then all the
// other, and blocks of 8 or 4 heads of 256 had no row summed ahead.
template <class T, class Rows>
HWY_INLINE void norm_rotate_block_ahead(df32 d, const cpu_plan& p, const cpu_block& blk,
                                        const T* in, T* out, const Rows& rows, norm_stream& st) {
  constexpr std::int64_t group = norm_group, ahead = norm_groups_ahead, slots = ahead + 1;
  static_assert(group == 4);  // store_inverse_rms4
  static_assert(slots * group <= norm_stream::ring);
  const std::int64_t heads = blk.heads, groups = (heads + group - 1) / group;
  // The rows of group g counted from this block's first (g >= groups: of the blocks after it
  // in the stream), `count` of them `stride` elements apart; null past the thread's tokens.
  auto group_rows = [&](std::int64_t g, std::int64_t& count, std::int64_t& stride) -> const T* {
    std::int64_t t = st.token;
    int k = st.block;
    const cpu_block* b = &blk;
    std::int64_t bg = groups;
    while (g >= bg) {
      g -= bg;
      if (++k == p.num_blocks) {
        k = 0;
        if (++t >= st.last) return nullptr;
      }
      b = &p.blocks[k];
      bg = (b->heads + group - 1) / group;
    }
    count = std::min(group, b->heads - g * group);
    stride = b->in_h;
    const T* first = b == &blk && t == st.token
                         ? in
                         : static_cast<const T*>(b->in) + t / p.seq * b->in_b + t % p.seq * b->in_s;
    return first + g * group * b->in_h;
  };
  // r of the stream's groups in a ring of `slots` groups; `base`: this block's first group's
  // slot
  const bool carried = st.ready_token == st.token && st.ready_block == st.block;
  const std::int64_t base = carried ? st.ready_slot : 0;
  auto slot = [&](std::int64_t g) { return (base + g) % slots * group; };
  vf32 sums[group];
  auto inverse_rms = [&](std::int64_t g) {  // group g's r from sums
    store_inverse_rms4(d, p, sums, st.inv_rms + slot(g));
  };
  if (!carried) {  // the first groups' sums, alone
    for (std::int64_t g = 0; g < ahead; ++g) {
      std::int64_t count = 0, stride = 0;
      const T* x = group_rows(g, count, stride);
      if (x == nullptr) break;
      for (std::int64_t k = 0; k < group; ++k) {
        vf32 s[2] = {hn::Zero(d), hn::Zero(d)};
        if (k < count) rows.squares(x + k * stride, s);
        sums[k] = hn::Add(s[0], s[1]);
      }
      inverse_rms(g);
    }
  }
  for (std::int64_t g = 0; g < groups; ++g) {
    std::int64_t count = 0, stride = 0;
    const T* later = group_rows(g + ahead, count, stride);  // the rows first read here
    for (std::int64_t k = 0; k < group; ++k) {
      const std::int64_t hd = g * group + k;
      const T* x_later = later != nullptr && k < count ? later + k * stride : nullptr;
      vf32 s[2] = {hn::Zero(d), hn::Zero(d)};
      if (hd < heads) {
        // Prefetched beyond row hd + 2 group (past the block's end, the next token's rows: the
        // same buffer's stream). Beyond row hd, 2048 bytes are the 2 * group rows already read
        // for bf16 and fewer for f32 (docs/performance.md, "Performance decisions").
        prefetch_row(in + (hd + ahead * group) * blk.in_h, p.head_dim, p.prefetch_bytes);
        rows.rotate(in + hd * blk.in_h, out + hd * blk.out_h, st.inv_rms[slot(g) + k], x_later, s);
      } else if (x_later != nullptr) {  // a last group of fewer rows
        rows.squares(x_later, s);
      }
      sums[k] = hn::Add(s[0], s[1]);
    }
    if (later != nullptr) inverse_rms(g + ahead);
  }
  // the next block's first groups' r are in the ring (where it is among this thread's tokens)
  st.ready_token = st.block + 1 == p.num_blocks ? st.token + 1 : st.token;
  st.ready_block = st.block + 1 == p.num_blocks ? 0 : st.block + 1;
  st.ready_slot = (base + groups) % slots;
}

// x r w of each loaded vector of halves (as norm_rotate_row), and where `ahead` is set the
// squares of the same positions of that row added into s[0] (first halves) and s[1].
template <class IO>
struct normalised_summing_ahead {
  df32 d;
  vf32 r;
  const float* wa;
  const float* wb;
  const typename IO::storage* ahead;
  std::int64_t half;
  vf32* s;
  HWY_INLINE vf32 operator()(vf32 v, bool second, std::int64_t i) const {
    if (ahead != nullptr) {
      const vf32 a = IO::load(d, ahead + (second ? half + i : i));
      s[second] = hn::MulAdd(a, a, s[second]);
    }
    return normalised<IO, false>(d, v, r, second ? wb : wa, i);
  }
};

// Rows of halves that norm_rotate_row takes (f32; f16 rows of neither 1, 2 nor 4 vectors of
// pairs, and with AVX-512 such bf16 rows too), r/2 a multiple of the lanes: its loop with the
// sums ahead.
template <class IO, bool Full>
struct rows_ahead {
  using T = typename IO::storage;
  df32 d;
  const token_angles& a;
  const float* wa;
  const float* wb;
  std::int64_t half;
  HWY_INLINE void squares(const T* x, vf32* s) const {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    for (std::int64_t i = 0; i < half; i += n) {
      const vf32 xa = IO::load(d, x + i), xb = IO::load(d, x + half + i);
      s[0] = hn::MulAdd(xa, xa, s[0]);
      s[1] = hn::MulAdd(xb, xb, s[1]);
    }
  }
  HWY_INLINE void rotate(const T* x, T* y, float r, const T* ahead, vf32* s) const {
    vf32 t[2] = {s[0], s[1]};
    rotate_whole_vectors<IO, IO, pairs::halves, pairs::halves, false, Full>(
        d, x, y, a, half, normalised_summing_ahead<IO>{d, hn::Set(d, r), wa, wb, ahead, half, t});
    s[0] = t[0];
    s[1] = t[1];
  }
};

#ifdef TILEROPE_BF16_BLOCKS
// One step of a bf16 row of halves (pairs [i, i + 2n) of both halves), squared into s[0] and
// s[1] in block order.
HWY_INLINE void add_bf16_block_squares(df32 d, const std::uint16_t* x, std::int64_t i,
                                       std::int64_t half, vf32& s0, vf32& s1) {
  const du16_t d16;
  vf32 a0, a1, b0, b1;
  widen_bf16_blocks(d, hn::LoadU(d16, x + i), a0, a1);
  widen_bf16_blocks(d, hn::LoadU(d16, x + half + i), b0, b1);
  s0 = hn::MulAdd(b0, b0, hn::MulAdd(a0, a0, s0));
  s1 = hn::MulAdd(b1, b1, hn::MulAdd(a1, a1, s1));
}

// bf16 rows of halves through the folded angles in block order (rotate_row_bf16_blocks), r/2 a
// multiple of 2n: the sums ahead taken once per step. Where every folded angle is at most 2^100
// in magnitude (`bounded`) and a row's r is finite and positive, its steps skip their NaN test:
// x is then finite and |x_j r| is about sqrt(D) at most (x_j^2 is one term of the sum r is
// from), so no product or sum of the rotation is NaN or infinite.
template <class IO>
struct bf16_rows_ahead {
  df32 d;
  const token_angles& folded;
  std::int64_t half;
  bool bounded;
  HWY_INLINE void squares(const std::uint16_t* x, vf32* s) const {
    const auto n = static_cast<std::int64_t>(hn::Lanes(d));
    for (std::int64_t i = 0; i < half; i += 2 * n)
      add_bf16_block_squares(d, x, i, half, s[0], s[1]);
  }
  HWY_INLINE void rotate(const std::uint16_t* x, std::uint16_t* y, float r,
                         const std::uint16_t* ahead, vf32* s) const {
    if (bounded && r > 0.0f && r <= std::numeric_limits<float>::max()) {
      rotate_with<true>(x, y, r, ahead, s);
    } else {
      rotate_with<false>(x, y, r, ahead, s);
    }
  }
  template <bool NaNFree>
  HWY_INLINE void rotate_with(const std::uint16_t* x, std::uint16_t* y, float r,
                              const std::uint16_t* ahead, vf32* s) const {
    if (ahead == nullptr) {
      rotate_row_bf16_blocks<IO, true, pairs::halves, NaNFree>(d, x, y, folded, half,
                                                               scaled_by{hn::Set(d, r)});
      return;
    }
    vf32 s0 = s[0], s1 = s[1];
    rotate_row_bf16_blocks<IO, true, pairs::halves, NaNFree>(
        d, x, y, folded, half, scaled_by{hn::Set(d, r)},
        [&](std::int64_t i) { add_bf16_block_squares(d, ahead, i, half, s0, s1); });
    s[0] = s0;
    s[1] = s1;
  }
};
#endif  // TILEROPE_BF16_BLOCKS
#endif

// QK RMSNorm + RoPE of one block (q or k) of one token, in groups of four heads: first
// r = 1 / sqrt(mean(x^2) + eps) of each head of the group (independent sums, so their latency
// overlaps; one row at a time waited on each sum, then on the square root), then normalise
// and rotate each row in one pass over it. The next group's r are found before this group is
// rotated (group_inverse_rms_vector: the four sums reduced together, bf16 squares by
// vdpbf16ps), so the rotations need not wait on a square root (docs/performance.md,
// "Performance decisions"). A group's rows are still in L1 when they are read again; taking the
// sums of a whole block first measured slower in memory. Rows shorter than a vector of pairs
// go through h = x r w in fp32 scratch `h`. With fp32_once, rows of 1, 2 or 4 whole vectors of
// pairs and 32 vector registers take norm_rotate_block_held when x is f32,
// norm_rotate_row_vectors when x is 16-bit (any lane count). The other fp32_once rows of halves
// (every dim rotated, r/2 a multiple of the lanes) take their sums two groups ahead inside the
// rotation's loop instead (norm_rotate_block_ahead).
template <class IO, pairs PIn, pairs POut, bool HfRound>
HWY_INLINE void norm_rotate_block(df32 d, const cpu_plan& p, const cpu_block& blk,
                                  const typename IO::storage* in, typename IO::storage* out,
                                  const token_angles& a, float* h, typename IO::storage* row_copy,
                                  [[maybe_unused]] norm_stream& st) {
  using T = typename IO::storage;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim, D = p.head_dim;
  constexpr std::int64_t group = norm_group;
  float inv_rms[2 * group];  // two groups' r: this one's and the next one's
  if constexpr (!HfRound) {
    // 16-bit x where the plan says (cpu_plan::held_16bit_norm_rows: on Intel); on Zen 4 with
    // 16-bit x in place it measured slower in cache, though faster out of place
    const bool held_x = sizeof(T) == 4 || p.held_16bit_norm_rows;
    const int held = held_x && lanes >= 16 && rotary == D ? held_vectors(half, lanes) : 0;
#ifdef TILEROPE_LANE_PAIRS
    if constexpr (takes_lane_pairs<IO, PIn, POut>()) {
      if (held == 4) return norm_rotate_block_held<IO, PIn, POut, 4, true>(d, p, blk, in, out, a);
      if (held == 2) return norm_rotate_block_held<IO, PIn, POut, 2, true>(d, p, blk, in, out, a);
    }
#endif
    if (held == 4) return norm_rotate_block_held<IO, PIn, POut, 4>(d, p, blk, in, out, a);
    if (held == 2) return norm_rotate_block_held<IO, PIn, POut, 2>(d, p, blk, in, out, a);
    if (held == 1) return norm_rotate_block_held<IO, PIn, POut, 1>(d, p, blk, in, out, a);
  }
  // 16-bit rows of whole vectors: the weights folded into the angles once per token and block
  [[maybe_unused]] HWY_ALIGN float folded_rows[4 * 4 * max_f32_lanes];
  [[maybe_unused]] token_angles folded = a;
  [[maybe_unused]] int held16 = 0;
  if constexpr (!HfRound && sizeof(T) == 2) {
    held16 = rotary == D ? held_vectors(half, lanes) : 0;
    if (held16 != 0) folded = fold_weights(d, a, blk.weight_a, blk.weight_b, half, folded_rows);
  }
  // bf16 halves without AVX-512: the folded angles in block order, a vector of bf16 at a time
  // (rotate_row_bf16_blocks)
  [[maybe_unused]] bool blocks16 = false;
#ifdef TILEROPE_BF16_BLOCKS
  if constexpr (!HfRound && PIn == pairs::halves && POut == pairs::halves) {
    blocks16 = held16 == 0 && takes_bf16_blocks<IO>(p, lanes);
    if (blocks16) {
      float* rows = angle_rows_scratch(p);
#ifdef TILEROPE_NORM_SUMS_AHEAD
      if constexpr (sizeof(T) == 2) {
        if (half % (2 * lanes) == 0) {
          bool bounded = false;
          folded = folded_in_block_order(d, a, blk.weight_a, blk.weight_b, half, rows, 0x1p100f,
                                         bounded);
          return norm_rotate_block_ahead(d, p, blk, in, out,
                                         bf16_rows_ahead<IO>{d, folded, half, bounded}, st);
        }
      }
#endif
      folded =
          block_ordered(d, fold_weights(d, a, blk.weight_a, blk.weight_b, half, rows), half, rows);
    }
  }
#endif
#ifdef TILEROPE_NORM_SUMS_AHEAD
  if constexpr (!HfRound && PIn == pairs::halves && POut == pairs::halves) {
    if (!blocks16 && held16 == 0 && rotary == D && half % lanes == 0) {
      if (a.full) {
        return norm_rotate_block_ahead(
            d, p, blk, in, out, rows_ahead<IO, true>{d, a, blk.weight_a, blk.weight_b, half}, st);
      }
      return norm_rotate_block_ahead(
          d, p, blk, in, out, rows_ahead<IO, false>{d, a, blk.weight_a, blk.weight_b, half}, st);
    }
  }
#endif
  for (std::int64_t hd = 0; hd < blk.heads; ++hd) {
    if (hd % group == 0) {  // this group's r found one group ahead, the next group's now
      if (hd == 0) group_inverse_rms_vector<IO>(d, p, blk, in, 0, inv_rms);
      if (hd + group < blk.heads) {
        group_inverse_rms_vector<IO>(d, p, blk, in, hd + group,
                                     inv_rms + (hd / group + 1) % 2 * group);
      }
    }
    const T* x = in + hd * blk.in_h;
    T* y = out + hd * blk.out_h;
    // The rows first read at a group's start are the next group's: prefetched beyond the
    // last of them, 2 group - 1 rows on (beyond row hd, 2048 bytes reached only rows already
    // read where a row is 512 bytes or more)
    prefetch_row(x + (2 * group - 1) * blk.in_h, D, p.prefetch_bytes);
    const float r = inv_rms[hd / group % 2 * group + hd % group];
    auto normalised1 = [&](std::int64_t j) {  // x r w of element j, scalar
      float n = IO::load1(x + j) * r;
      if constexpr (HfRound) n = round_to(p.x_type, n);
      const float hw = n * blk.weight[j];
      return HfRound ? round_to(p.x_type, hw) : hw;
    };
    for (std::int64_t j = rotary; j < D; ++j) IO::store1(normalised1(j), y + j);  // pass dims
    if (half < lanes) {
      for (std::int64_t j = 0; j < rotary; ++j) h[j] = normalised1(j);
      rotate_row<f32_io, IO, PIn, POut, HfRound>(d, h, y, a, half);
      continue;
    }
#ifdef TILEROPE_BF16_BLOCKS
    if constexpr (!HfRound && sizeof(T) == 2 && PIn == pairs::halves && POut == pairs::halves) {
      if (blocks16) {
        rotate_row_bf16_blocks<IO, true>(d, x, y, folded, half, scaled_by{hn::Set(d, r)});
        continue;
      }
    }
#endif
    if constexpr (!HfRound && sizeof(T) == 2) {
      switch (held16) {
        case 1:
          norm_rotate_row_vectors<IO, PIn, POut, 1>(d, x, y, folded, half, r);
          continue;
        case 2:
          norm_rotate_row_vectors<IO, PIn, POut, 2>(d, x, y, folded, half, r);
          continue;
        case 4:
          norm_rotate_row_vectors<IO, PIn, POut, 4>(d, x, y, folded, half, r);
          continue;
        default:
          break;
      }
    }
    x = readable_row<PIn, POut>(x, y, row_copy, rotary);
    if (a.full) {
      norm_rotate_row<IO, PIn, POut, HfRound, true>(d, x, y, a, half, r, blk.weight_a,
                                                    blk.weight_b);
    } else {
      norm_rotate_row<IO, PIn, POut, HfRound, false>(d, x, y, a, half, r, blk.weight_a,
                                                     blk.weight_b);
    }
  }
}

template <class IO, pairs PIn, pairs POut, bool HfRound>
void qk_norm_tokens_loop(const cpu_plan& p, std::int64_t first, std::int64_t last) {
  using T = typename IO::storage;
  const df32 d;
  float* scratch = thread_scratch(p);
  float* h = scratch + 2 * p.rotary_dim;
  T* row_copy = reinterpret_cast<T*>(h + p.head_dim);
  norm_stream st;
  st.last = last;
  for_each_block<T>(p, first, last, scratch,
                    [&](std::int64_t b, std::int64_t s, const token_angles& a, const cpu_block& blk,
                        const T* in, T* out) {
                      st.token = b * p.seq + s;
                      st.block = static_cast<int>(&blk - p.blocks);
                      norm_rotate_block<IO, PIn, POut, HfRound>(d, p, blk, in, out, a, h, row_copy,
                                                                st);
                    });
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_QK_NORM_INL_H_
