// QK RMSNorm + RoPE, backward: dx from the inverse rotation of dy and the norm's Jacobian, and
// the weights' gradients summed in fp32 per run of tokens, then in fp64.
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_QK_NORM_BACKWARD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_QK_NORM_BACKWARD_INL_H_
#undef TILEROPE_CPU_QK_NORM_BACKWARD_INL_H_
#else
#define TILEROPE_CPU_QK_NORM_BACKWARD_INL_H_
#endif

#include "cpu/qk_norm-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dw[j] += t[j] over n elements, fp32 terms into the fp64 weight gradient; Scaled: each term
// times scale[j] in fp64. Where n is a constant of whole vectors (the held backward), GCC 12
// warns of the scalar tail that never runs (-Waggressive-loop-optimizations); the tail written
// from n - n % lanes instead gives no warning, but the held backward's code changed with it
// (a lea per vector of dw) and measured slower, so the warning is silenced here instead
// (docs/performance.md, "Performance decisions").
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"
template <bool Scaled = false>
HWY_INLINE void add_into_f64(const float* t, double* dw, std::int64_t n,
                             const double* scale = nullptr) {
  std::int64_t j = 0;
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(dd));
  for (; j + lanes <= n; j += lanes) {
    auto term = hn::PromoteTo(dd, hn::LoadU(dh, t + j));
    if constexpr (Scaled) term = hn::Mul(term, hn::LoadU(dd, scale + j));
    hn::StoreU(hn::Add(hn::LoadU(dd, dw + j), term), dd, dw + j);
  }
#endif
  for (; j < n; ++j) dw[j] += static_cast<double>(t[j]) * (Scaled ? scale[j] : 1.0);
}
#pragma GCC diagnostic pop

// The token's angles with the block's weights folded in, for the backward's held rows: the
// rows wa ca, wa sa (the first element of each pair), wb cb, wb sb (the second), r/2 floats
// each, one after another in `rows`, in whatever order `a`, wa and wb are in.
HWY_INLINE token_angles weighted_angles(df32 d, const token_angles& a, const float* wa,
                                        const float* wb, std::int64_t half, float* rows) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t i = 0; i < half; i += n) {
    const vf32 va = hn::LoadU(d, wa + i), vb = hn::LoadU(d, wb + i);
    hn::StoreU(hn::Mul(va, hn::LoadU(d, a.ca + i)), d, rows + i);
    hn::StoreU(hn::Mul(va, hn::LoadU(d, a.sa + i)), d, rows + half + i);
    hn::StoreU(hn::Mul(vb, hn::LoadU(d, a.cb + i)), d, rows + 2 * half + i);
    hn::StoreU(hn::Mul(vb, hn::LoadU(d, a.sb + i)), d, rows + 3 * half + i);
  }
  return token_angles{rows, rows + half, rows + 2 * half, rows + 3 * half, true};
}

// A block's rows of tokens [first, last) in order, token by token, as the backward's kernels
// over runs take them: next(on_token) gives the next row's g, x and dx, calling on_token(b, s)
// first where the row is its token's first.
template <class T>
struct run_rows {
  struct row {
    const T* g;
    const T* x;
    T* dx;
  };
  const cpu_plan& p;
  const cpu_block& blk;
  std::int64_t t, h = 0;  // the next row's token and head
  const T *g = nullptr, *x = nullptr;
  T* dx = nullptr;  // token t's first rows
  template <class OnToken>
  HWY_INLINE row next(OnToken&& on_token) {
    if (h == 0) {
      const std::int64_t b = t / p.seq, s = t % p.seq;
      g = static_cast<const T*>(blk.in) + b * blk.in_b + s * blk.in_s;
      x = static_cast<const T*>(blk.x) + b * blk.x_b + s * blk.x_s;
      dx = static_cast<T*>(blk.out) + b * blk.out_b + s * blk.out_s;
      on_token(b, s);
    }
    const row r{g + h * blk.in_h, x + h * blk.x_h, dx + h * blk.out_h};
    if (++h == blk.heads) h = 0, ++t;
    return r;
  }
};

// Scratch of the backward's held rows (norm_backward_run_held), per thread.
struct held_scratch {
  float* token;     // angles_for's scratch
  float* ordered;   // [4 r/2] the token's angles in lane-pair order
  const float* wa;  // the block's weights of the pairs' first elements (r/2) and
  const float* wb;  //   of their second, in the rows' order
  float* angles;    // [4 r/2] the token's weighted angles (weighted_angles)
  float* staged;    // [3 D] q of the rows in flight
  float* tdw;       // [D] the run's dw terms
};

// Token (b, s)'s angles (`given`, else angles_for's) with the block's weights folded in, into
// sc.angles (weighted_angles), in lane-pair order with LanePairs: out of line, one copy for
// every held kernel.
template <bool LanePairs>
HWY_NOINLINE void weigh_token_angles(df32 d, const cpu_plan& p, std::int64_t b, std::int64_t s,
                                     const token_angles* given, const held_scratch& sc) {
  token_angles a = given != nullptr ? *given : angles_for(p, b, s, sc.token);
#ifdef TILEROPE_LANE_PAIRS
  if constexpr (LanePairs) a = lane_pair_angles(d, a, p.rotary_dim / 2, sc.ordered);
#endif
  weighted_angles(d, a, sc.wa, sc.wb, p.rotary_dim / 2, sc.angles);
}

