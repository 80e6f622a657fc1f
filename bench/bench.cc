// The benchmark. Every figure of merit is a ratio measured in one run:
//  - fraction = kernel GB/s / ceiling GB/s, where the ceiling is the same bytes moved by the
//    plainest loop with the same access pattern, over the kernel's own buffers (in place:
//    read-modify-write of q and k; out of place: a copy of them into q_out and k_out, normal or
//    streaming stores, whichever is faster here);
//  - speedup = unfused baseline time / kernel time (in the same round), the baseline composing
//    the same math the way PyTorch eager does (rotate_half into a temporary, two multiplies,
//    an add, full-size cos/sin tensors), each a separate pass over whole tensors.
// Bytes moved (the minimum model): read x and write x' (2 * elements * sizeof(x)), plus the
// cos/sin rows read once per token, plus the positions.

#include "bench.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ceiling.h"
#include "reference/reference.h"
#include "tilerope/error.h"
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
  // n bytes at `at`, owned elsewhere
  buffer(unsigned char* at, std::size_t n) : data(at, [](void*) {}), bytes(n) {}
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

timing median_and_min(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

// Seconds that one run of fn takes.
double seconds(const std::function<void()>& fn) {
  const auto t0 = clock_type::now();
  fn();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Median and min of `repeats` runs after two warm-ups; caches flushed before each unless the
// problem is meant to be cache resident (decode); `prepare` (untimed) before each run.
timing time_it(int repeats, bool flush, const std::function<void()>& fn,
               const std::function<void()>& prepare = {}) {
  fn();
  fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    if (flush) flush_caches();
    if (prepare) prepare();
    t.push_back(seconds(fn));
  }
  return median_and_min(t);
}

// ---- the unfused baseline ------------------------------------------------------------------

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
  std::optional<double> gbps, ceiling_gbps, fraction, ns_per_call, speedup, ratio_to_production,
      ns_per_element;
  std::optional<std::int64_t> prefetch_bytes;  // the prefetch-distance rows: the distance timed
  std::optional<std::string> ceiling_form;     // the ceiling loop's form (loop_form::name)
  double median_s = 0, min_s = 0;
};

// A row naming what was timed; the caller adds its figures.
row named_row(std::string kernel, std::string dtype_name, bool inplace, int threads,
              std::string shape) {
  row r;
  r.kernel = std::move(kernel);
  r.dtype_name = std::move(dtype_name);
  r.inplace = inplace;
  r.threads = threads;
  r.shape = std::move(shape);
  return r;
}

struct shape_case {
  std::string name;
  std::int64_t T, Hq, Hk, D;
  bool decode = false;
  std::string label() const {
    return name + " T=" + std::to_string(T) + " " + std::to_string(Hq) + "/" + std::to_string(Hk) +
           "x" + std::to_string(D);
  }
};

std::string fmt(const std::optional<double>& v, const char* f) {
  if (!v) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, *v);
  return b;
}

void print(const row& r) {
  std::printf(
      "%-25s %-5s %-3s %-34s %2d %9s %9s %8s %10s %9s  (median %.3f ms, min %.3f ms)\n",
      r.kernel.c_str(), r.dtype_name.c_str(), r.inplace ? "in" : "out", r.shape.c_str(), r.threads,
      fmt(r.gbps, "%.2f").c_str(), fmt(r.ceiling_gbps, "%.2f").c_str(),
      fmt(r.fraction, "%.3f").c_str(),
      fmt(r.ns_per_call ? r.ns_per_call : r.ns_per_element, r.ns_per_call ? "%.0f" : "%.4f/el")
          .c_str(),
      fmt(r.speedup ? r.speedup : r.ratio_to_production, "%.2fx").c_str(), r.median_s * 1e3,
      r.min_s * 1e3);
  std::fflush(stdout);
}

nlohmann::json to_json(const row& r) {
  auto opt = [](const auto& v) {  // an optional figure: its value, or null
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
          {"ns_per_element", opt(r.ns_per_element)},
          {"speedup_vs_unfused", opt(r.speedup)},
          {"tile_time_ratio", opt(r.ratio_to_production)},
          {"prefetch_bytes", opt(r.prefetch_bytes)},
          {"ceiling_form", opt(r.ceiling_form)},
          {"median_s", r.median_s},
          {"min_s", r.min_s}};
}

