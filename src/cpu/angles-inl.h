// Per-token angles: positions, table rows, per-token rows and computed sin/cos, gathered into
// the cos/sin of each rotated pair.
// Included by each SIMD target's pass of rope_kernels.cc (Highway's -inl.h convention).

#if defined(TILEROPE_CPU_ANGLES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TILEROPE_CPU_ANGLES_INL_H_
#undef TILEROPE_CPU_ANGLES_INL_H_
#else
#define TILEROPE_CPU_ANGLES_INL_H_
#endif

#include "cpu/rotate-inl.h"
#include "cpu/sin_cos-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tilerope::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- per-token angles ------------------------------------------------------------------------

// Position id number `at` (i32 or i64).
std::int64_t id_at(const cpu_plan& p, std::int64_t at) {
  return p.ids_type == dtype::i32 ? static_cast<const std::int32_t*>(p.ids)[at]
                                  : static_cast<const std::int64_t*>(p.ids)[at];
}

std::int64_t position_of(const cpu_plan& p, std::int64_t b, std::int64_t s) {
  if (p.ids == nullptr) return p.start + s;
  return id_at(p, b * p.ids_b + s * p.ids_s);
}

// Multi-axis positions (MRoPE, 2D vision): frequency i reads the position of its own axis.
std::int64_t axis_position_of(const cpu_plan& p, std::int64_t i, std::int64_t s) {
  return id_at(p, p.axis_of_frequency[i] * p.ids_axis + s);
}