// Backward of QK RMSNorm + RoPE for one block of a run of tokens [first, last) whose rows are NV
// whole vectors of pairs, every dim rotated (32 vector registers: AVX-512 at head dims 32, 64, 128
// and 256), in two passes over each row with the row's r and coef between them. The weights are
// folded into the angles (w cos and w sin: weighted_angles), so a row's rotation gives q = w dh = w
// rope_backward(g) directly:
//     sums:   q (staged in fp32, in L1),  r = 1 / sqrt(x.x / D + eps),  coef = r^3 q.x / D
//     apply:  x read again (from L1),  dx = r q - coef x,  dw' += (r q) x
// and the block's dw' over the run's rows becomes dw = dw' / w in fp64
// (blk.inverse_weight, set where every weight folds: see cpu_block). A vector of pairs takes
// 14 vector operations where there were 18 (the dot one FMA a half instead of a multiply and
// an FMA; the apply three a half: r q, dw', and dx as one FNMA on r q), and 4 angle loads
// where there were 2 (4 with full rows) and 4 weight loads.
// The sums run `ahead` = 2 rows before the apply, in the same pass over the heads: row h's sums
// are taken just before row h - 2 is applied, so the chain from a row's loads to its r and coef
// (two sums, their lane reductions, a square root and a division) overlaps other rows' work. Each
// row applied as soon as its own sums were done (its dh and x held in registers), the work waiting
// on that chain filled the scheduler and rows barely overlapped. The dw terms stay in registers
// across the run's rows (docs/performance.md, "Performance decisions").
// The rows are those of a run of tokens (block_run, q's and then k's, as
// for_each_block_in_runs takes them), token by token, and the sums run on across the tokens: a
// token's first two rows are summed while the token before it ends (its weighted angles found
// as its first row is summed: weigh_token_angles), and the dw terms go into fp64 once a run.
// Taken one token at a time, a block's first two rows were summed alone and its last two
// applied alone, and each token added its terms into fp64: a quarter to a third of the rows of
// blocks of 8 or 4 heads went without the overlap.
// LanePairs (bf16 halves with AVX512-BF16, NV even): the rows, and the angles, in lane-pair
// order.
template <class IO, pairs PIn, pairs POut, int NV, bool LanePairs = false>
HWY_NOINLINE void norm_backward_run_held(df32 d, const cpu_plan& p, const cpu_block& blk,
                                         std::int64_t first, std::int64_t last,
                                         const token_angles* given, const held_scratch& sc,
                                         int chunk) {
  using T = typename IO::storage;
  // f16 halves two vectors a step, stored a line at a time (a whole line where a streamed
  // store can take one)
  constexpr bool Wide = !LanePairs && std::is_same_v<typename IO::plain, f16_io> &&
                        PIn == pairs::halves && POut == pairs::halves && NV % 2 == 0;
  constexpr int S = LanePairs || Wide ? 2 : 1;  // vectors of pairs a load step takes
  static_assert(NV % S == 0);
  constexpr std::int64_t ahead = 2;  // rows whose sums run before the row applied
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  // r/2 = NV n and D = r (constants where the lanes are: one pointer and fixed offsets reach
  // the four angle rows, the staged rows and a row's second half)
  const std::int64_t half = NV * n, D = 2 * half, heads = blk.heads;
  const float inv_d = 1.0f / static_cast<float>(D);
  const float* angles = sc.angles;
  // angle row k (w_a cos, w_a sin, w_b cos, w_b sin) at vector v
  auto angle = [&](int k, int v) { return in_register(hn::LoadU(d, angles + k * half + v * n)); };
  // the rows in the order the sums reach them; a token's weighted angles found as its first is
  run_rows<T> cursor{p, blk, first};
  // q and x of one step of a row (S vectors of pairs from vector v0)
  auto load_step = [&](const T* g, const T* x, int v0, vf32* qa, vf32* qb, vf32* xa, vf32* xb)
                       TILEROPE_INLINE_LAMBDA {
                         vf32 ga[S], gb[S];
                         load_pairs_step<IO, PIn, LanePairs, Wide>(d, g, v0 * n, half, ga, gb);
                         load_pairs_step<IO, POut, LanePairs, Wide>(d, x, v0 * n, half, xa, xb);
                         for (int k = 0; k < S; ++k) {
                           const int v = v0 + k;
                           qa[k] = hn::MulSub(ga[k], angle(0, v), hn::Mul(gb[k], angle(1, v)));
                           qb[k] = hn::MulAdd(gb[k], angle(2, v), hn::Mul(ga[k], angle(3, v)));
                         }
                       };
  const hn::CappedTag<float, 1> d1;
  // of the rows in flight, by slot (row number mod ahead + 1): r, coef, x and dx
  float r_of[ahead + 1], coef_of[ahead + 1];
  const T* x_of[ahead + 1];
  T* dx_of[ahead + 1];
  // q of the rows in flight, in fp32 (first elements, then second), by slot
  auto q_of = [&](int slot) { return sc.staged + slot * D; };
  auto sums = [&](int slot) TILEROPE_INLINE_LAMBDA {
    const auto row = cursor.next([&](std::int64_t b, std::int64_t s) {
      weigh_token_angles<LanePairs>(d, p, b, s, given, sc);
    });
    const T *g = row.g, *x = row.x;
    x_of[slot] = x;
    dx_of[slot] = row.dx;
    float* q = q_of(slot);
    prefetch_row(g, D, p.prefetch_bytes);
    prefetch_row(x, D, p.prefetch_bytes);
    // two accumulators each (the pairs' first and second elements): a shorter chain
    vf32 sqa = hn::Zero(d), sqb = hn::Zero(d), dota = hn::Zero(d), dotb = hn::Zero(d);
    for (int v0 = 0; v0 < NV; v0 += S) {
      vf32 qa[S], qb[S], xa[S], xb[S];
      load_step(g, x, v0, qa, qb, xa, xb);
      for (int k = 0; k < S; ++k) {
        const int v = v0 + k;
        hn::StoreU(qa[k], d, q + v * n);
        hn::StoreU(qb[k], d, q + half + v * n);
        sqa = hn::MulAdd(xa[k], xa[k], sqa);
        sqb = hn::MulAdd(xb[k], xb[k], sqb);
        dota = hn::MulAdd(qa[k], xa[k], dota);
        dotb = hn::MulAdd(qb[k], xb[k], dotb);
      }
    }
    const auto mean_sq =
        hn::Mul(hn::Set(d1, hn::GetLane(hn::SumOfLanes(d, hn::Add(sqa, sqb)))), hn::Set(d1, inv_d));
    const float r =
        hn::GetLane(hn::Div(hn::Set(d1, 1.0f), hn::Sqrt(hn::Add(mean_sq, hn::Set(d1, p.eps)))));
    const float dot_d = hn::GetLane(hn::SumOfLanes(d, hn::Add(dota, dotb))) * inv_d;
    r_of[slot] = r;
    coef_of[slot] = (r * r) * (r * dot_d);
  };
  vf32 dwa[NV], dwb[NV];  // dw' (w dw) of the pairs' first and second elements
  for (int v = 0; v < NV; ++v) dwa[v] = dwb[v] = hn::Zero(d);
  const std::int64_t rows = (last - first) * heads;
  for (std::int64_t m = 0; m < std::min(ahead, rows); ++m) sums(static_cast<int>(m));
  int slot = 0, slot_ahead = static_cast<int>(ahead);  // of rows m and m + ahead
  for (std::int64_t m = 0; m < rows; ++m) {
    if (m + ahead < rows) sums(slot_ahead);
    const vf32 rv = hn::Set(d, r_of[slot]), cv = hn::Set(d, coef_of[slot]);
    const T* x = x_of[slot];
    const float* q = q_of(slot);
    T* dx = dx_of[slot];
    slot = slot == ahead ? 0 : slot + 1;
    slot_ahead = slot_ahead == ahead ? 0 : slot_ahead + 1;
    for (int v0 = 0; v0 < NV; v0 += S) {
      vf32 xa[S], xb[S], ya[S], yb[S];
      load_pairs_step<IO, POut, LanePairs, Wide>(d, x, v0 * n, half, xa, xb);
      for (int k = 0; k < S; ++k) {
        const int v = v0 + k;
        // r q once: dw' += (r q) x,  dx = r q - coef x
        const vf32 qra = hn::Mul(hn::LoadU(d, q + v * n), rv);
        const vf32 qrb = hn::Mul(hn::LoadU(d, q + half + v * n), rv);
        dwa[v] = hn::MulAdd(qra, xa[k], dwa[v]);
        dwb[v] = hn::MulAdd(qrb, xb[k], dwb[v]);
        ya[k] = hn::NegMulAdd(cv, xa[k], qra);
        yb[k] = hn::NegMulAdd(cv, xb[k], qrb);
      }
      store_pairs_step<IO, POut, LanePairs, Wide>(d, ya, yb, dx, v0 * n, half);
    }
  }
  // the run's rows, summed, in the weight's element order, divided by w
  float* tdw = sc.tdw;
  for (int v = 0; v < NV; v += S) {
    if constexpr (LanePairs) {
      hn::StoreInterleaved2(dwa[v], dwa[v + 1], d, tdw + v * n);
      hn::StoreInterleaved2(dwb[v], dwb[v + 1], d, tdw + half + v * n);
    } else {
      for (int k = 0; k < S; ++k) {
        store_pair<f32_io, POut>(d, dwa[v + k], dwb[v + k], tdw, (v + k) * n, half);
      }
    }
  }
  add_into_f64<true>(tdw, blk.weight_grad + chunk * D, D, blk.inverse_weight);
}

