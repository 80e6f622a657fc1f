// The benchmark. Every figure of merit is a ratio measured in one run:
//  - fraction = kernel GB/s / ceiling GB/s, where the ceiling is the same bytes moved by the
//    plainest loop with the same access pattern (in place: read-modify-write of one buffer;
//    out of place: a copy, normal or streaming stores, whichever is faster here);
//  - speedup = unfused baseline time / kernel time, the baseline composing the same math the
//    way PyTorch eager does (rotate_half into a temporary, two multiplies, an add, full-size
//    cos/sin tensors), each a separate pass over whole tensors.
// Bytes moved (the minimum model): read x and write x' (2 * elements * sizeof(x)), plus the
// cos/sin rows read once per token, plus the positions.

#include "bench.h"

#include <emmintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <type_traits>
#include <vector>

#include "reference/reference.h"
#include "tilerope/tilerope.h"

namespace tilerope::bench {

namespace {

using clock_type = std::chrono::steady_clock;

// An aligned, page-touched buffer.
struct buffer {
  std::unique_ptr<unsigned char, void (*)(void*)> data{nullptr, std::free};
  std::size_t bytes = 0;
  explicit buffer(std::size_t n) : bytes(n) {
    data.reset(static_cast<unsigned char*>(std::aligned_alloc(64, (n + 63) / 64 * 64)));
    std::memset(data.get(), 0, n);
  }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data.get());
  }
};

constexpr std::size_t flush_bytes = 256u << 20;  // 8x a 32 MiB last-level cache

// Evicts the caches between timed runs (untimed).
void flush_caches() {
  static buffer junk(flush_bytes);
  auto* p = junk.as<std::uint64_t>();
  const std::size_t n = junk.bytes / 8;
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; i += 8) p[i] += 1;
}

struct timing {
  double median = 0, min = 0;
};

// Median and min of `repeats` runs after two warm-ups; caches flushed before each unless the
// problem is meant to be cache resident (decode).
timing time_it(int repeats, bool flush, const std::function<void()>& fn) {
  fn();
  fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    if (flush) flush_caches();
    const auto t0 = clock_type::now();
    fn();
    t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

// ---- ceilings ------------------------------------------------------------------------------

void rmw(unsigned char* p, std::size_t bytes, int threads) {
  auto* v = reinterpret_cast<__m128i*>(p);
  const std::size_t n = bytes / 16;
  const __m128i one = _mm_set1_epi32(1);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::size_t i = 0; i < n; ++i)
    _mm_store_si128(v + i, _mm_add_epi32(_mm_load_si128(v + i), one));
}

void copy_plain(const unsigned char* from, unsigned char* to, std::size_t bytes, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int n = omp_get_num_threads(), id = omp_get_thread_num();
    const std::size_t chunk = (bytes / n + 63) / 64 * 64;
    const std::size_t lo = std::min(bytes, chunk * id), hi = std::min(bytes, lo + chunk);
    std::memcpy(to + lo, from + lo, hi - lo);
  }
}

void copy_streaming(const unsigned char* from, unsigned char* to, std::size_t bytes, int threads) {
  const auto* s = reinterpret_cast<const __m128i*>(from);
  auto* d = reinterpret_cast<__m128i*>(to);
  const std::size_t n = bytes / 16;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::size_t i = 0; i < n; ++i) _mm_stream_si128(d + i, _mm_load_si128(s + i));
  _mm_sfence();
}

// ---- the unfused baseline ------------------------------------------------------------------

void store(void* p, dtype t, std::size_t i, float v) {
  if (t == dtype::bf16)
    static_cast<std::uint16_t*>(p)[i] = f32_to_bf16_bits(v);
  else
    static_cast<float*>(p)[i] = v;
}