// The kernels measured. Each is one library call over q [T, Hq, D] and k [T, Hk, D].
enum class kernel_kind {
  rope_neox,        // table f32 [max_pos, D/2] by position ids
  rope_neox_theta,  // angles computed per token from theta (rope_angles::from_theta)
  rope_gptj,        // the same, adjacent pairs
  vision,           // rows [S, D] f32 per patch, as Qwen2-VL's vision tower passes them
  mrope,            // positions [3, T], sections [16, 24, 24] chunked, table f32
  qk_norm_rope,     // Qwen3: RMSNorm per head (weights [D]) then rope, table f32
  interleave,       // adjacent pairs in, split-half out, table f32
  rope_neox_bwd,    // rope_apply backward
  interleave_bwd,   // split-half in, adjacent pairs out
  qk_norm_rope_bwd  // dx over dy (in place) or into dx, reading x; dw [D]
};

const char* name_of(kernel_kind k) {
  switch (k) {
    case kernel_kind::rope_neox:
      return "rope-neox";
    case kernel_kind::rope_neox_theta:
      return "rope-neox-theta";
    case kernel_kind::rope_gptj:
      return "rope-gptj";
    case kernel_kind::vision:
      return "vision";
    case kernel_kind::mrope:
      return "mrope";
    case kernel_kind::qk_norm_rope:
      return "qk-norm-rope";
    case kernel_kind::interleave:
      return "interleave";
    case kernel_kind::rope_neox_bwd:
      return "rope-neox-bwd";
    case kernel_kind::interleave_bwd:
      return "interleave-bwd";
    case kernel_kind::qk_norm_rope_bwd:
      return "qk-norm-rope-bwd";
  }
  return "?";
}

// The access pattern of the ceiling loop: read-modify-write of the x bytes (in place), a copy
// of them (out of place), or either of those while also reading a second buffer of the same
// size (qk-norm backward reads the forward's x besides dy).
enum class pattern { rmw, copy, rmw_read, copy_read };

// One tensor's buffers as the ceiling moves them: x read (and written in place), `other` read
// besides (qk-norm backward), `to` written (out of place).
struct span {
  unsigned char* x = nullptr;
  const unsigned char* other = nullptr;
  unsigned char* to = nullptr;
  std::size_t bytes = 0;
};

// One measured call: what it runs, the bytes of the minimum model, its ceiling pattern.
struct problem {
  std::function<void()> run;
  double bytes = 0;         // GB/s numerator
  std::size_t x_bytes = 0;  // the ceiling moves these (read and written)
  pattern ceiling = pattern::rmw;
  std::vector<span> spans;  // the kernel's own buffers, q's then k's, which the ceiling moves
  std::function<void()> baseline;           // the unfused composition, when there is one
  std::function<void()> restore;            // puts the inputs back (in place: q and k)
  std::vector<std::shared_ptr<void>> keep;  // buffers and tables the calls point into
};

template <class T>
std::shared_ptr<T> hold(problem& p, T&& v) {
  auto h = std::make_shared<T>(std::move(v));
  p.keep.push_back(h);
  return h;
}

// Values in [-2, 2) from a 64-bit LCG: cheap enough for hundreds of MB per row.
void fill(const buffer& b, dtype t, std::uint32_t seed) {
  std::uint64_t state = 0x9e3779b97f4a7c15ull * (seed + 1);
  const std::size_t n = b.bytes / size_of(t);
  for (std::size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float v = static_cast<float>(state >> 40) * 0x1p-22f - 2.0f;
    if (t == dtype::f32) {
      b.as<float>()[i] = v;
    } else {
      b.as<std::uint16_t>()[i] = t == dtype::f16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
    }
  }
}