// r = 1 / sqrt(sum(sq) / D + eps) and coef = r^3 sum(dot) / D of four heads from their vectors
// of sums, into r[0, 4) and coef[0, 4): one vector square root and division on x86.
HWY_INLINE void inverse_rms_and_coef4(df32 d, const cpu_plan& p, const vf32* sq, const vf32* dot,
                                      float* r, float* coef) {
  const float inv_d = 1.0f / static_cast<float>(p.head_dim);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
  static_assert(norm_group == 4);
  const hn::Full128<float> d4;
  store_inverse_rms4(d, p, sq, r);
  const auto rv = hn::Load(d4, r);
  const auto dots = lane_sums4(d, dot[0], dot[1], dot[2], dot[3]);
  hn::Store(hn::Mul(hn::Mul(hn::Mul(rv, rv), rv), hn::Mul(dots, hn::Set(d4, inv_d))), d4, coef);
#else
  for (std::int64_t k = 0; k < norm_group; ++k) {
    r[k] = 1.0f / std::sqrt(hn::GetLane(hn::SumOfLanes(d, sq[k])) * inv_d + p.eps);
    coef[k] = r[k] * r[k] * r[k] * inv_d * hn::GetLane(hn::SumOfLanes(d, dot[k]));
  }
#endif
}

// The angles the backward's sums take for token (b, s) (`given`, else angles_for's): with
// Weighted the block's weights wa, wb folded in, with Blocks in block order, into `ordered`
// (4 r/2) where either; out of line, one copy for every kernel of rows summed ahead.
template <bool Blocks, bool Weighted>
HWY_NOINLINE token_angles ahead_token_angles(df32 d, const cpu_plan& p, std::int64_t b,
                                             std::int64_t s, const token_angles* given,
                                             float* token_scratch, const float* wa, const float* wb,
                                             float* ordered) {
  const std::int64_t half = p.rotary_dim / 2;
  token_angles a = given != nullptr ? *given : angles_for(p, b, s, token_scratch);
  if constexpr (Weighted) a = weighted_angles(d, a, wa, wb, half, ordered);
#if TILEROPE_BF16_BLOCKS
  if constexpr (Blocks) a = block_ordered(d, a, half, ordered);  // Weighted: in place
#endif
  return a;
}