// out = x * cos + rotate_half(x) * sin as eager PyTorch runs it: cos/sin gathered into full
// [T, D] tensors, then rotate_half (two slices, a negation, a cat), three elementwise ops,
// each a pass over whole tensors in the x dtype; plain loops the compiler vectorises.
template <class T>
struct unfused {
  // Inline conversions (round to nearest even, finite inputs) so that the passes vectorise,
  // as PyTorch's bf16 kernels are vectorised.
  static float load(T v) {
    if constexpr (std::is_same_v<T, float>) {
      return v;
    } else {
      const std::uint32_t u = static_cast<std::uint32_t>(v) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
  }
  static T store(float v) {
    if constexpr (std::is_same_v<T, float>) {
      return v;
    } else {
      std::uint32_t u;
      std::memcpy(&u, &v, 4);
      return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  std::int64_t tokens, heads, dim;
  std::vector<T> cos_full, sin_full, rot, a, b;
  unfused(std::int64_t t, std::int64_t h, std::int64_t d)
      : tokens(t),
        heads(h),
        dim(d),
        cos_full(t * d),
        sin_full(t * d),
        rot(t * h * d),
        a(t * h * d),
        b(t * h * d) {}

  void run(const T* x, T* out, const float* cos_table, const float* sin_table,
           const std::int64_t* pos, int threads) {
    const std::int64_t half = dim / 2, row = heads * dim;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t t = 0; t < tokens; ++t)  // cos = cat(freqs, freqs)[pos].to(dtype)
      for (std::int64_t j = 0; j < dim; ++j) {
        cos_full[t * dim + j] = store(cos_table[pos[t] * half + j % half]);
        sin_full[t * dim + j] = store(sin_table[pos[t] * half + j % half]);
      }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t r = 0; r < tokens * heads; ++r) {  // rotate_half(x) = cat(-x2, x1)
      for (std::int64_t j = 0; j < half; ++j)
        rot[r * dim + j] = store(-load(x[r * dim + half + j]));
      for (std::int64_t j = 0; j < half; ++j) rot[r * dim + half + j] = x[r * dim + j];
    }
    auto pass = [&](const T* p, const std::vector<T>& table,
                    T* to) {  // p * table (broadcast over heads)
#pragma omp parallel for schedule(static) num_threads(threads)
      for (std::int64_t t = 0; t < tokens; ++t)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t j = 0; j < dim; ++j)
            to[t * row + h * dim + j] =
                store(load(p[t * row + h * dim + j]) * load(table[t * dim + j]));
    };
    pass(x, cos_full, a.data());
    pass(rot.data(), sin_full, b.data());
    const std::int64_t n = tokens * row;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::int64_t i = 0; i < n; ++i) out[i] = store(load(a[i]) + load(b[i]));
  }
};

// ---- rows ----------------------------------------------------------------------------------

struct row {
  std::string kernel, dtype_name, shape;
  bool inplace = true;
  int threads = 1;
  std::optional<double> gbps, ceiling_gbps, fraction, ns_per_call, speedup, ratio_to_production;
  double median_s = 0, min_s = 0;
};

struct shape_case {
  std::string name;
  std::int64_t T, Hq, Hk, D;
  bool decode = false;
};

std::string fmt(const std::optional<double>& v, const char* f) {
  if (!v) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, *v);
  return b;
}

void print(const row& r) {
  std::printf("%-14s %-5s %-3s %-34s %2d %9s %9s %8s %10s %9s  (median %.3f ms, min %.3f ms)\n",
              r.kernel.c_str(), r.dtype_name.c_str(), r.inplace ? "in" : "out", r.shape.c_str(),
              r.threads, fmt(r.gbps, "%.2f").c_str(), fmt(r.ceiling_gbps, "%.2f").c_str(),
              fmt(r.fraction, "%.3f").c_str(), fmt(r.ns_per_call, "%.0f").c_str(),
              fmt(r.speedup ? r.speedup : r.ratio_to_production, "%.2fx").c_str(), r.median_s * 1e3,
              r.min_s * 1e3);
  std::fflush(stdout);
}

nlohmann::json to_json(const row& r) {
  auto opt = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  return {{"kernel", r.kernel},
          {"dtype", r.dtype_name},
          {"inplace", r.inplace},
          {"shape", r.shape},
          {"threads", r.threads},
          {"gbps", opt(r.gbps)},
          {"ceiling_gbps", opt(r.ceiling_gbps)},
          {"fraction", opt(r.fraction)},
          {"ns_per_call", opt(r.ns_per_call)},
          {"speedup_vs_unfused", opt(r.speedup)},
          {"tile_time_ratio", opt(r.ratio_to_production)},
          {"median_s", r.median_s},
          {"min_s", r.min_s}};
}