// q and k in their own allocations, or at q_at and k_at (memory owned elsewhere) when given.
problem make_problem(kernel_kind kind, const shape_case& s, dtype t, bool inplace, int threads,
                     bool with_baseline, unsigned char* q_at = nullptr,
                     unsigned char* k_at = nullptr) {
  problem p;
  const std::int64_t T = s.T, Hq = s.Hq, Hk = s.Hk, D = s.D, half = D / 2;
  const std::size_t es = size_of(t);
  const std::size_t q_bytes = T * Hq * D * es, k_bytes = T * Hk * D * es;
  auto q = hold(p, q_at != nullptr ? buffer(q_at, q_bytes) : buffer(q_bytes));
  auto k = hold(p, k_at != nullptr ? buffer(k_at, k_bytes) : buffer(k_bytes));
  auto qo = hold(p, buffer(inplace ? 16 : q_bytes)), ko = hold(p, buffer(inplace ? 16 : k_bytes));
  fill(*q, t, 1);
  fill(*k, t, 2);
  if (inplace && s.decode) {
    // each decode call sees fresh activations: repeated in place, QK RMSNorm's weights would
    // shrink the small-weight elements by up to 2.27x per call, into subnormals within 200
    auto q0 = hold(p, buffer(q_bytes)), k0 = hold(p, buffer(k_bytes));
    std::memcpy(q0->data.get(), q->data.get(), q_bytes);
    std::memcpy(k0->data.get(), k->data.get(), k_bytes);
    p.restore = [=] {
      std::memcpy(q->data.get(), q0->data.get(), q_bytes);
      std::memcpy(k->data.get(), k0->data.get(), k_bytes);
    };
  }
  rope_tensors x;
  x.q = tensor_view::contiguous(q->data.get(), t, {T, Hq, D});
  x.k = tensor_view::contiguous(k->data.get(), t, {T, Hk, D});
  if (!inplace) {
    x.q_out = tensor_view::contiguous(qo->data.get(), t, {T, Hq, D});
    x.k_out = tensor_view::contiguous(ko->data.get(), t, {T, Hk, D});
  }
  const std::int64_t max_pos = std::max<std::int64_t>(T, 4096);
  auto table = hold(p, make_rope_table(max_pos, static_cast<int>(D), 1e6));
  auto pos = hold(p, std::vector<std::int64_t>(T));
  for (std::int64_t i = 0; i < T; ++i) (*pos)[i] = s.decode ? 4000 + i : i;
  const auto positions =
      rope_positions::from_ids(tensor_view::contiguous(pos->data(), dtype::i64, {T}));
  const auto angles = rope_angles::from_table(table->cos, table->sin);
  const double table_bytes = 2.0 * T * half * 4;  // the cos and sin rows, once per token
  p.x_bytes = q_bytes + k_bytes;
  p.bytes = 2.0 * p.x_bytes + table_bytes + T * 8.0;
  p.ceiling = inplace ? pattern::rmw : pattern::copy;
  p.spans = {span{q->data.get(), nullptr, inplace ? nullptr : qo->data.get(), q_bytes},
             span{k->data.get(), nullptr, inplace ? nullptr : ko->data.get(), k_bytes}};
  rope_options options;
  switch (kind) {
    case kernel_kind::rope_neox:
    case kernel_kind::rope_gptj:
    case kernel_kind::rope_neox_bwd: {
      const rope_style style = kind == kernel_kind::rope_gptj ? rope_style::gptj : rope_style::neox;
      options.backward = kind == kernel_kind::rope_neox_bwd;
      p.run = [=] { rope_apply(style, x, positions, angles, options); };
      break;
    }
    case kernel_kind::rope_neox_theta: {
      p.bytes = 2.0 * p.x_bytes + T * 8.0;  // no table: the angles are computed
      const auto computed = rope_angles::from_theta(1e6);
      p.run = [=] { rope_apply(rope_style::neox, x, positions, computed); };
      break;
    }
    case kernel_kind::interleave:
    case kernel_kind::interleave_bwd:
      options.output_layout = rope_output_layout::split_half;
      options.backward = kind == kernel_kind::interleave_bwd;
      p.run = [=] { rope_apply(rope_style::gptj, x, positions, angles, options); };
      break;
    case kernel_kind::vision: {
      // rows [S, D] f32: cat(freqs, freqs) per patch
      auto rows = hold(p, rope_table{tensor(dtype::f32, {T, D}), tensor(dtype::f32, {T, D})});
      for (std::int64_t r = 0; r < T; ++r) {
        for (std::int64_t j = 0; j < D; ++j) {
          const auto at = static_cast<std::size_t>(r * half + j % half);
          static_cast<float*>(rows->cos.data())[r * D + j] =
              static_cast<const float*>(table->cos.data())[at];
          static_cast<float*>(rows->sin.data())[r * D + j] =
              static_cast<const float*>(table->sin.data())[at];
        }
      }
      p.bytes = 2.0 * p.x_bytes + 2.0 * T * D * 4;
      const auto rows_angles = rope_angles::from_token_rows(rows->cos, rows->sin);
      p.run = [=] { rope_apply(rope_style::neox, x, rows_angles); };
      break;
    }
    case kernel_kind::mrope: {
      auto ids = hold(p, tensor(dtype::i64, {3, T}));
      for (std::int64_t a = 0; a < 3; ++a) {
        for (std::int64_t i = 0; i < T; ++i) {
          static_cast<std::int64_t*>(ids->data())[a * T + i] = a == 0 ? i : (i * (a + 3)) % 64;
        }
      }
      const int sec = static_cast<int>(half);  // 16, 24, 24 scaled to half
      const std::array<int, 3> section = {sec / 4, (sec - sec / 4) / 2,
                                          sec - sec / 4 - (sec - sec / 4) / 2};
      const auto axes =
          rope_positions::from_axes(*ids, mrope_axis_map(section, mrope_layout::chunked));
      p.bytes = 2.0 * p.x_bytes + table_bytes + 3.0 * T * 8;
      p.run = [=] { rope_apply(rope_style::neox, x, axes, angles); };
      break;
    }
    case kernel_kind::qk_norm_rope:
    case kernel_kind::qk_norm_rope_bwd: {
      auto w = hold(p, tensor(t, {D}));
      for (std::int64_t j = 0; j < D; ++j)
        store_from_f64(w->data(), t, static_cast<std::size_t>(j), 1.0 + 0.01 * j);
      qk_norm norm;
      norm.q_weight = *w;
      norm.k_weight = w->view();
      if (kind == kernel_kind::qk_norm_rope) {
        p.run = [=] { qk_norm_rope_apply(rope_style::neox, x, positions, angles, norm); };
        break;
      }
      // backward: dy is q, k (dx over it in place, or into q_out, k_out); x the forward's
      auto xq = hold(p, buffer(q_bytes)), xk = hold(p, buffer(k_bytes));
      fill(*xq, t, 3);
      fill(*xk, t, 4);
      auto dw = hold(p, std::vector<float>(2 * D));
      qk_norm_rope_grad_tensors g;
      g.q = tensor_view::contiguous(xq->data.get(), t, {T, Hq, D});
      g.k = tensor_view::contiguous(xk->data.get(), t, {T, Hk, D});
      g.dq_out = x.q;
      g.dk_out = x.k;
      g.dq = x.q_out;
      g.dk = x.k_out;
      g.dq_weight = tensor_view::contiguous(dw->data(), dtype::f32, {D});
      g.dk_weight = tensor_view::contiguous(dw->data() + D, dtype::f32, {D});
      p.bytes += static_cast<double>(p.x_bytes);
      p.ceiling = inplace ? pattern::rmw_read : pattern::copy_read;
      p.spans[0].other = xq->data.get();
      p.spans[1].other = xk->data.get();
      p.run = [=] { qk_norm_rope_backward(rope_style::neox, g, positions, angles, norm); };
      break;
    }
  }
  if (with_baseline && !s.decode && (t == dtype::f32 || t == dtype::bf16) &&
      (kind == kernel_kind::rope_neox || kind == kernel_kind::vision)) {
    // PyTorch eager composes q and k separately, into fresh outputs
    const auto* c = static_cast<const float*>(table->cos.data());
    const auto* sn = static_cast<const float*>(table->sin.data());
    auto oq = hold(p, buffer(q_bytes)), ok = hold(p, buffer(k_bytes));
    auto make = [&](auto tag) -> std::function<void()> {
      using E = decltype(tag);
      auto uq = hold(p, unfused<E>(T, Hq, D)), uk = hold(p, unfused<E>(T, Hk, D));
      const std::int64_t* pp = pos->data();
      return [=] {
        uq->run(q->template as<E>(), oq->template as<E>(), c, sn, pp, threads);
        uk->run(k->template as<E>(), ok->template as<E>(), c, sn, pp, threads);
      };
    };
    p.baseline = t == dtype::f32 ? make(float{}) : make(std::uint16_t{});
  }
  return p;
}