// Backward of QK RMSNorm + RoPE for one block of a run of tokens [first, last) whose rows are
// whole vectors of pairs, every dim rotated, where a row does not fit in the registers (16 vector
// registers, or r/2 over 4 vectors). In groups of four heads, a row takes two passes:
//     sums:  dh = rope_backward(g) (staged in fp32, in pair order), x.x, (w dh).x
//     apply: dx = r w dh - coef x (x read again, from cache),  dw += r dh x (in pair order)
// and the sums of the next group's row go in the same loop as each row's apply, so that the
// loads from memory overlap the arithmetic of the row before (the run's first group's sums go
// alone). The two accumulators each, and one vector square root and division per group, replace the
// staged path's single accumulators, whose latency bound its loop (docs/performance.md,
// "Performance decisions").
// Blocks (bf16 halves with AVX2 and SSE4): 2n pairs a step, a vector of bf16 at a time in block
// order (widen_bf16_blocks, narrow_bf16_blocks: one NaN test and the u16 rounding for two
// vectors), the angles put in block order once per token, the weights once per run, and the
// dw terms put back at the run's end.
// Weighted (the block's weights fold: blk.inverse_weight), as the held rows: the rotation takes
// the weights folded into the angles (weighted_angles), so it gives q = w dh, the dot is one FMA
// a vector, the apply takes r q once (dx = r q - coef x, dw' += (r q) x) and the block's dw' is
// divided by w in fp64: 14 vector operations a vector of pairs where there were 20, and no
// weight loads.
// The rows are those of a run of tokens, as for the held rows (norm_backward_run_held): the
// groups of four are the run's rows four at a time, across its tokens, a token's angles found
// as the sums reach its first row (ahead_token_angles), and the dw terms go into fp64 once a
// run. Taken a token at a time, each block's first group was summed alone and its last applied
// alone: half the rows of a block of 8 heads, all of a block of 4.
template <class IO, pairs PIn, pairs POut, bool Full, bool Blocks = false, bool Weighted = false>
HWY_NOINLINE void norm_backward_run_ahead(df32 d, const cpu_plan& p, const cpu_block& blk,
                                          std::int64_t first, std::int64_t last,
                                          const token_angles* given, float* token_scratch,
                                          float* rows, int chunk) {
  static_assert(!Weighted || Full);  // the folded angles are four rows
  using T = typename IO::storage;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t half = p.rotary_dim / 2, D = p.head_dim, heads = blk.heads;
  constexpr std::int64_t group = norm_group;
  float* tdw = rows + 2 * group * D;  // [D]: dw of the pairs' first, then second elements
  float* tdw_out = tdw + D;           // [D]: dw in the weight's element order
  std::fill(tdw, tdw + D, 0.0f);
  // pointers held in registers (the vector stores may alias the structs that hold them); with
  // Blocks the angles and weights in block order, after tdw_out
  const float *wa = blk.weight_a, *wb = blk.weight_b;
  token_angles angles;           // of the token whose rows are summed
  float* ordered = tdw_out + D;  // [4 r/2] angles (Weighted: w cos, w sin), [2 r/2] weights
#if TILEROPE_BF16_BLOCKS
  if constexpr (Blocks && !Weighted) {
    const token_angles w = block_ordered(d, token_angles{wa, wb, wa, wb}, half, ordered + 2 * D);
    wa = w.ca;
    wb = w.sa;
  }
#endif
  // the rows in the order the sums reach them; a token's angles found as its first is
  run_rows<T> cursor{p, blk, first};
  // of the rows in flight (this group's and the next one's), by slot (row number mod 2 group)
  const T* g_of[2 * group];
  const T* x_of[2 * group];
  T* dx_of[2 * group];
  // the next row the sums reach, into `slot`
  auto next_row = [&](std::int64_t slot) TILEROPE_INLINE_LAMBDA {
    const auto row = cursor.next([&](std::int64_t b, std::int64_t s) {
      angles = ahead_token_angles<Blocks, Weighted>(d, p, b, s, given, token_scratch, blk.weight_a,
                                                    blk.weight_b, ordered);
    });
    g_of[slot] = row.g;
    x_of[slot] = row.x;
    dx_of[slot] = row.dx;
  };
  // dh of the row in `slot` in rows[slot D, ...)
  auto dh_of = [&](std::int64_t slot) { return rows + slot * D; };
  vf32 sq_of[group], dot_of[group];               // the sums' vectors of the group ahead
  alignas(16) float r_of[group], coef_of[group];  // r and coef of the group applied
  struct sums {                                   // one row's sums as they go
    vf32 sqa, sqb, dota, dotb;
  };
  // one vector of pairs at frequency i, loaded: dh staged and the sums
  auto sum_vectors = [&](vf32 ga, vf32 gb, vf32 xa, vf32 xb, float* dh, std::int64_t i, sums& s)
                         TILEROPE_INLINE_LAMBDA {
                           vf32 dha, dhb;  // Weighted: q = w dh
                           rotate_vectors<f32_io, false, Full>(d, ga, gb, i, angles, dha, dhb);
                           hn::StoreU(dha, d, dh + i);
                           hn::StoreU(dhb, d, dh + half + i);
                           s.sqa = hn::MulAdd(xa, xa, s.sqa);
                           s.sqb = hn::MulAdd(xb, xb, s.sqb);
                           if constexpr (Weighted) {
                             s.dota = hn::MulAdd(dha, xa, s.dota);
                             s.dotb = hn::MulAdd(dhb, xb, s.dotb);
                           } else {
                             s.dota = hn::MulAdd(hn::Mul(hn::LoadU(d, wa + i), dha), xa, s.dota);
                             s.dotb = hn::MulAdd(hn::Mul(hn::LoadU(d, wb + i), dhb), xb, s.dotb);
                           }
                         };
  // dx of one vector of pairs at frequency i into (ya, yb), and its dw terms
  auto apply_vectors = [&](vf32 xa, vf32 xb, const float* dh, vf32 rv, vf32 cv, std::int64_t i,
                           vf32& ya, vf32& yb) TILEROPE_INLINE_LAMBDA {
    const vf32 dha = hn::LoadU(d, dh + i), dhb = hn::LoadU(d, dh + half + i);
    if constexpr (Weighted) {  // r q once: dw' += (r q) x,  dx = r q - coef x
      const vf32 qra = hn::Mul(dha, rv), qrb = hn::Mul(dhb, rv);
      ya = hn::NegMulAdd(cv, xa, qra);
      yb = hn::NegMulAdd(cv, xb, qrb);
      hn::StoreU(hn::MulAdd(qra, xa, hn::LoadU(d, tdw + i)), d, tdw + i);
      hn::StoreU(hn::MulAdd(qrb, xb, hn::LoadU(d, tdw + half + i)), d, tdw + half + i);
      return;
    }
    ya = hn::MulSub(rv, hn::Mul(hn::LoadU(d, wa + i), dha), hn::Mul(cv, xa));
    yb = hn::MulSub(rv, hn::Mul(hn::LoadU(d, wb + i), dhb), hn::Mul(cv, xb));
    hn::StoreU(hn::MulAdd(hn::Mul(dha, xa), rv, hn::LoadU(d, tdw + i)), d, tdw + i);
    hn::StoreU(hn::MulAdd(hn::Mul(dhb, xb), rv, hn::LoadU(d, tdw + half + i)), d, tdw + half + i);
  };
#if TILEROPE_BF16_BLOCKS
  const du16_t d16;
  const hn::Half<du16_t> dh16;  // n lanes
  // a step of 2n pairs of bf16 halves, in block order
  auto widen = [&](const auto* x, std::int64_t i, vf32& a0, vf32& a1, vf32& b0, vf32& b1)
                   TILEROPE_INLINE_LAMBDA {
                     widen_bf16_blocks(d, hn::LoadU(d16, x + i), a0, a1);
                     widen_bf16_blocks(d, hn::LoadU(d16, x + half + i), b0, b1);
                   };
#endif
  auto sum_step = [&](const T* g, const T* x, float* dh, std::int64_t i, sums& s)
                      TILEROPE_INLINE_LAMBDA {
#if TILEROPE_BF16_BLOCKS
                        if constexpr (Blocks) {
                          vf32 ga0, ga1, gb0, gb1, xa0, xa1, xb0, xb1;
                          widen(g, i, ga0, ga1, gb0, gb1);
                          widen(x, i, xa0, xa1, xb0, xb1);
                          sum_vectors(ga0, gb0, xa0, xb0, dh, i, s);
                          sum_vectors(ga1, gb1, xa1, xb1, dh, i + n, s);
                          return;
                        }
#endif
                        vf32 ga, gb, xa, xb;
                        load_pair<IO, PIn>(d, g, i, half, ga, gb);
                        load_pair<IO, POut>(d, x, i, half, xa, xb);
                        sum_vectors(ga, gb, xa, xb, dh, i, s);
                      };
  auto apply_step = [&](const T* x, T* dx, const float* dh, vf32 rv, vf32 cv,
                        std::int64_t i) TILEROPE_INLINE_LAMBDA {
#if TILEROPE_BF16_BLOCKS
    if constexpr (Blocks) {
      vf32 xa0, xa1, xb0, xb1, ya0, ya1, yb0, yb1;
      widen(x, i, xa0, xa1, xb0, xb1);
      apply_vectors(xa0, xb0, dh, rv, cv, i, ya0, yb0);
      apply_vectors(xa1, xb1, dh, rv, cv, i + n, ya1, yb1);
      const bool nan = may_hold_nan(d, hn::Add(hn::Add(ya0, ya1), hn::Add(yb0, yb1)));
      const auto ea = narrow_bf16_blocks(d, ya0, ya1, nan);
      const auto eb = narrow_bf16_blocks(d, yb0, yb1, nan);
      if constexpr (std::is_same_v<IO, typename IO::plain>) {
        hn::StoreU(ea, d16, dx + i);
        hn::StoreU(eb, d16, dx + half + i);
      } else {  // streaming_io: n at a time (can_stream checks n)
        hn::Stream(hn::LowerHalf(dh16, ea), dh16, dx + i);
        hn::Stream(hn::UpperHalf(dh16, ea), dh16, dx + i + n);
        hn::Stream(hn::LowerHalf(dh16, eb), dh16, dx + half + i);
        hn::Stream(hn::UpperHalf(dh16, eb), dh16, dx + half + i + n);
      }
      return;
    }
#endif
    vf32 xa, xb, ya, yb;
    load_pair<IO, POut>(d, x, i, half, xa, xb);
    apply_vectors(xa, xb, dh, rv, cv, i, ya, yb);
    store_pair<IO, POut>(d, ya, yb, dx, i, half);
  };
  const std::int64_t step = Blocks ? 2 * n : n;
  const std::int64_t rows_n = (last - first) * heads;
  // the first group's sums
  for (std::int64_t k = 0; k < group; ++k) {
    sums s{hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d)};
    if (k < rows_n) {
      next_row(k);
      for (std::int64_t i = 0; i < half; i += step) sum_step(g_of[k], x_of[k], dh_of(k), i, s);
    }
    sq_of[k] = hn::Add(s.sqa, s.sqb);
    dot_of[k] = hn::Add(s.dota, s.dotb);
  }
  for (std::int64_t m0 = 0; m0 < rows_n; m0 += group) {
    inverse_rms_and_coef4(d, p, sq_of, dot_of, r_of, coef_of);
    const std::int64_t slot0 = m0 % (2 * group), slot0_ahead = (m0 + group) % (2 * group);
    for (std::int64_t k = 0; k < group; ++k) {
      const std::int64_t m = m0 + k, slot = slot0 + k, slot_ahead = slot0_ahead + k;
      const vf32 rv = hn::Set(d, r_of[k]), cv = hn::Set(d, coef_of[k]);
      sums s{hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d)};
      if (m + group < rows_n) {
        next_row(slot_ahead);
        const T *g = g_of[slot_ahead], *xh = x_of[slot_ahead];
        prefetch_row(g, D, p.prefetch_bytes);
        prefetch_row(xh, D, p.prefetch_bytes);
        const T* x = x_of[slot];
        T* dx = dx_of[slot];
        float *dh_ahead = dh_of(slot_ahead), *dh = dh_of(slot);
        for (std::int64_t i = 0; i < half; i += step) {
          sum_step(g, xh, dh_ahead, i, s);
          apply_step(x, dx, dh, rv, cv, i);
        }
      } else if (m < rows_n) {
        // Past the run's last rows too: the rows a group on from this one in the same buffer,
        // plus the distance. Asked only for rows summed, a block of 8 heads of 256 bytes taken
        // a token at a time prefetched none of its first four rows.
        prefetch_row(g_of[slot] + group * blk.in_h, D, p.prefetch_bytes);
        prefetch_row(x_of[slot] + group * blk.x_h, D, p.prefetch_bytes);
        const T* x = x_of[slot];
        T* dx = dx_of[slot];
        const float* dh = dh_of(slot);
        for (std::int64_t i = 0; i < half; i += step) apply_step(x, dx, dh, rv, cv, i);
      }
      sq_of[k] = hn::Add(s.sqa, s.sqb);
      dot_of[k] = hn::Add(s.dota, s.dotb);
    }
  }
  // the run's rows, summed, in the weight's element order