// One rope_apply configuration: q and k of a packed-free layout [T, H, D], table f32.
std::vector<row> bench_rope(const shape_case& s, rope_style style, dtype t, bool inplace,
                            int threads, int repeats, bool with_baseline) {
  const std::int64_t half = s.D / 2;
  const std::size_t es = size_of(t);
  const std::size_t q_bytes = s.T * s.Hq * s.D * es, k_bytes = s.T * s.Hk * s.D * es;
  buffer q(q_bytes), k(k_bytes), qo(inplace ? 16 : q_bytes), ko(inplace ? 16 : k_bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < q_bytes / es; ++i) store(q.data.get(), t, i, normal(rng));
  for (std::size_t i = 0; i < k_bytes / es; ++i) store(k.data.get(), t, i, normal(rng));
  const std::int64_t max_pos = std::max<std::int64_t>(s.T, 4096);
  const rope_table table = make_rope_table(max_pos, static_cast<int>(s.D), 1e6);
  std::vector<std::int64_t> pos(s.T);
  for (std::int64_t i = 0; i < s.T; ++i) pos[i] = s.decode ? 4000 + i : i;
  rope_tensors x;
  x.q = tensor_view::contiguous(q.data.get(), t, {s.T, s.Hq, s.D});
  x.k = tensor_view::contiguous(k.data.get(), t, {s.T, s.Hk, s.D});
  if (!inplace) {
    x.q_out = tensor_view::contiguous(qo.data.get(), t, {s.T, s.Hq, s.D});
    x.k_out = tensor_view::contiguous(ko.data.get(), t, {s.T, s.Hk, s.D});
  }
  const auto positions =
      rope_positions::from_ids(tensor_view::contiguous(pos.data(), dtype::i64, {s.T}));
  const auto angles = rope_angles::from_table(table.cos, table.sin);
  set_num_threads(threads);
  const timing kt = time_it(repeats, !s.decode, [&] { rope_apply(style, x, positions, angles); });

  row r;
  r.kernel = std::string("rope-") + std::string(to_string(style));
  r.dtype_name = std::string(to_string(t));
  r.inplace = inplace;
  r.threads = threads;
  r.shape = s.name + " T=" + std::to_string(s.T) + " " + std::to_string(s.Hq) + "/" +
            std::to_string(s.Hk) + "x" + std::to_string(s.D);
  r.median_s = kt.median;
  r.min_s = kt.min;
  if (s.decode) {
    r.ns_per_call = kt.median * 1e9;
    return {r};
  }
  const double bytes = 2.0 * (q_bytes + k_bytes) + 2.0 * s.T * half * 4 + s.T * 8.0;
  r.gbps = bytes / kt.median / 1e9;
  // The ceiling: the same bytes (x read and written) by the plainest loop of the same pattern.
  const std::size_t x_bytes = q_bytes + k_bytes;
  double ceiling_s;
  if (inplace) {
    buffer b(x_bytes);
    ceiling_s = time_it(repeats, true, [&] { rmw(b.data.get(), x_bytes, threads); }).median;
  } else {
    buffer from(x_bytes), to(x_bytes);
    const double plain = time_it(repeats, true, [&] {
                           copy_plain(from.data.get(), to.data.get(), x_bytes, threads);
                         }).median;
    const double stream = time_it(repeats, true, [&] {
                            copy_streaming(from.data.get(), to.data.get(), x_bytes, threads);
                          }).median;
    ceiling_s = std::min(plain, stream);
  }
  r.ceiling_gbps = 2.0 * x_bytes / ceiling_s / 1e9;
  r.fraction = *r.gbps / *r.ceiling_gbps;
  if (with_baseline && style == rope_style::neox) {
    // PyTorch eager composes q and k separately; time both.
    const auto* c = static_cast<const float*>(table.cos.data());
    const auto* sn = static_cast<const float*>(table.sin.data());
    buffer oq(q_bytes), ok(k_bytes);
    auto time_unfused = [&](auto tag) {
      using T = decltype(tag);
      unfused<T> uq(s.T, s.Hq, s.D), uk(s.T, s.Hk, s.D);
      return time_it(std::max(3, repeats / 4), true, [&] {
        uq.run(q.as<T>(), oq.as<T>(), c, sn, pos.data(), threads);
        uk.run(k.as<T>(), ok.as<T>(), c, sn, pos.data(), threads);
      });
    };
    const timing ut = t == dtype::f32 ? time_unfused(float{}) : time_unfused(std::uint16_t{});
    r.speedup = ut.median / kt.median;
  }
  return {r};
}

