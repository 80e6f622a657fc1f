// libFuzzer target: the API boundary. The input picks a call, rope_apply (forward or
// backward), qk_norm_rope_apply, qk_norm_rope_backward or a tile-layer kernel, and everything
// it takes: shapes, strides (padded, zero, negative, packed qkv), dtypes, positions (ids with
// any values, offsets up to INT64_MAX, axes), angles (tables of any size, theta of any double,
// token rows, frequencies), rotary_dim, sections, weights, eps, aliasing between inputs and
// outputs, output layout and thread count. Each call must either
//   - return, with outputs equal to the fp64 golden's where the golden applies (rope_apply,
//     with a table or accurate computed angles), or
//   - throw tilerope::error with every byte of every buffer as it was;
// and never write outside its buffers (guard bytes around each one), crash or trip a sanitizer.

#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "golden/golden.h"
#include "tilerope/error.h"
#include "tilerope/qk_norm_rope.h"
#include "tilerope/rope.h"
#include "tilerope/tile.h"

namespace {

using namespace tilerope;

constexpr std::size_t guard = 64;
constexpr unsigned char guard_byte = 0xCD;
constexpr std::size_t slack = 256;  // bytes past q's and k's inputs, for views shifted into them

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_api finding: %s\n", what);
  std::abort();
}

// A buffer with guard bytes on both sides.
struct arena {
  std::vector<unsigned char> bytes;
  explicit arena(std::size_t n) : bytes(n + 2 * guard, guard_byte) {}
  unsigned char* data() { return bytes.data() + guard; }
  std::size_t size() const { return bytes.size() - 2 * guard; }
  bool guards_intact() const {
    for (std::size_t i = 0; i < guard; ++i) {
      if (bytes[i] != guard_byte || bytes[bytes.size() - 1 - i] != guard_byte) return false;
    }
    return true;
  }
};

struct call_state {
  std::vector<arena> arenas;  // reserved up front: views point into them
  call_state() { arenas.reserve(16); }
  arena& make(std::size_t n) { return arenas.emplace_back(n); }
};

dtype float_type(FuzzedDataProvider& in) {
  // mostly the float dtypes, sometimes an integer one (rejected)
  const dtype all[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f32, dtype::bf16, dtype::i32};
  return all[in.ConsumeIntegralInRange<int>(0, 5)];
}

// Small values: the structure is what is fuzzed; |x| <= 4 keeps the golden's tolerance exact.
void fill(FuzzedDataProvider& in, void* data, dtype t, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = in.ConsumeIntegralInRange<int>(-128, 127) / 32.0;
    if (t == dtype::i32) {
      static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(v * 8);
    } else if (t == dtype::i64) {
      static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(v * 8);
    } else {
      store_from_f64(data, t, i, v);
    }
  }
}

double any_double(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      return std::numeric_limits<double>::quiet_NaN();
    case 1:
      return in.ConsumeBool() ? INFINITY : -INFINITY;
    case 2:
      return in.ConsumeFloatingPoint<double>();
    case 3:
      return -in.ConsumeFloatingPointInRange<double>(0, 1e6);
    default:
      return in.ConsumeFloatingPointInRange<double>(1.0, 1e7);
  }
}

std::int64_t any_position(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      return in.ConsumeIntegral<std::int64_t>();
    case 1:
      return std::numeric_limits<std::int64_t>::max() - in.ConsumeIntegralInRange<int>(0, 8);
    case 2:
      return -in.ConsumeIntegralInRange<std::int64_t>(1, 1 << 20);
    default:
      return in.ConsumeIntegralInRange<std::int64_t>(0, 40);
  }
}