#if TILEROPE_BF16_BLOCKS
  if constexpr (Blocks) {  // block order is its own inverse
    for (std::int64_t i = 0; i < D; i += 2 * n) {
      vf32 lo, hi;
      to_block_order(d, hn::LoadU(d, tdw + i), hn::LoadU(d, tdw + i + n), lo, hi);
      hn::StoreU(lo, d, tdw + i);
      hn::StoreU(hi, d, tdw + i + n);
    }
  }
#endif
  for (std::int64_t i = 0; i < half; i += n) {
    store_pair<f32_io, POut>(d, hn::LoadU(d, tdw + i), hn::LoadU(d, tdw + half + i), tdw_out, i,
                             half);
  }
  // Weighted: the sums are of w dw, divided by w in fp64
  add_into_f64<Weighted>(tdw_out, blk.weight_grad + chunk * D, D, blk.inverse_weight);
}

// Backward of QK RMSNorm + RoPE (PIn, POut are the backward rotation's layouts), per token
// and block in groups of four heads: first, for each head of the group, dh = rope_backward(g)
// and the row's two sums (x.x and w dh.x), then through the normalisation. As in the forward,
// the sums of a group overlap instead of each row waiting on its own. Weight-gradient terms
// are summed in fp32 over the heads of one token, then added into the fp64 accumulator.
// `rows` holds dh and x in fp32 for each head of a group, then the token's weight-gradient
// terms. Rows of whole vectors of pairs with every dim rotated take the held path (32 vector
// registers, r/2 of 1, 2, 4 or 8 vectors: norm_backward_held) or, with fewer registers,
// norm_backward_ahead, both called by the tokens loop; the rest (partial rotary, r/2 not a
// multiple of the lanes, AVX-512 rows of other numbers of vectors) come here.