// The x dtype's rounding of an fp32 value (hf_compat keeps its tables in the x dtype).
float round_to(dtype t, float v) {
  if (t == dtype::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  if (t == dtype::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  return v;
}

float value_at(dtype t, const void* p, std::int64_t e) {
  switch (t) {
    case dtype::f16:
      return f16_bits_to_f32(static_cast<const std::uint16_t*>(p)[e]);
    case dtype::bf16:
      return bf16_bits_to_f32(static_cast<const std::uint16_t*>(p)[e]);
    default:
      return static_cast<const float*>(p)[e];
  }
}

// A 16-bit table row widened to fp32, whole vectors first.
template <class IO>
void widen_row(df32 d, const std::uint16_t* from, float* to, std::int64_t n,
               float (*scalar)(std::uint16_t)) {
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(IO::load(d, from + i), d, to + i);
  for (; i < n; ++i) to[i] = scalar(from[i]);
}

// Whether a full-width row's two halves of cos (or sin) are the same bits (HF's
// cat(freqs, freqs)): the row then takes two angle vectors per step instead of four.
inline bool same_halves(const float* first, const float* second, std::int64_t half) {
  return std::memcmp(first, second, static_cast<std::size_t>(half) * sizeof(float)) == 0;
}

// The angle of frequency i at position `at`, and its cos and sin, one at a time (libm).
void computed_angle(const cpu_plan& p, std::int64_t at, std::int64_t i, float& c, float& sn) {
  if (p.precision == angle_precision::accurate) {
    const double a = static_cast<double>(at) * p.inv_freq[i];
    c = static_cast<float>(std::cos(a) * p.attention_scaling);
    sn = static_cast<float>(std::sin(a) * p.attention_scaling);
  } else {
    const double a = static_cast<float>(at) * p.inv_freq_f32[i];
    const auto scale = static_cast<float>(p.attention_scaling);
    c = round_to(p.x_type, static_cast<float>(std::cos(a)) * scale);
    sn = round_to(p.x_type, static_cast<float>(std::sin(a)) * scale);
  }
}

// The cos and sin rows of token s (position `pos`, or each frequency's own axis), a vector of
// fp64 angles at a time (sin_cos), rounded as computed_angle rounds them: accurate, the fp64
// product p inv_freq, its cos and sin times the attention scaling, rounded once to fp32;
// hf_compat, the fp32 product (exact in fp64, rounded to fp32), cos and sin rounded to fp32,
// times the fp32 scaling, rounded to the x dtype. Vectors with an angle past
// max_reduced_angle or a position past 2^31 take computed_angle; taken for every frequency,
// computed_angle (libm) doubled rope's time (docs/performance.md, "Performance decisions").
void computed_angles(const cpu_plan& p, std::int64_t s, std::int64_t pos, float* ca, float* sa) {
  const std::int64_t half = p.rotary_dim / 2;
  const bool accurate = p.precision == angle_precision::accurate;
  auto position_at = [&](std::int64_t i) {  // of frequency i
    return p.axis_of_frequency ? axis_position_of(p, i, s) : pos;
  };
  std::int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR  // one lane: libm is as fast
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // as many fp32 lanes, half a vector
  const auto n = static_cast<std::int64_t>(hn::Lanes(dd));
  const auto position_limit = hn::Set(dd, 0x1p31);
  const auto angle_limit = hn::Set(dd, max_reduced_angle);
  alignas(64) double at[HWY_MAX_BYTES / sizeof(double)];
  for (; i + n <= half; i += n) {
    auto position = hn::Set(dd, static_cast<double>(pos));
    if (p.axis_of_frequency != nullptr) {
      for (std::int64_t k = 0; k < n; ++k) at[k] = static_cast<double>(position_at(i + k));
      position = hn::Load(dd, at);
    }
    auto a = accurate ? hn::Mul(position, hn::LoadU(dd, p.inv_freq + i))
                      : hn::PromoteTo(dd, hn::Mul(hn::DemoteTo(df, position),
                                                  hn::LoadU(df, p.inv_freq_f32 + i)));
    if (HWY_UNLIKELY(!hn::AllTrue(dd, hn::And(hn::Lt(hn::Abs(position), position_limit),
                                              hn::Lt(hn::Abs(a), angle_limit))))) {
      for (std::int64_t k = i; k < i + n; ++k) computed_angle(p, position_at(k), k, ca[k], sa[k]);
      continue;
    }
    hn::Vec<decltype(dd)> sin_a, cos_a;
    sin_cos(dd, a, sin_a, cos_a);
    if (accurate) {
      const auto scale = hn::Set(dd, p.attention_scaling);
      hn::StoreU(hn::DemoteTo(df, hn::Mul(cos_a, scale)), df, ca + i);
      hn::StoreU(hn::DemoteTo(df, hn::Mul(sin_a, scale)), df, sa + i);
    } else {
      const auto scale = hn::Set(df, static_cast<float>(p.attention_scaling));
      hn::StoreU(hn::Mul(hn::DemoteTo(df, cos_a), scale), df, ca + i);
      hn::StoreU(hn::Mul(hn::DemoteTo(df, sin_a), scale), df, sa + i);
    }
  }
#endif
  for (; i < half; ++i) computed_angle(p, position_at(i), i, ca[i], sa[i]);
  if (accurate || p.x_type == dtype::f32) return;
  // hf_compat keeps its angles in the x dtype (the libm lanes are rounded already: rounding
  // again leaves them as they are)
  const df32 d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  for (float* row : {ca, sa}) {
    std::int64_t j = 0;
    for (; j + lanes <= half; j += lanes) {
      const vf32 v = hn::LoadU(d, row + j);
      hn::StoreU(p.x_type == dtype::f16 ? f16_io::round(d, v) : bf16_io::round(d, v), d, row + j);
    }
    for (; j < half; ++j) row[j] = round_to(p.x_type, row[j]);
  }
}

// The angles of token (b, s): straight out of an fp32 table or row when no conversion, plane
// gather or sign change is needed, else through `scratch` (4 * r/2 floats). Backward takes
// the transpose of the forward: ca, cb kept, (sa, sb) -> (-sb, -sa).
token_angles angles_for(const cpu_plan& p, std::int64_t b, std::int64_t s, float* scratch) {
  const df32 d;
  const std::int64_t half = p.rotary_dim / 2;
  float* ca = scratch;
  float* sa = scratch + half;
  float* cb = scratch + 2 * half;
  float* sb = scratch + 3 * half;
  bool full = false;  // cb, sb differ from ca, sa
  if (p.rows_cos != nullptr) {
    full = p.rows_width != half;
    const std::int64_t base = b * p.rows_b + s * p.rows_s;
    if (p.rows_type == dtype::f32 && p.axis_of_frequency == nullptr && !p.backward &&
        (!full || p.table_pairs == pairs::halves)) {
      const float* c = static_cast<const float*>(p.rows_cos) + base;
      const float* sn = static_cast<const float*>(p.rows_sin) + base;
      if (full && (!same_halves(c, c + half, half) || !same_halves(sn, sn + half, half))) {
        return token_angles{c, sn, c + half, sn + half, true};
      }
      return token_angles{c, sn, c, sn};
    }
    for (std::int64_t i = 0; i < half; ++i) {
      const std::int64_t plane = p.axis_of_frequency ? p.axis_of_frequency[i] : 0;
      const std::int64_t row = plane * p.rows_plane + base;
      if (!full) {
        ca[i] = value_at(p.rows_type, p.rows_cos, row + i);
        sa[i] = value_at(p.rows_type, p.rows_sin, row + i);
      } else {
        const bool halves = p.table_pairs == pairs::halves;
        const std::int64_t ja = halves ? i : 2 * i, jb = halves ? half + i : 2 * i + 1;
        ca[i] = value_at(p.rows_type, p.rows_cos, row + ja);
        sa[i] = value_at(p.rows_type, p.rows_sin, row + ja);
        cb[i] = value_at(p.rows_type, p.rows_cos, row + jb);
        sb[i] = value_at(p.rows_type, p.rows_sin, row + jb);
      }
    }
  } else if (p.cos != nullptr && p.axis_of_frequency != nullptr) {
    if (p.table_type == dtype::f32 && p.num_axes <= 4) {
      // the token's table row of each axis, then column i from the row of its axis
      const float* crow[4];
      const float* srow[4];
      for (std::int64_t ax = 0; ax < p.num_axes; ++ax) {
        const std::int64_t row = id_at(p, ax * p.ids_axis + s) * p.table_row;
        crow[ax] = static_cast<const float*>(p.cos) + row;
        srow[ax] = static_cast<const float*>(p.sin) + row;
      }
      // whole vectors of frequencies: the row of axis 0, then each other axis where it owns i
      const hn::RebindToSigned<df32> di;
      const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
      std::int64_t i = 0;
      for (; i + lanes <= half; i += lanes) {
        const auto axis = hn::LoadU(di, p.axis_of_frequency + i);
        vf32 c = hn::LoadU(d, crow[0] + i), sn = hn::LoadU(d, srow[0] + i);
        for (std::int64_t ax = 1; ax < p.num_axes; ++ax) {
          const auto mine = hn::RebindMask(d, hn::Eq(axis, hn::Set(di, static_cast<int>(ax))));
          c = hn::IfThenElse(mine, hn::LoadU(d, crow[ax] + i), c);
          sn = hn::IfThenElse(mine, hn::LoadU(d, srow[ax] + i), sn);
        }
        hn::StoreU(c, d, ca + i);
        hn::StoreU(sn, d, sa + i);
      }
      for (; i < half; ++i) {
        ca[i] = crow[p.axis_of_frequency[i]][i];
        sa[i] = srow[p.axis_of_frequency[i]][i];
      }
    } else {
      for (std::int64_t i = 0; i < half; ++i) {
        const std::int64_t e = axis_position_of(p, i, s) * p.table_row + i;
        ca[i] = value_at(p.table_type, p.cos, e);
        sa[i] = value_at(p.table_type, p.sin, e);
      }
    }
  } else if (p.cos != nullptr) {
    const std::int64_t row = position_of(p, b, s) * p.table_row;
    if (p.table_type == dtype::f32) {
      const float* c = static_cast<const float*>(p.cos) + row;
      const float* sn = static_cast<const float*>(p.sin) + row;
      if (!p.backward) return token_angles{c, sn, c, sn};
      std::memcpy(ca, c, static_cast<std::size_t>(half) * sizeof(float));
      std::memcpy(sa, sn, static_cast<std::size_t>(half) * sizeof(float));
    } else {
      const auto* c16 = static_cast<const std::uint16_t*>(p.cos) + row;
      const auto* s16 = static_cast<const std::uint16_t*>(p.sin) + row;
      if (p.table_type == dtype::f16) {
        widen_row<f16_io>(d, c16, ca, half, f16_bits_to_f32);
        widen_row<f16_io>(d, s16, sa, half, f16_bits_to_f32);
      } else {
        widen_row<bf16_io>(d, c16, ca, half, bf16_bits_to_f32);
        widen_row<bf16_io>(d, s16, sa, half, bf16_bits_to_f32);
      }
    }
  } else {
    computed_angles(p, s, p.axis_of_frequency ? 0 : position_of(p, b, s), ca, sa);
  }
  if (full && same_halves(ca, cb, half) && same_halves(sa, sb, half)) full = false;
  if (!full) {
    if (p.backward) {
      for (std::int64_t i = 0; i < half; ++i) sa[i] = -sa[i];
    }
    return token_angles{ca, sa, ca, sa};
  }
  if (p.backward) {
    for (std::int64_t i = 0; i < half; ++i) {
      const float first = sa[i];
      sa[i] = -sb[i];
      sb[i] = -first;
    }
  }
  return token_angles{ca, sa, cb, sb, true};
}

// Per-thread scratch: 4 * r/2 angles, then two rows of head_dim fp32.
float* thread_scratch(const cpu_plan& p) {
  thread_local std::vector<float> scratch;
  return line_aligned(scratch, static_cast<std::size_t>(2 * p.rotary_dim + 2 * p.head_dim + 8));
}

// Per-thread rows (2 r floats) for a token's angles rearranged: in block order for bf16 halves
// (QK RMSNorm's weights folded in), or expanded for adjacent pairs in output order.
float* angle_rows_scratch(const cpu_plan& p) {
  thread_local std::vector<float> rows;
  return line_aligned(rows, static_cast<std::size_t>(2 * p.rotary_dim));
}

// In place with a changed layout (split-half and its backward), a row is read whole before it
// is written: x is then the row's copy in `row_copy`.
template <pairs PIn, pairs POut, class T>
HWY_INLINE const T* readable_row(const T* x, const T* y, T* row_copy, std::int64_t rotary) {
  if constexpr (PIn != POut) {
    if (x == y) {
      std::memcpy(row_copy, x, static_cast<std::size_t>(rotary) * sizeof(T));
      return row_copy;
    }
  }
  return x;
}

// The angles of a row's NV vectors of pairs, as a row of whole vectors takes them: ca(v),
// sa(v) for the first element of each pair and, when `full`, cb(v), sb(v) for the second.
// Read from memory at each use (memory_angles), or held in registers across a block's heads
// (held_angles, folded_angles).
template <bool Full>
struct memory_angles {
  static constexpr bool full = Full;
  df32 d;
  token_angles a;
  std::int64_t n;
  HWY_INLINE vf32 ca(int v) const { return in_register(hn::LoadU(d, a.ca + v * n)); }
  HWY_INLINE vf32 sa(int v) const { return in_register(hn::LoadU(d, a.sa + v * n)); }
  HWY_INLINE vf32 cb(int v) const { return in_register(hn::LoadU(d, a.cb + v * n)); }
  HWY_INLINE vf32 sb(int v) const { return in_register(hn::LoadU(d, a.sb + v * n)); }
};

// A row of NV whole vectors of pairs, each transformed by `pre(v, second, i)` (no_pre, or QK
// RMSNorm's x r: scaled_by), rotated through `f` and stored. The whole row is loaded
// before any of it is stored when it is in place with a changed layout (so that no copy of the
// row is needed) and when x is 16-bit, so that a streamed row has no loads between its stores;
// for f32 the whole row first measured slower, and an f32 row loads each vector of pairs as it
// is rotated (docs/performance.md, "Performance decisions").
template <class IO, pairs PIn, pairs POut, int NV, class Angles, class Pre>
HWY_INLINE void rotate_row_vectors(df32 d, const typename IO::storage* x, typename IO::storage* y,
                                   const Angles& f, std::int64_t half, Pre pre) {
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  auto rotate = [&](int v, vf32 xa, vf32 xb) TILEROPE_INLINE_LAMBDA {
    const vf32 first = pre(in_register(xa), false, v * n);
    const vf32 second = pre(in_register(xb), true, v * n);
    const vf32 ca = f.ca(v), sa = f.sa(v);
    const vf32 cb = Angles::full ? f.cb(v) : ca, sb = Angles::full ? f.sb(v) : sa;
    const vf32 ya = hn::MulSub(first, ca, hn::Mul(second, sa));
    const vf32 yb = hn::MulAdd(second, cb, hn::Mul(first, sb));
    store_pair<IO, POut>(d, ya, yb, y, v * n, half);
  };
  if ((PIn != POut && x == y) || sizeof(typename IO::storage) == 2) {  // the whole row first
    vf32 xa[NV], xb[NV];
    for (int v = 0; v < NV; ++v) load_pair<IO, PIn>(d, x, v * n, half, xa[v], xb[v]);
    for (int v = 0; v < NV; ++v) rotate(v, xa[v], xb[v]);
  } else {
    for (int v = 0; v < NV; ++v) {
      vf32 xa, xb;
      load_pair<IO, PIn>(d, x, v * n, half, xa, xb);
      rotate(v, xa, xb);
    }
  }
}

// A row of NV whole vectors of pairs rotated in place with its layout changed, half of it held
// in registers where the whole row would not fit (NV = 8 with fewer than 16 lanes). Pairs in,
// halves out: vector v reads y[2vn, 2(v+1)n) and stores y[vn, (v+1)n) and y[r/2 + vn, ...);
// the first stores reach only vectors already read, the second only the row's later half, read
// before any store. Halves in, pairs out: vector v stores y[2vn, 2(v+1)n), reaching the first
// half (read before any store) or second-half vectors up to v, already read. Without it the
// row was copied first (readable_row; docs/performance.md, "Performance decisions").
template <class IO, pairs PIn, pairs POut, int NV, class Angles>
HWY_INLINE void rotate_row_in_place_half_held(df32 d, typename IO::storage* y, const Angles& f,
                                              std::int64_t half) {
  static_assert(PIn != POut && NV % 2 == 0);
  constexpr int H = PIn == pairs::adjacent ? NV / 2 : NV;  // vectors held
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  vf32 ha[H], hb[PIn == pairs::adjacent ? H : 1];
  for (int v = 0; v < H; ++v) {
    if constexpr (PIn == pairs::adjacent) {
      load_pair<IO, PIn>(d, y, (NV / 2 + v) * n, half, ha[v], hb[v]);  // the later half
    } else {
      ha[v] = IO::load(d, y + v * n);  // the first half
    }
  }
  HWY_UNROLL(8)  // not unrolled, GCC kept the held vectors on the stack (objdump)
  for (int v = 0; v < NV; ++v) {
    vf32 first, second;
    if constexpr (PIn == pairs::adjacent) {
      if (v < NV / 2) {
        load_pair<IO, PIn>(d, y, v * n, half, first, second);
      } else {
        first = ha[v - NV / 2];
        second = hb[v - NV / 2];
      }
    } else {
      first = ha[v];
      second = IO::load(d, y + half + v * n);
    }
    first = in_register(first);
    second = in_register(second);
    const vf32 ca = f.ca(v), sa = f.sa(v);
    const vf32 cb = Angles::full ? f.cb(v) : ca, sb = Angles::full ? f.sb(v) : sa;
    const vf32 ya = hn::MulSub(first, ca, hn::Mul(second, sa));
    const vf32 yb = hn::MulAdd(second, cb, hn::Mul(first, sb));
    store_pair<IO, POut>(d, ya, yb, y, v * n, half);
  }
}

// bf16 pairs in (the interleaved layout's forward) does not take it: its eight held vectors
// were kept on the stack (objdump), and it measured slower in memory; with AVX2 and SSE4 it
// takes rotate_row_bf16_pairs_in_place.
template <class IO, pairs PIn>
constexpr bool takes_half_held() {
  return !(std::is_same_v<typename IO::plain, bf16_io> && PIn == pairs::adjacent);
}

// How many whole vectors of pairs a row has, when rotate_row_vectors takes it (else 0).
inline int held_vectors(std::int64_t half, std::int64_t lanes) {
  if (half % lanes != 0) return 0;
  const std::int64_t nv = half / lanes;
  return nv == 1 || nv == 2 || nv == 4 ? static_cast<int>(nv) : 0;
}

}  // namespace tilerope::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TILEROPE_CPU_ANGLES_INL_H_