// The ceiling loops over a problem's own buffers (problem::spans: the same physical bytes the
// kernel moves; the same loop over other buffers of the same size can run faster or slower,
// by allocation), each in its fastest form here (loop_forms: every vector width the CPU has,
// for a copy normal or streaming stores and memcpy, with or without software prefetch),
// decided once per pattern, size and threads from three runs of each; the choice is printed.
struct ceilings {
  std::map<std::tuple<int, std::size_t, int>, loop_form> fastest;

  static const char* pattern_name(pattern p) {
    switch (p) {
      case pattern::rmw:
        return "read-modify-write";
      case pattern::rmw_read:
        return "read-modify-write + read";
      case pattern::copy:
        return "copy";
      default:
        return "copy + read";
    }
  }

  std::function<void()> loop(const problem& p, int threads) {
    return form_loop(p, threads, form_of(p, threads));
  }

  loop_form form_of(const problem& p, int threads) {
    const pattern pat = p.ceiling;
    const auto key = std::make_tuple(static_cast<int>(pat), p.x_bytes, threads);
    if (fastest.find(key) == fastest.end()) {
      const bool in_place = pat == pattern::rmw || pat == pattern::rmw_read;
      const bool reads_other = pat == pattern::rmw_read || pat == pattern::copy_read;
      double best = 0, widest16 = 0;
      for (const loop_form& f : loop_forms(!in_place, reads_other)) {
        const double t = time_it(3, true, form_loop(p, threads, f)).median;
        if (f.width == 16 && !f.streaming && !f.prefetch) widest16 = t;
        if (best == 0 || t < best) {
          best = t;
          fastest[key] = f;
        }
      }
      std::printf("  ceiling for %s of %.0f MB, %d threads: %s (%.3f ms; 16-byte normal %.3f ms)\n",
                  pattern_name(pat), static_cast<double>(p.x_bytes) / 1e6, threads,
                  fastest[key].name().c_str(), best * 1e3, widest16 * 1e3);
    }
    return fastest[key];
  }