// How many whole vectors of pairs a backward row held in registers has (norm_backward_run_held:
// 32 vector registers, every dim rotated, every block's weights folded into the angles), else 0.
// Rows of 8 vectors (head dim 256) too, which the forward does not hold (its folded angles take 4
// NV registers): here the angles are loaded and the block's dw terms take the 2 NV = 16
// registers (objdump: nothing spilled), faster than the rows staged in norm_backward_block's
// own loop.
// Whether every block's weights fold into the angles (cpu_block::inverse_weight).
inline bool every_weight_folds(const cpu_plan& p) {
  for (int k = 0; k < p.num_blocks; ++k) {
    if (p.blocks[k].inverse_weight == nullptr) return false;
  }
  return true;
}

inline int norm_backward_held_vectors(const cpu_plan& p, std::int64_t lanes) {
  if (!every_weight_folds(p)) return 0;
  if (lanes < 16 || p.rotary_dim != p.head_dim) return 0;
  if (p.rotary_dim / 2 == 8 * lanes) return 8;
  return held_vectors(p.rotary_dim / 2, lanes);
}

// The backward's held rows of tokens [first, last) of one block, `held` whole vectors of pairs
// (norm_backward_held_vectors), through norm_backward_run_held. `given`: the angles of a run of
// one token, else null (each token's are found). `rows`: qk_norm_backward_tokens_loop's.
template <class IO, pairs PIn, pairs POut>
HWY_INLINE void norm_backward_held(df32 d, const cpu_plan& p, const cpu_block& blk, int held,
                                   std::int64_t first, std::int64_t last, const token_angles* given,
                                   float* token_scratch, float* rows, int chunk) {
  const std::int64_t half = p.rotary_dim / 2, D = p.head_dim;
  // rows: [0, 2D) the weighted angles, [2D, 4D) the lane-pair angles, [4D, 5D) the lane-pair
  // weights, [5D, 8D) q staged, [8D, 9D) the dw terms
  held_scratch sc;
  sc.token = token_scratch;
  sc.ordered = rows + 4 * half;
  sc.wa = blk.weight_a;
  sc.wb = blk.weight_b;
  sc.angles = rows;
  sc.staged = rows + 5 * D;
  sc.tdw = rows + 2 * norm_group * D;
  auto run = [&](auto lane_pairs) TILEROPE_INLINE_LAMBDA {
    constexpr bool LP = decltype(lane_pairs)::value;
    switch (held) {
      case 8:
        return norm_backward_run_held<IO, PIn, POut, 8, LP>(d, p, blk, first, last, given, sc,
                                                            chunk);
      case 4:
        return norm_backward_run_held<IO, PIn, POut, 4, LP>(d, p, blk, first, last, given, sc,
                                                            chunk);
      case 2:
        return norm_backward_run_held<IO, PIn, POut, 2, LP>(d, p, blk, first, last, given, sc,
                                                            chunk);
      default:  // 1: never in lane-pair order
        if constexpr (!LP) {
          return norm_backward_run_held<IO, PIn, POut, 1>(d, p, blk, first, last, given, sc, chunk);
        }
    }
  };
#ifdef TILEROPE_LANE_PAIRS
  if constexpr (takes_lane_pairs<IO, PIn, POut>()) {
    if (held != 1) {            // the block's weights in lane-pair order (the angles: per token)
      float* w = rows + 4 * D;  // [2 r/2]
      lane_pair_ordered(d, blk.weight_a, half, w);
      lane_pair_ordered(d, blk.weight_b, half, w + half);
      sc.wa = w;
      sc.wb = w + half;
      return run(std::true_type{});
    }
  }
#endif
  return run(std::false_type{});
}