// A view of shape `shape` into `a` with strides chosen by `mode`: row-major, padded, one zero
// stride, or the first dim reversed (data at its last row, negative stride).
tensor_view strided_view(FuzzedDataProvider& in, arena& a, dtype t, std::vector<std::int64_t> shape,
                         int mode, std::int64_t pad) {
  const int r = static_cast<int>(shape.size());
  std::vector<std::int64_t> strides(r);
  std::int64_t s = 1;
  for (int i = r - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1) + (i == r - 1 ? pad : 0);
  }
  unsigned char* base = a.data();
  if (mode == 2 && r > 1) strides[in.ConsumeIntegralInRange<int>(0, r - 2)] = 0;
  if (mode == 3 && shape[0] > 1) {
    base += (shape[0] - 1) * strides[0] * static_cast<std::int64_t>(size_of(t));
    strides[0] = -strides[0];
  }
  if (mode == 4) strides[r - 1] = in.ConsumeIntegralInRange<std::int64_t>(-2, 3);  // last dim
  return tensor_view(base, t, shape, strides);
}

std::int64_t bytes_for(const std::vector<std::int64_t>& shape, std::int64_t pad, dtype t) {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    n *= std::max<std::int64_t>(shape[i], 1) + (i + 1 == shape.size() ? pad : 0);
  }
  return n * static_cast<std::int64_t>(size_of(t));
}

struct golden_inputs {
  bool applies = false;
  rope_style style = rope_style::neox;
  bool backward = false;
  std::int64_t rotary_dim = 0;
  std::vector<std::int64_t> position;  // per token (b * S + s)
  std::optional<tensor_view> table_cos, table_sin;
  double theta = 0;
};

// Element (b, s, h, d) of a rank-3 or rank-4 view, read from `snapshot` (a copy of the arena
// holding it) instead of the live memory.
double element(const tensor_view& v, const arena& a, const std::vector<unsigned char>& snapshot,
               std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  const std::int64_t e =
      v.rank == 4 ? b * v.strides[0] + s * v.strides[1] + h * v.strides[2] + d * v.strides[3]
                  : s * v.strides[0] + h * v.strides[1] + d * v.strides[2];
  const auto at = static_cast<const unsigned char*>(v.data) - (a.bytes.data() + guard) +
                  e * static_cast<std::int64_t>(size_of(v.type));
  return load_as_f64(snapshot.data() + guard + at, v.type, 0);
}

// Positions where an fp64 product p * inv_freq is exact to 2^-29 rad: the golden's own limit.
bool near_positions(const std::vector<std::int64_t>& p) {
  for (std::int64_t v : p) {
    if (v < 0 || v > (1 << 24)) return false;
  }
  return true;
}

// Compares y (live) with the golden rotation of x (from the snapshot).
void check_golden(const golden_inputs& g, const tensor_view& x, const arena& xa,
                  const std::vector<unsigned char>& xsnap, const tensor_view& y, const arena& ya) {
  const bool r4 = x.rank == 4;
  const std::int64_t B = r4 ? x.shape[0] : 1, S = r4 ? x.shape[1] : x.shape[0];
  const std::int64_t H = x.shape[x.rank - 2], D = x.shape[x.rank - 1], R = g.rotary_dim;
  const std::vector<double> inv =
      g.table_cos ? std::vector<double>{} : golden::inv_freq(R, g.theta);
  const golden::tolerance tol = golden::tolerance_for(y.type);
  const golden::variant v =
      g.style == rope_style::neox ? golden::variant::neox : golden::variant::gptj;
  std::vector<double> row(static_cast<std::size_t>(D)), want(static_cast<std::size_t>(D));
  std::vector<double> c(static_cast<std::size_t>(R)), sn(static_cast<std::size_t>(R));
  const std::vector<unsigned char> ylive(ya.bytes);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t p = g.position[static_cast<std::size_t>(b * S + s)];
      for (std::int64_t i = 0; i < R / 2; ++i) {
        double cv, sv;
        if (g.table_cos) {
          const auto at = static_cast<std::size_t>(p * g.table_cos->strides[0] + i);
          cv = load_as_f64(g.table_cos->data, g.table_cos->type, at);
          sv = load_as_f64(g.table_sin->data, g.table_sin->type, at);
        } else {
          const double angle = static_cast<double>(p) * inv[static_cast<std::size_t>(i)];
          cv = std::cos(angle), sv = std::sin(angle);
        }
        if (g.backward) sv = -sv;
        const std::size_t first = g.style == rope_style::neox ? i : 2 * i;
        const std::size_t second = g.style == rope_style::neox ? i + R / 2 : 2 * i + 1;
        c[first] = c[second] = cv;
        sn[first] = sn[second] = sv;
      }
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t d = 0; d < D; ++d) row[d] = element(x, xa, xsnap, b, s, h, d);
        golden::rotate_row(v, D, R, c.data(), sn.data(), row.data(), want.data());
        for (std::int64_t d = 0; d < D; ++d) {
          const double got = element(y, ya, ylive, b, s, h, d);
          const double w = golden::round_to(y.type, want[d]);
          if (!(std::fabs(got - w) <= tol.atol + tol.rtol * std::fabs(w))) {
            std::fprintf(stderr, "b %lld s %lld h %lld d %lld: got %.9g, golden %.9g\n",
                         static_cast<long long>(b), static_cast<long long>(s),
                         static_cast<long long>(h), static_cast<long long>(d), got, w);
            finding("an output differs from the golden");
          }
        }
      }
    }
  }
}