  static std::function<void()> form_loop(const problem& p, int threads, loop_form f) {
    const bool in_place = p.ceiling == pattern::rmw || p.ceiling == pattern::rmw_read;
    const std::vector<span> spans = p.spans;
    return [=] {
      for (const span& s : spans) {
        if (in_place) {
          rmw(s.x, s.other, s.bytes, threads, f);
        } else {
          copy(s.x, s.other, s.to, s.bytes, threads, f);
        }
      }
    };
  }
};

// The kernel and its ceiling timed in turn, caches flushed before each run, so that both
// medians see the same state of a shared machine; with a baseline, it too runs in every fourth
// round, right after that round's kernel and ceiling, and `speedup` is the median over those
// rounds of its time over the same round's kernel time.
struct turns {
  timing kernel, ceiling;
  std::optional<double> speedup;
};

turns time_alternating(int repeats, const std::function<void()>& kernel,
                       const std::function<void()>& ceiling,
                       const std::function<void()>& baseline) {
  kernel();
  kernel();
  ceiling();
  if (baseline) baseline();
  std::vector<double> tk, tc, ratios;
  for (int r = 0; r < repeats; ++r) {
    const bool with_baseline = baseline && r % 4 == 0;
    for (int which = 0; which < (with_baseline ? 3 : 2); ++which) {
      flush_caches();
      const double t = seconds(which == 0 ? kernel : which == 1 ? ceiling : baseline);
      if (which == 2) {
        ratios.push_back(t / tk.back());
      } else {
        (which == 0 ? tk : tc).push_back(t);
      }
    }
  }
  turns out{median_and_min(tk), median_and_min(tc), std::nullopt};
  if (!ratios.empty()) out.speedup = median_and_min(ratios).median;
  return out;
}