// Whether the backward's rows are summed ahead (norm_backward_run_ahead): whole vectors of
// pairs, every dim rotated, and no row held (fewer than 16 lanes; AVX-512 keeps the staged
// path for rows of 3, 5 to 7, or more than 8 vectors of pairs).
inline bool norm_backward_sums_ahead(const cpu_plan& p, std::int64_t lanes) {
  return lanes < 16 && p.rotary_dim == p.head_dim && p.rotary_dim / 2 % lanes == 0;
}

// The backward's rows of tokens [first, last) of one block through norm_backward_run_ahead.
// `given`: the angles of a run of one token, else null (each token's are found, and none is a
// full-width row unless the block's weights fold: see qk_norm_backward_tokens_loop).
template <class IO, pairs PIn, pairs POut>
HWY_INLINE void norm_backward_ahead(df32 d, const cpu_plan& p, const cpu_block& blk,
                                    std::int64_t first, std::int64_t last,
                                    const token_angles* given, float* token_scratch, float* rows,
                                    int chunk) {
  const bool folds = blk.inverse_weight != nullptr, full = given != nullptr && given->full;
#if TILEROPE_BF16_BLOCKS
  if constexpr (std::is_same_v<typename IO::plain, bf16_io> && PIn == pairs::halves &&
                POut == pairs::halves) {
    const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
    if (p.rotary_dim / 2 % (2 * lanes) == 0) {  // bf16 halves a vector of bf16 at a time
      if (folds) {
        return norm_backward_run_ahead<IO, PIn, POut, true, true, true>(
            d, p, blk, first, last, given, token_scratch, rows, chunk);
      }
      if (full) {
        return norm_backward_run_ahead<IO, PIn, POut, true, true>(d, p, blk, first, last, given,
                                                                  token_scratch, rows, chunk);
      }
      return norm_backward_run_ahead<IO, PIn, POut, false, true>(d, p, blk, first, last, given,
                                                                 token_scratch, rows, chunk);
    }
  }
#endif
  if (folds) {
    return norm_backward_run_ahead<IO, PIn, POut, true, false, true>(d, p, blk, first, last, given,
                                                                     token_scratch, rows, chunk);
  }
  if (full) {
    return norm_backward_run_ahead<IO, PIn, POut, true>(d, p, blk, first, last, given,
                                                        token_scratch, rows, chunk);
  }
  return norm_backward_run_ahead<IO, PIn, POut, false>(d, p, blk, first, last, given, token_scratch,
                                                       rows, chunk);
}