// A tile-layer kernel of fuzzed ops over small tensors.
void tile_kernel(FuzzedDataProvider& in) {
  namespace t = tilerope::tile;
  const dtype dt = float_type(in);
  const std::int64_t rows = in.ConsumeIntegralInRange<std::int64_t>(0, 9);
  const std::int64_t cols = 8 * in.ConsumeIntegralInRange<std::int64_t>(0, 9);
  std::vector<unsigned char> a_mem(
      static_cast<std::size_t>(std::max<std::int64_t>(rows * cols, 1)) * 8),
      o_mem(a_mem.size());
  fill(in, a_mem.data(), dt == dtype::i32 ? dtype::i32 : dt, static_cast<std::size_t>(rows * cols));
  try {
    t::tensor a("a", tensor_view::contiguous(a_mem.data(), dt, {rows, cols}));
    t::tensor o("o", tensor_view::contiguous(o_mem.data(), dt, {rows, cols}));
    const std::int64_t tr = in.ConsumeIntegralInRange<std::int64_t>(-1, 9);
    const std::int64_t tc = in.ConsumeIntegralInRange<std::int64_t>(-1, 40);
    const int ops = in.ConsumeIntegralInRange<int>(0, 6);
    std::vector<int> op_codes;
    for (int i = 0; i < ops; ++i) op_codes.push_back(in.ConsumeIntegralInRange<int>(0, 11));
    const std::int64_t vr = in.ConsumeIntegralInRange<std::int64_t>(-1, 10);
    const std::int64_t off = in.ConsumeIntegralInRange<std::int64_t>(-1, 10);
    t::kernel_options options;
    options.ub_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 1 << 18);
    t::run_kernel(
        "fuzz", {a}, {o},
        [&] {
          t::set_vec_tile_shapes({tr, tc});
          t::value v = t::view(a, {rows, cols}, {0, 0});
          for (int code : op_codes) {
            switch (code) {
              case 0:
                v = t::neg(v);
                break;
              case 1:
                v = t::add(v, v);
                break;
              case 2:
                v = t::mul(v, 0.5);
                break;
              case 3:
                v = t::view(v, {vr, v.shape().size() > 1 ? v.shape()[1] : 1}, {off, 0});
                break;
              case 4:
                v = t::concat({v, v}, static_cast<int>(off % 3) - 1);
                break;
              case 5:
                v = t::deinterleave(v).first;
                break;
              case 6:
                v = t::cast(v, dtype::f32);
                break;
              case 7:
                v = t::sum(v, static_cast<int>(off % 2), true);
                break;
              case 8:
                v = t::expand_clone(v, {rows, cols});
                break;
              case 9:
                v = t::reshape(v, {cols, rows});
                break;
              case 10:
                v = t::rsqrt(v);
                break;
              default:
                v = t::gathermask(v, static_cast<int>(off));
                break;
            }
          }
          t::assemble(v, {0, 0}, o);
        },
        options);
  } catch (const error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const int family = in.ConsumeIntegralInRange<int>(0, 4);  // rope, rope bwd, qk fwd, qk bwd, tile
  if (family == 4) {
    tile_kernel(in);
    return 0;
  }
  call_state st;
  const int style_code = in.ConsumeIntegralInRange<int>(0, 9);
  const auto style = static_cast<rope_style>(style_code == 9 ? 7 : style_code % 2);
  const dtype xt = float_type(in);
  const bool r4 = in.ConsumeBool();
  const std::int64_t B = in.ConsumeIntegralInRange<std::int64_t>(0, 3);
  const std::int64_t S = in.ConsumeIntegralInRange<std::int64_t>(0, 6);
  const std::int64_t Hq = in.ConsumeIntegralInRange<std::int64_t>(0, 4);
  const std::int64_t Hk = in.ConsumeIntegralInRange<std::int64_t>(-1, 3);  // -1: no k
  const std::int64_t D = in.ConsumeIntegralInRange<std::int64_t>(0, 40);
  const std::int64_t Dk = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? D + 2 : D;
  const int stride_mode = in.ConsumeIntegralInRange<int>(0, 6);  // 5, 6: packed qkv
  const std::int64_t pad = in.ConsumeIntegralInRange<std::int64_t>(0, 3);
  auto shape_of = [&](std::int64_t H, std::int64_t d) {
    return r4 ? std::vector<std::int64_t>{B, S, H, d} : std::vector<std::int64_t>{S, H, d};
  };

  rope_tensors x;
  arena* q_arena = nullptr;
  arena* k_arena = nullptr;
  try {
    if (stride_mode >= 5 && Hk >= 0) {
      // packed qkv [.., Hq + 2 Hk, D]: q and k cut from one buffer
      const auto whole = shape_of(Hq + 2 * Hk, D);
      arena& a = st.make(static_cast<std::size_t>(bytes_for(whole, 0, xt)) + slack);
      fill(in, a.data(), xt, a.size() / size_of(xt));
      const tensor_view all = tensor_view::contiguous(a.data(), xt, whole);
      const std::vector<std::int64_t> qs(all.strides.begin(), all.strides.begin() + all.rank);
      x.q = tensor_view(a.data(), xt, shape_of(Hq, D), qs);
      x.k = tensor_view(a.data() + Hq * D * static_cast<std::int64_t>(size_of(xt)), xt,
                        shape_of(Hk, D), qs);
      q_arena = k_arena = &a;
    } else {
      const auto qshape = shape_of(Hq, D);
      arena& qa = st.make(static_cast<std::size_t>(bytes_for(qshape, pad, xt)) + slack);
      fill(in, qa.data(), xt, qa.size() / size_of(xt));
      x.q = strided_view(in, qa, xt, qshape, stride_mode, pad);
      q_arena = &qa;
      if (Hk >= 0) {
        const auto kshape = shape_of(Hk, Dk);
        const dtype kt = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? dtype::f16 : xt;
        arena& ka = st.make(static_cast<std::size_t>(bytes_for(kshape, pad, kt)) + slack);
        fill(in, ka.data(), kt, ka.size() / size_of(kt));
        x.k = strided_view(in, ka, kt, kshape, stride_mode == 4 ? 0 : stride_mode, pad);
        k_arena = &ka;
      }
    }
  } catch (const error&) {
    return 0;  // a view the constructors refuse
  }

  // outputs: in place, an exact alias, separate buffers, or overlapping ones
  const int out_mode = in.ConsumeIntegralInRange<int>(0, 5);
  arena* q_out_arena = q_arena;
  arena* k_out_arena = k_arena;
  if (out_mode == 1) {
    x.q_out = x.q;
    if (x.k) x.k_out = x.k;
  } else if (out_mode >= 2) {
    try {
      const auto es = static_cast<std::int64_t>(size_of(xt));
      const std::int64_t q_elems = (r4 ? B * S : S) * Hq * D;
      arena& oa =
          st.make(static_cast<std::size_t>(
                      (q_elems + (r4 ? B * S : S) * std::max<std::int64_t>(Hk, 0) * Dk) * 4) +
                  slack);
      std::memset(oa.data(), 0x77, oa.size());
      x.q_out = tensor_view::contiguous(oa.data(), xt, shape_of(Hq, D));
      q_out_arena = &oa;
      if (x.k) {
        // 2: after q_out; 4: somewhere over q_out
        const std::int64_t k_at =
            out_mode == 4 ? in.ConsumeIntegralInRange<std::int64_t>(0, 40) : q_elems;
        x.k_out = tensor_view::contiguous(oa.data() + k_at * es, x.k->type, shape_of(Hk, Dk));
        k_out_arena = &oa;
      }
      if (out_mode == 3) {  // q's output shifted against its input, in q's buffer
        const std::int64_t shift = in.ConsumeIntegralInRange<std::int64_t>(0, slack / 8);
        x.q_out = tensor_view::contiguous(q_arena->data() + shift * es, xt, shape_of(Hq, D));
        q_out_arena = q_arena;
      }
      const std::int64_t q_bytes = q_elems * es;
      if (out_mode == 5 && k_arena && q_bytes <= static_cast<std::int64_t>(k_arena->size())) {
        // q's output over k's input, where k's buffer can hold it
        x.q_out = tensor_view::contiguous(k_arena->data(), xt, shape_of(Hq, D));
        q_out_arena = k_arena;
      }
    } catch (const error&) {
      return 0;
    }
  }

  // positions
  golden_inputs g;
  const std::int64_t tokens = (r4 ? B : 1) * S;
  rope_positions positions;
  const int pos_mode = in.ConsumeIntegralInRange<int>(0, 5);
  std::vector<std::int64_t> ids64;
  std::vector<std::int32_t> ids32;
  std::vector<int> axis_map;
  try {
    if (pos_mode == 0) {
      const std::int64_t start = any_position(in);
      positions = rope_positions::from_offset(start);
      for (std::int64_t t = 0; t < tokens; ++t) {  // wrapping: only read after a valid call
        g.position.push_back(static_cast<std::int64_t>(
            static_cast<std::uint64_t>(start) +
            static_cast<std::uint64_t>(t % std::max<std::int64_t>(S, 1))));
      }
    } else if (pos_mode <= 2) {
      const bool per_batch = r4 && in.ConsumeBool();
      const std::int64_t n = per_batch ? tokens : S;
      const std::int64_t extra = in.ConsumeIntegralInRange<int>(0, 20) == 0 ? 1 : 0;
      for (std::int64_t i = 0; i < n + extra; ++i) ids64.push_back(any_position(in));
      std::vector<std::int64_t> shape = per_batch ? std::vector<std::int64_t>{B, S + extra}
                                                  : std::vector<std::int64_t>{S + extra};
      if (pos_mode == 1) {
        positions =
            rope_positions::from_ids(tensor_view::contiguous(ids64.data(), dtype::i64, shape));
      } else {
        for (auto v : ids64) ids32.push_back(static_cast<std::int32_t>(v));
        positions =
            rope_positions::from_ids(tensor_view::contiguous(ids32.data(), dtype::i32, shape));
      }
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::size_t at =
            static_cast<std::size_t>(per_batch ? t : t % std::max<std::int64_t>(S, 1));
        g.position.push_back(at < ids64.size() ? (pos_mode == 1 ? ids64[at] : ids32[at]) : 0);
      }
    } else if (pos_mode == 3) {
      const int axes = in.ConsumeIntegralInRange<int>(1, 3);
      for (std::int64_t i = 0; i < axes * S; ++i) ids64.push_back(any_position(in));
      const std::array<int, 3> section = {in.ConsumeIntegralInRange<int>(-1, 12),
                                          in.ConsumeIntegralInRange<int>(0, 12),
                                          in.ConsumeIntegralInRange<int>(0, 12)};
      axis_map = mrope_axis_map(
          section, in.ConsumeBool() ? mrope_layout::chunked : mrope_layout::interleaved);
      positions = rope_positions::from_axes(
          tensor_view::contiguous(ids64.data(), dtype::i64, {axes, S}), axis_map);
    } else {
      positions = rope_positions::none();
    }
  } catch (const error&) {
    return 0;
  }

  // angles
  rope_angles angles;
  const int angle_mode = in.ConsumeIntegralInRange<int>(0, 3);
  const std::int64_t rotary = in.ConsumeIntegralInRange<std::int64_t>(0, D + 3);
  const std::int64_t R = rotary == 0 ? D : rotary;
  try {
    if (angle_mode == 0) {
      const std::int64_t max_pos = in.ConsumeIntegralInRange<std::int64_t>(0, 48);
      const std::int64_t width = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? R : R / 2;
      const dtype tt = float_type(in);
      arena& ca = st.make(static_cast<std::size_t>(std::max<std::int64_t>(max_pos * width, 1)) * 8);
      arena& sa = st.make(ca.size());
      fill(in, ca.data(), tt, static_cast<std::size_t>(max_pos * width));
      fill(in, sa.data(), tt, static_cast<std::size_t>(max_pos * width));
      const tensor_view c = tensor_view::contiguous(ca.data(), tt, {max_pos, width});
      const tensor_view s = tensor_view::contiguous(sa.data(), tt, {max_pos, width});
      angles = rope_angles::from_table(c, s);
      g.table_cos = c, g.table_sin = s;
    } else if (angle_mode == 1) {
      g.theta = in.ConsumeBool() ? in.ConsumeFloatingPointInRange<double>(2, 1e6) : any_double(in);
      angles = rope_angles::from_theta(
          g.theta, in.ConsumeBool() ? angle_precision::accurate : angle_precision::hf_compat);
      if (angles.precision != angle_precision::accurate) g.theta = -1;
    } else if (angle_mode == 2) {
      const std::int64_t width = in.ConsumeBool() ? R : R / 2;
      const int planes = axis_map.empty() ? 0 : 3;
      std::vector<std::int64_t> shape =
          r4 ? std::vector<std::int64_t>{B, S, width} : std::vector<std::int64_t>{S, width};
      if (planes) shape.insert(shape.begin(), planes);
      const dtype tt = float_type(in);
      arena& ca = st.make(static_cast<std::size_t>(bytes_for(shape, 0, dtype::f32)));
      arena& sa = st.make(ca.size());
      fill(in, ca.data(), tt, ca.size() / 4);
      fill(in, sa.data(), tt, sa.size() / 4);
      angles =
          rope_angles::from_token_rows(tensor_view::contiguous(ca.data(), tt, shape),
                                       tensor_view::contiguous(sa.data(), tt, shape), axis_map);
    } else {
      std::vector<double> inv(static_cast<std::size_t>(in.ConsumeIntegralInRange<int>(0, 24)));
      for (double& v : inv)
        v = in.ConsumeBool() ? any_double(in) : 1.0 / (1 + in.ConsumeIntegral<std::uint8_t>());
      angles = rope_angles::from_inv_freq(inv);
    }
  } catch (const error&) {
    return 0;
  }

  rope_options options;
  options.rotary_dim = static_cast<int>(rotary);
  options.backward = family == 1;
  const int layout_code = in.ConsumeIntegralInRange<int>(0, 8);
  options.output_layout = static_cast<rope_output_layout>(layout_code == 8 ? 5 : layout_code % 2);
  options.num_threads = in.ConsumeIntegralInRange<int>(-1, 3);

  // QK RMSNorm: weights [D] (sometimes of another length or dtype), eps of any double
  qk_norm norm;
  qk_norm_rope_grad_tensors grads;
  if (family >= 2) {
    const std::int64_t wd = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? D + 1 : D;
    const dtype wt = in.ConsumeIntegralInRange<int>(0, 9) == 0 ? dtype::f32 : xt;
    arena& wa = st.make(static_cast<std::size_t>(std::max<std::int64_t>(wd, 1)) * 2 * 4);
    fill(in, wa.data(), wt, static_cast<std::size_t>(2 * wd));
    try {
      norm.q_weight = tensor_view::contiguous(wa.data(), wt, {wd});
      if (x.k && in.ConsumeIntegralInRange<int>(0, 15) != 0) {
        norm.k_weight = tensor_view::contiguous(
            wa.data() + wd * static_cast<std::int64_t>(size_of(wt)), wt, {wd});
      }
    } catch (const error&) {
      return 0;
    }
    norm.eps = in.ConsumeBool() ? 1e-6 : any_double(in);
    const int rounding = in.ConsumeIntegralInRange<int>(0, 4);
    norm.rounding = static_cast<qk_norm_rounding>(rounding == 4 ? 9 : rounding % 2);
    if (family == 3) {
      arena& ga = st.make(static_cast<std::size_t>(std::max<std::int64_t>(D, 1)) * 2 * 4);
      grads.q = x.q;
      grads.k = x.k;
      grads.dq_out = x.q;
      grads.dk_out = x.k;
      grads.dq = x.q_out;
      grads.dk = x.k_out;
      grads.dq_weight = tensor_view::contiguous(ga.data(), dtype::f32, {D});
      if (x.k) grads.dk_weight = tensor_view::contiguous(ga.data() + D * 4, dtype::f32, {D});
    }
  }

  if (std::getenv("TILEROPE_FUZZ_VERBOSE")) {  // describes the call, to read a finding
    auto show = [&](const char* name, const tensor_view& v) {
      long arena_at = -1, offset = 0;
      for (std::size_t i = 0; i < st.arenas.size(); ++i) {
        const auto* b = st.arenas[i].bytes.data() + guard;
        const auto* p = static_cast<const unsigned char*>(v.data);
        if (p >= b && p <= b + st.arenas[i].size()) arena_at = static_cast<long>(i), offset = p - b;
      }
      std::fprintf(stderr, "%s %s %s strides %s in arena %ld (+%ld of %zu bytes)\n", name,
                   std::string(to_string(v.type)).c_str(), v.shape_string().c_str(),
                   v.strides_string().c_str(), arena_at, offset,
                   arena_at >= 0 ? st.arenas[static_cast<std::size_t>(arena_at)].size() : 0);
    };
    std::fprintf(stderr, "family %d style %d rotary %d backward %d layout %d threads %d\n", family,
                 static_cast<int>(style), options.rotary_dim, options.backward,
                 static_cast<int>(options.output_layout), options.num_threads);
    show("q", x.q);
    if (x.k) show("k", *x.k);
    if (x.q_out) show("q_out", *x.q_out);
    if (x.k_out) show("k_out", *x.k_out);
  }
  std::vector<std::vector<unsigned char>> before;
  for (const arena& a : st.arenas) before.push_back(a.bytes);
  bool ok = true;
  try {
    if (family <= 1) {
      if (positions.from == rope_positions::source::none) {
        rope_apply(style, x, angles, options);
      } else {
        rope_apply(style, x, positions, angles, options);
      }
    } else if (family == 2) {
      qk_norm_rope_apply(style, x, positions, angles, norm, options);
    } else {
      qk_norm_rope_backward(style, grads, positions, angles, norm, options);
    }
  } catch (const error&) {
    ok = false;
  }
  for (const arena& a : st.arenas) {
    if (!a.guards_intact()) finding("a write outside a buffer (guard bytes changed)");
  }
  if (!ok) {
    for (std::size_t i = 0; i < st.arenas.size(); ++i) {
      if (st.arenas[i].bytes != before[i]) finding("a buffer changed by a call that threw");
    }
    return 0;
  }
  // the golden, where it applies: rope_apply with positions and a table or accurate angles
  const bool golden_applies =
      family <= 1 && (pos_mode <= 2) && options.output_layout == rope_output_layout::as_input &&
      (angle_mode == 0 || (angle_mode == 1 && g.theta > 0 && near_positions(g.position)));
  if (golden_applies) {
    g.style = style;
    g.backward = options.backward;
    g.rotary_dim = R;
    const std::size_t qi = static_cast<std::size_t>(q_arena - st.arenas.data());
    const tensor_view q_out = x.q_out ? *x.q_out : x.q;
    check_golden(g, x.q, *q_arena, before[qi], q_out, *q_out_arena);
    if (x.k) {
      const std::size_t ki = static_cast<std::size_t>(k_arena - st.arenas.data());
      const tensor_view k_out = x.k_out ? *x.k_out : *x.k;
      check_golden(g, *x.k, *k_arena, before[ki], k_out, *k_out_arena);
    }
  }
  return 0;
}