// Each function timed once per round, in turn, caches flushed before each run: their medians
// see the same states of a shared machine.
std::vector<timing> time_rounds(int repeats, const std::vector<std::function<void()>>& fns) {
  for (const auto& f : fns) f();
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < fns.size(); ++i) {
      flush_caches();
      t[i].push_back(seconds(fns[i]));
    }
  }
  std::vector<timing> out;
  for (const auto& ti : t) out.push_back(median_and_min(ti));
  return out;
}

// A bandwidth row's figures from the kernel's and its ceiling's timings.
void set_bandwidth(row& r, const problem& p, const timing& kt, const timing& ct) {
  r.median_s = kt.median;
  r.min_s = kt.min;
  r.gbps = p.bytes / kt.median / 1e9;
  const std::size_t streams = p.ceiling == pattern::rmw_read || p.ceiling == pattern::copy_read;
  r.ceiling_gbps = (2.0 + static_cast<double>(streams)) * p.x_bytes / ct.median / 1e9;
  r.fraction = *r.gbps / *r.ceiling_gbps;
}

row measure(kernel_kind kind, const shape_case& s, dtype t, bool inplace, int threads, int repeats,
            bool with_baseline, ceilings& ceil) {
  problem p = make_problem(kind, s, t, inplace, threads, with_baseline);
  set_num_threads(threads);
  row r = named_row(name_of(kind), std::string(to_string(t)), inplace, threads, s.label());
  if (s.decode) {
    const timing kt = time_it(repeats, false, p.run, p.restore);
    r.median_s = kt.median;
    r.min_s = kt.min;
    r.ns_per_call = kt.median * 1e9;
    return r;
  }
  const turns tt = time_alternating(repeats, p.run, ceil.loop(p, threads), p.baseline);
  set_bandwidth(r, p, tt.kernel, tt.ceiling);
  r.ceiling_form = ceil.form_of(p, threads).name();
  r.speedup = tt.speedup;
  return r;
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
  row r = named_row("tile-skeleton", "f32", false, 1, "[B,S,D]=[2048,16,128]");
  r.median_s = tt.median;
  r.min_s = tt.min;
  r.ratio_to_production = tt.median / pt.median;
  return r;
}

// Whether --only (empty: every row) selects the rows named `name`.
bool selected(const bench_options& o, const std::string& name) {
  return o.only.empty() || name.find(o.only) != std::string::npos;
}

// The rows of the prefetch-distance sweep are named "prefetch:KERNEL" (--only prefetch).
constexpr const char* prefetch_sweep = "prefetch";

}  // namespace