// The tile-layer skeleton against rope_apply on the same [B, S, D] (fp32, one thread).
row bench_skeleton(int repeats) {
  const std::int64_t B = 2048, S = 16, D = 128, half = D / 2;
  const std::size_t n = B * S * D;
  buffer a(n * 4), c(n * 4), s(n * 4), out(n * 4), out2(n * 4);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < n; ++i) a.as<float>()[i] = normal(rng);
  const rope_table table = make_rope_table(B * S, static_cast<int>(D), 1e4);
  for (std::int64_t r = 0; r < B * S; ++r)
    for (std::int64_t j = 0; j < D; ++j) {
      c.as<float>()[r * D + j] = static_cast<const float*>(table.cos.data())[r * half + j % half];
      s.as<float>()[r * D + j] = static_cast<const float*>(table.sin.data())[r * half + j % half];
    }
  const auto av = tensor_view::contiguous(a.data.get(), dtype::f32, {B, S, D});
  const auto cv = tensor_view::contiguous(c.data.get(), dtype::f32, {B, S, D});
  const auto sv = tensor_view::contiguous(s.data.get(), dtype::f32, {B, S, D});
  const auto ov = tensor_view::contiguous(out.data.get(), dtype::f32, {B, S, D});
  set_num_threads(1);
  const timing tt = time_it(repeats, true, [&] { reference::rope_skeleton(av, cv, sv, ov); });
  rope_tensors x;
  x.q = tensor_view(a.data.get(), dtype::f32, {B, S, 1, D}, {S * D, D, D, 1});
  x.q_out = tensor_view(out2.data.get(), dtype::f32, {B, S, 1, D}, {S * D, D, D, 1});
  const timing pt = time_it(repeats, true, [&] {
    rope_apply(rope_style::neox, x, rope_positions::from_offset(0),
               rope_angles::from_table(table.cos, table.sin));
  });
  row r;
  r.kernel = "tile-skeleton";
  r.dtype_name = "f32";
  r.inplace = false;
  r.threads = 1;
  r.shape = "[B,S,D]=[2048,16,128]";
  r.median_s = tt.median;
  r.min_s = tt.min;
  r.ratio_to_production = tt.median / pt.median;
  return r;
}

}  // namespace

int run_bench(const bench_options& o) {
  const int repeats = o.repeats ? o.repeats : (o.quick ? 10 : 20);
  const int all = std::max(1, omp_get_max_threads());
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  std::vector<shape_case> prefill = {{"qwen3-8b", 8192, 32, 8, 128},
                                     {"llama3.1-8b", 8192, 32, 8, 128},
                                     {"qwen2vl-vision", 4096, 16, 16, 80},
                                     {"long", 32768, 32, 8, 128}};
  if (o.quick) prefill.resize(1);
  const std::vector<shape_case> decode = {{"decode", 1, 32, 8, 128, true},
                                          {"decode", 16, 32, 8, 128, true}};

  std::printf(
      "tilerope bench: cpu target %s, up to %d threads, %d timed runs per row (median), caches "
      "flushed between runs\n",
      cpu_target().c_str(), all, repeats);
  std::printf("%-14s %-5s %-3s %-34s %2s %9s %9s %8s %10s %9s\n", "kernel", "dtype", "io", "shape",
              "th", "GB/s", "ceiling", "fraction", "ns/call", "speedup");
  std::vector<row> rows;
  const int before = num_threads();
  for (const auto& s : prefill) {
    for (rope_style style : {rope_style::neox, rope_style::gptj}) {
      for (dtype t : {dtype::f32, dtype::bf16}) {
        for (bool inplace : {true, false}) {
          if (o.quick && !inplace && t == dtype::bf16) continue;
          for (int th : thread_counts) {
            for (const row& r : bench_rope(s, style, t, inplace, th, repeats, inplace)) {
              print(r);
              rows.push_back(r);
            }
          }
        }
      }
    }
  }
  for (const auto& s : decode) {
    for (rope_style style : {rope_style::neox, rope_style::gptj}) {
      for (dtype t : {dtype::f32, dtype::bf16}) {
        for (const row& r : bench_rope(s, style, t, true, 1, std::max(repeats, 200), false)) {
          print(r);
          rows.push_back(r);
        }
      }
    }
  }
  const row sk = bench_skeleton(std::min(repeats, 10));
  print(sk);
  rows.push_back(sk);
  set_num_threads(before);
  std::printf(
      "fraction: kernel GB/s over the ceiling (same bytes, same access pattern, same run); "
      "speedup: "
      "unfused eager-style baseline time over kernel time; tile-skeleton: its time over "
      "rope_apply's\n");
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : rows) j.push_back(to_json(r));
    std::ofstream f(*o.json);
    f << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace tilerope::bench