template <class IO, pairs PIn, pairs POut>
HWY_INLINE void norm_backward_block(df32 d, const cpu_plan& p, const cpu_block& blk,
                                    const typename IO::storage* g_in, typename IO::storage* dx_out,
                                    const typename IO::storage* x_in, const token_angles& a,
                                    float* rows, int chunk) {
  using T = typename IO::storage;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t half = p.rotary_dim / 2, rotary = p.rotary_dim, D = p.head_dim;
  constexpr std::int64_t group = norm_group;
  float* tdw = rows + 2 * group * D;
  float r_of[group], coef_of[group];
  const float inv_d = 1.0f / static_cast<float>(D);
  const std::int64_t vec_end = D / lanes * lanes;
  for (std::int64_t h0 = 0; h0 < blk.heads; h0 += group) {
    const std::int64_t n = std::min(group, blk.heads - h0);
    for (std::int64_t g = 0; g < n; ++g) {
      const T* gr = g_in + (h0 + g) * blk.in_h;
      const T* x = x_in + (h0 + g) * blk.x_h;
      prefetch_row(gr, D, p.prefetch_bytes);
      prefetch_row(x, D, p.prefetch_bytes);
      float* dh = rows + 2 * g * D;
      float* xr = dh + D;
      rotate_row<IO, f32_io, PIn, POut>(d, gr, dh, a, half);
      for (std::int64_t j = rotary; j < D; ++j) dh[j] = IO::load1(gr + j);
      vf32 sq = hn::Zero(d), dot = hn::Zero(d);
      for (std::int64_t j = 0; j < vec_end; j += lanes) {
        const vf32 xv = IO::load(d, x + j);
        hn::StoreU(xv, d, xr + j);
        sq = hn::MulAdd(xv, xv, sq);
        dot = hn::MulAdd(hn::Mul(hn::LoadU(d, blk.weight + j), hn::LoadU(d, dh + j)), xv, dot);
      }
      float sq_s = hn::GetLane(hn::SumOfLanes(d, sq));
      float dot_s = hn::GetLane(hn::SumOfLanes(d, dot));
      for (std::int64_t j = vec_end; j < D; ++j) {
        xr[j] = IO::load1(x + j);
        sq_s += xr[j] * xr[j];
        dot_s += blk.weight[j] * dh[j] * xr[j];
      }
      const float r = 1.0f / std::sqrt(sq_s * inv_d + p.eps);
      r_of[g] = r;
      coef_of[g] = r * r * r * inv_d * dot_s;
    }
    for (std::int64_t g = 0; g < n; ++g) {
      const float* dh = rows + 2 * g * D;
      const float* xr = dh + D;
      T* dx = dx_out + (h0 + g) * blk.out_h;
      const float r = r_of[g], coef = coef_of[g];
      const vf32 rv = hn::Set(d, r), cv = hn::Set(d, coef);
      for (std::int64_t j = 0; j < vec_end; j += lanes) {
        const vf32 dhv = hn::LoadU(d, dh + j), xv = hn::LoadU(d, xr + j);
        const vf32 wdh = hn::Mul(hn::LoadU(d, blk.weight + j), dhv);
        IO::store(d, hn::MulSub(rv, wdh, hn::Mul(cv, xv)), dx + j);
        hn::StoreU(hn::MulAdd(hn::Mul(dhv, xv), rv, hn::LoadU(d, tdw + j)), d, tdw + j);
      }
      for (std::int64_t j = vec_end; j < D; ++j) {
        IO::store1(r * blk.weight[j] * dh[j] - coef * xr[j], dx + j);
        tdw[j] += dh[j] * xr[j] * r;
      }
    }
  }
  add_into_f64(tdw, blk.weight_grad + chunk * D, D);  // the block's heads of this token, summed
  std::fill(tdw, tdw + D, 0.0f);
}

template <class IO, pairs PIn, pairs POut>
void qk_norm_backward_tokens_loop(const cpu_plan& p, std::int64_t first, std::int64_t last,
                                  int chunk) {
  using T = typename IO::storage;
  const df32 d;
  thread_local std::vector<float> scratch;
  // 2 groups of D (dh or dh and x; held rows: the weighted angles, the lane-pair angles and
  // weights, q of 3 rows), dw terms, dw in element order, then for the bf16 block order the
  // angles (2 D) and weights (D)
  const auto need = static_cast<std::size_t>((2 * norm_group + 5) * p.head_dim);
  float* rows = line_aligned(scratch, need);
  std::fill(rows, rows + need, 0.0f);
  float* token_scratch = thread_scratch(p);
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const int held = norm_backward_held_vectors(p, lanes);
  const bool ahead = norm_backward_sums_ahead(p, lanes);
  // A block's rows of a run of tokens at a time, unless the angles are gathered in runs of
  // their own (MRoPE from a table) or, for rows summed ahead whose weights do not fold, a
  // token's angles may be full-width rows (their kernel is chosen per token).
  const bool may_be_full = p.rows_cos != nullptr && p.rows_width != p.rotary_dim / 2;
  if ((held != 0 || (ahead && (every_weight_folds(p) || !may_be_full))) &&
      !gathers_angles_in_runs(p)) {
    for (std::int64_t t0 = first; t0 < last; t0 += block_run) {
      const std::int64_t t1 = std::min(last, t0 + block_run);
      for (int k = 0; k < p.num_blocks; ++k) {
        if (held != 0) {
          norm_backward_held<IO, PIn, POut>(d, p, p.blocks[k], held, t0, t1, nullptr, token_scratch,
                                            rows, chunk);
        } else {
          norm_backward_ahead<IO, PIn, POut>(d, p, p.blocks[k], t0, t1, nullptr, token_scratch,
                                             rows, chunk);
        }
      }
    }
    return;
  }
  for_each_block_in_runs<T>(
      p, first, last, token_scratch,
      [&](std::int64_t b, std::int64_t s, const token_angles& a, const cpu_block& blk,
          const T* g_in, T* dx_out) {
        const std::int64_t t = b * p.seq + s;
        if (held != 0) {
          return norm_backward_held<IO, PIn, POut>(d, p, blk, held, t, t + 1, &a, token_scratch,
                                                   rows, chunk);
        }
        if (ahead) {
          return norm_backward_ahead<IO, PIn, POut>(d, p, blk, t, t + 1, &a, token_scratch, rows,
                                                    chunk);
        }
        const T* x_in = static_cast<const T*>(blk.x) + b * blk.x_b + s * blk.x_s;
        norm_backward_block<IO, PIn, POut>(d, p, blk, g_in, dx_out, x_in, a, rows, chunk);
      });
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_QK_NORM_BACKWARD_INL_H_