int run_bench(const bench_options& o) {
  const int repeats = o.repeats ? o.repeats : (o.quick ? 10 : 20);
  const int all = std::max(1, omp_get_max_threads());
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  const shape_case qwen3{"qwen3-8b", 8192, 32, 8, 128};
  const shape_case llama{"llama3.1-8b", 8192, 32, 8, 128};
  const shape_case vision_shape{"qwen2vl-vision", 4096, 16, 16, 80};
  const shape_case long_shape{"long", 32768, 32, 8, 128};
  // QK RMSNorm at head dim 256 (Gemma 3 4B: 8 q heads, 4 kv heads), whose rows take other paths
  // than head dim 128's
  const shape_case gemma3{"gemma3-4b", 8192, 8, 4, 256};
  const std::vector<dtype> all_types = {dtype::f32, dtype::bf16, dtype::f16};
  const std::vector<dtype> quick_types = {dtype::f32, dtype::bf16};
  const auto& types = o.quick ? quick_types : all_types;

  std::printf(
      "tilerope bench: %s, cpu target %s, up to %d threads, prefetch %lld bytes, %d timed runs "
      "per row (median), caches flushed between runs\n",
      cpu_class().c_str(), cpu_target().c_str(), all, static_cast<long long>(prefetch_bytes()),
      repeats);
  std::printf("%-25s %-5s %-3s %-34s %2s %9s %9s %8s %10s %9s\n", "kernel", "dtype", "io", "shape",
              "th", "GB/s", "ceiling", "fraction", "ns/call", "speedup");
  std::vector<row> rows;
  ceilings ceil;
  const int before = num_threads();
  auto add = [&](kernel_kind kind, const shape_case& s, dtype t, bool inplace, int th,
                 bool baseline) {
    if (!selected(o, name_of(kind))) return;
    const int reps = s.decode ? std::max(repeats, 200) : repeats;
    rows.push_back(measure(kind, s, t, inplace, th, reps, baseline, ceil));
    print(rows.back());
  };
  // rope, both styles: every prefill shape, dtype, in and out of place, 1 and all threads
  std::vector<shape_case> rope_shapes = {qwen3, llama, vision_shape, long_shape};
  if (o.quick) rope_shapes = {qwen3, vision_shape};
  for (const auto& s : rope_shapes) {
    for (kernel_kind kind : {kernel_kind::rope_neox, kernel_kind::rope_gptj}) {
      for (dtype t : types) {
        for (bool inplace : {true, false}) {
          if (o.quick && (s.D != 128 || kind == kernel_kind::rope_gptj) && !inplace) continue;
          if (o.quick && s.D != 128 && kind == kernel_kind::rope_gptj) continue;
          for (int th : thread_counts) add(kind, s, t, inplace, th, inplace);
        }
      }
    }
  }
  // the other variants, each on its model's shape
  struct variant_shape {
    kernel_kind kind;
    shape_case shape;
  };
  for (const auto& [kind, s] :
       {variant_shape{kernel_kind::rope_neox_theta, qwen3},
        variant_shape{kernel_kind::vision, vision_shape}, variant_shape{kernel_kind::mrope, qwen3},
        variant_shape{kernel_kind::qk_norm_rope, qwen3},
        variant_shape{kernel_kind::interleave, qwen3},
        variant_shape{kernel_kind::rope_neox_bwd, qwen3},
        variant_shape{kernel_kind::interleave_bwd, qwen3},
        variant_shape{kernel_kind::qk_norm_rope_bwd, qwen3},
        variant_shape{kernel_kind::qk_norm_rope, gemma3},
        variant_shape{kernel_kind::qk_norm_rope_bwd, gemma3}}) {
    if (o.quick && s.name == gemma3.name) continue;  // the full run only
    for (dtype t : types) {
      for (bool inplace : {true, false}) {
        if (o.quick && !inplace && t != dtype::f32) continue;
        for (int th : thread_counts) add(kind, s, t, inplace, th, inplace);
      }
    }
  }
  // the software prefetch distance (tilerope::set_prefetch_bytes) at 0 to 4096 bytes (the default
  // is 2048 on Intel, none on AMD), in place at Qwen3-8B: rope-neox f32 and bf16, and the bf16
  // rows whose arithmetic is longest against their bytes; each row names its distance, and the
  // default is restored after
  if (!o.quick && selected(o, prefetch_sweep)) {
    const std::int64_t default_bytes = prefetch_bytes();
    struct swept {
      kernel_kind kind;
      dtype type;
    };
    for (const auto& [kind, t] :
         {swept{kernel_kind::rope_neox, dtype::f32}, swept{kernel_kind::rope_neox, dtype::bf16},
          swept{kernel_kind::qk_norm_rope, dtype::bf16},
          swept{kernel_kind::qk_norm_rope_bwd, dtype::bf16}}) {
      for (int th : thread_counts) {
        for (std::int64_t bytes : {0, 1024, 2048, 4096}) {
          set_prefetch_bytes(bytes);
          row r = measure(kind, qwen3, t, true, th, repeats, false, ceil);
          r.kernel = std::string(prefetch_sweep) + ":" + r.kernel;
          r.shape += " pf=" + std::to_string(bytes);
          r.prefetch_bytes = bytes;
          rows.push_back(r);
          print(rows.back());
        }
      }
    }
    set_prefetch_bytes(default_bytes);
  }
  // decode: cache resident, ns per call on the calling thread (and with all threads allowed:
  // small problems stay on the caller)
  const std::size_t before_decode = rows.size();
  for (std::int64_t T : {1, 16}) {
    const shape_case s{"decode", T, 32, 8, 128, true};
    for (kernel_kind kind :
         {kernel_kind::rope_neox, kernel_kind::rope_neox_theta, kernel_kind::rope_gptj,
          kernel_kind::mrope, kernel_kind::qk_norm_rope}) {
      for (dtype t : quick_types) {
        for (int th : thread_counts) {
          if (o.quick && (th > 1 || T > 1) && kind != kernel_kind::rope_neox) continue;
          add(kind, s, t, true, th, false);
        }
      }
    }
  }
  // the timer's own cost, which each decode row's ns/call includes: an empty call timed as each
  // decode call is (two clock reads around a std::function call); tens of ns where the clock is
  // read in user space (the TSC), more where each read enters the kernel
  if (rows.size() > before_decode) {
    const std::function<void()> nothing = [] {};
    const timing t = time_it(std::max(repeats, 200), false, nothing, nothing);
    row r = named_row("decode-timer", "-", false, 1, "empty call");
    r.median_s = t.median;
    r.min_s = t.min;
    r.ns_per_call = t.median * 1e9;
    rows.push_back(r);
    print(rows.back());
  }
  // linearity: time per element of rope-neox bf16 in place, one thread, T = 1024 .. 32768,
  // every length (and its ceiling) timed once per round, so that all see the same machine;
  // twice the rounds of a row (a single row's median moves widely between runs). Every
  // length's q and k are the first bytes of the same two regions of one allocation, so that
  // the lengths share their memory (a loop over one allocation can run faster or slower than
  // over another of the same size)
  std::vector<std::int64_t> lengths = {1024, 4096, 8192, 32768};
  if (o.quick) lengths = {1024, 8192};
  if (selected(o, "rope-neox-scale")) {
    set_num_threads(1);
    std::vector<shape_case> shapes;
    std::vector<problem> problems;
    std::vector<std::function<void()>> fns;
    const std::size_t q_most = lengths.back() * 32 * 128 * 2, k_most = lengths.back() * 8 * 128 * 2;
    const buffer arena(q_most + k_most);
    for (std::int64_t T : lengths) {
      shapes.push_back({"linear", T, 32, 8, 128});
      problems.push_back(make_problem(kernel_kind::rope_neox, shapes.back(), dtype::bf16, true, 1,
                                      false, arena.data.get(), arena.data.get() + q_most));
      fns.push_back(problems.back().run);
      fns.push_back(ceil.loop(problems.back(), 1));
    }
    const std::vector<timing> t = time_rounds(2 * repeats, fns);
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      row r = named_row("rope-neox-scale", "bf16", true, 1, shapes[i].label());
      set_bandwidth(r, problems[i], t[2 * i], t[2 * i + 1]);
      r.ceiling_form = ceil.form_of(problems[i], 1).name();
      r.ns_per_element = r.median_s * 1e9 / static_cast<double>(lengths[i] * (32 + 8) * 128);
      print(r);
      rows.push_back(r);
    }
  }
  if (selected(o, "tile-skeleton")) {
    const row sk = bench_skeleton(std::min(repeats, 10));
    print(sk);
    rows.push_back(sk);
  }
  set_num_threads(before);
  std::printf(
      "fraction: kernel GB/s over the ceiling (same bytes, same access pattern, same run); "
      "speedup: unfused eager-style baseline time over kernel time; tile-skeleton: its time "
      "over rope_apply's; rope-neox-scale: ns per element\n");
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : rows) j.push_back(to_json(r));
    std::ofstream f(*o.json);
    f << j.dump(1) << "\n";
    if (!f) throw error("cannot write " + *o.json);
  }
  return 0;
}

}  // namespace tilerope::bench
