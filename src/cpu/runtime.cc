#include "tilerope/runtime.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "cpu/rope_plan.h"
#include "hwy/targets.h"
#include "tilerope/error.h"

namespace tilerope {

namespace {

struct named_target {
  const char* name;
  std::int64_t mask;  // Highway targets this name stands for; the best supported one is used
};

constexpr named_target target_names[] = {
    {"scalar", HWY_EMU128 | HWY_SCALAR},
    {"ssse3", HWY_SSSE3},
    {"sse4", HWY_SSE4},
    {"avx2", HWY_AVX2},
    {"avx512", HWY_AVX3 | HWY_AVX3_DL},
    {"neon", HWY_NEON},
    {"sve", HWY_SVE},
    {"sve2", HWY_SVE2},
};

std::string name_of(std::int64_t target) {
  for (const auto& t : target_names) {
    if (t.mask & target) return t.name;
  }
  return hwy::TargetName(target);
}

std::vector<std::string> names_of(std::int64_t targets) {
  std::vector<std::string> out;
  for (const auto& t : target_names) {
    if (t.mask & targets) out.emplace_back(t.name);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::atomic<int> thread_count{0};  // 0: not yet resolved
std::once_flag env_target_once;

int default_threads() {
  if (const char* env = std::getenv("TILEROPE_NUM_THREADS"); env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end != '\0' || n <= 0 || n > 4096) {
      throw error("TILEROPE_NUM_THREADS ('" + std::string(env) + "') must be a positive integer");
    }
    return static_cast<int>(n);
  }
  return std::max(1, omp_get_max_threads());
}

// Software prefetch distance in bytes, -1 until resolved (set_prefetch_bytes, the
// environment, or the CPU's default).
std::atomic<std::int64_t> prefetch_distance{-1};
constexpr std::int64_t max_prefetch_bytes = 1 << 20;

std::int64_t default_prefetch_bytes() {
  if (const char* env = std::getenv("TILEROPE_PREFETCH_BYTES"); env && *env) {
    char* end = nullptr;
    const long long n = std::strtoll(env, &end, 10);
    if (*end != '\0' || n < 0 || n > max_prefetch_bytes) {
      throw error("TILEROPE_PREFETCH_BYTES ('" + std::string(env) +
                  "') must be an integer in [0, " + std::to_string(max_prefetch_bytes) + "]");
    }
    return n;
  }
  // Intel: rope-neox bf16 in place, Qwen3-8B, one thread, 0.62 of the ceiling without, 0.82
  // with 2048 bytes (docs/performance.md, "Performance decisions"); off on AMD, where rows
  // prefetched a few heads or tokens ahead measured slower (Zen 4 rope, Zen 3 QK RMSNorm's
  // backward)
  return detail::intel_cpu() ? 2048 : 0;
}

void force_target(std::string_view name);

void apply_env_target() {
  std::call_once(env_target_once, [] {
    if (const char* env = std::getenv("TILEROPE_CPU_TARGET"); env && *env) {
      try {
        force_target(env);
      } catch (const error& e) {
        throw error(std::string("TILEROPE_CPU_TARGET: ") + e.what());
      }
    }
  });
}

}  // namespace

void set_num_threads(int n) {
  if (n <= 0) throw error("num_threads (" + std::to_string(n) + ") must be > 0");
  thread_count = n;
}

void set_prefetch_bytes(std::int64_t bytes) {
  if (bytes < 0 || bytes > max_prefetch_bytes) {
    throw error("prefetch_bytes (" + std::to_string(bytes) + ") must be in [0, " +
                std::to_string(max_prefetch_bytes) + "]");
  }
  prefetch_distance = bytes;
}

std::int64_t prefetch_bytes() {
  std::int64_t n = prefetch_distance.load();
  if (n < 0) {
    n = default_prefetch_bytes();
    prefetch_distance = n;
  }
  return n;
}

int num_threads() {
  int n = thread_count.load();
  if (n == 0) {
    n = default_threads();
    thread_count = n;
  }
  return n;
}

std::vector<std::string> compiled_cpu_targets() {
  auto v = names_of(HWY_TARGETS);
  return v;
}

std::vector<std::string> supported_cpu_targets() {
  // SupportedTargets() honours a forced target; ask for the CPU's own set.
  return names_of(HWY_TARGETS & hwy::SupportedTargets());
}

void set_cpu_target(std::string_view name) {
  // Mark the environment as read: an explicit call wins over TILEROPE_CPU_TARGET.
  std::call_once(env_target_once, [] {});
  force_target(name);
}

namespace {
void force_target(std::string_view name) {
  if (name == "best") {
    hwy::SetSupportedTargetsForTest(0);
    return;
  }
  const named_target* found = nullptr;
  for (const auto& t : target_names) {
    if (name == t.name) found = &t;
  }
  std::vector<std::string> known;
  for (const auto& t : target_names) known.emplace_back(t.name);
  if (found == nullptr) {
    throw error("cpu target '" + std::string(name) + "' is unknown; known targets: " + join(known) +
                ", best");
  }
  hwy::SetSupportedTargetsForTest(0);
  const std::int64_t available = hwy::SupportedTargets() & HWY_TARGETS;
  const std::int64_t chosen = found->mask & available;
  if (chosen == 0) {
    throw error(
        "cpu target '" + std::string(name) +
        "' is not available on this CPU and build; available: " + join(names_of(available)));
  }
  // Keep only the best of the named set (e.g. AVX3_DL over AVX3): targets are bits, best lowest.
  hwy::SetSupportedTargetsForTest(chosen & -chosen);
}
}  // namespace

std::string cpu_target() {
  apply_env_target();
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return name_of(targets & -targets);
}

std::string_view version() { return "0.1.0"; }

namespace detail {

// Below this many elements of q and k a call runs on the calling thread: waking a team
// costs more than the work (a decode step is a few thousand elements).
constexpr std::int64_t min_parallel_elements = 1 << 18;

// A parallel call's tokens go in up to this many blocks per thread, taken by whichever thread
// is free: a thread the machine slows down then holds up the call by one block, not by its
// half. Measured (one loop calling the library, two threads, 32 + 8 heads of 128, T = 8192,
// in memory, the two alternated six times; median of each run's median, ns per element):
// QK RMSNorm bf16 in place 0.235 with halves fixed per thread, 0.160 in blocks; rope-neox bf16
// 0.099 and 0.083, f32 out of place 0.262 and 0.215. The fastest runs were the same (0.106
// and 0.107 for QK RMSNorm): the blocks help when the machine is shared.
constexpr std::int64_t blocks_per_thread = 16;

// Elements of q and k in one call.
std::int64_t elements_of(const rope_plan& plan) {
  std::int64_t heads = 0;
  for (int k = 0; k < plan.num_blocks; ++k) heads += plan.blocks[k].heads;
  return plan.tokens() * heads * plan.head_dim;
}

std::int64_t token_blocks(const rope_plan& plan) {
  const std::int64_t tokens = plan.tokens();
  const std::int64_t elements = elements_of(plan);
  const std::int64_t threads = std::min<std::int64_t>(num_threads(), tokens);
  if (threads <= 1 || elements < min_parallel_elements) return 1;
  return std::min<std::int64_t>(tokens, blocks_per_thread * threads);
}

bool intel_cpu() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool is = __builtin_cpu_is("intel");
  return is;
#else
  return false;
#endif
}

namespace {
// A kernel path chosen per CPU that the kernel tests can set: -1 (the CPU's default: taken on
// Intel), 0 or 1.
class intel_default {
 public:
  bool taken() const {
    const int v = set_to_.load();
    return v < 0 ? intel_cpu() : v != 0;
  }
  void set(int v) { set_to_ = v < 0 ? -1 : v != 0; }

 private:
  std::atomic<int> set_to_{-1};
};

intel_default held_16bit_norm_rows, streamed_f16_norm_backward;
}  // namespace

bool norm_rows_held_16bit() { return held_16bit_norm_rows.taken(); }
void set_norm_rows_held_16bit(int held) { held_16bit_norm_rows.set(held); }
bool f16_norm_backward_streamed() { return streamed_f16_norm_backward.taken(); }
void set_f16_norm_backward_streamed(int streamed) { streamed_f16_norm_backward.set(streamed); }

bool native_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void run_rope_cpu(rope_plan& plan) {
  apply_env_target();
  const std::int64_t tokens = plan.tokens();
  if (tokens == 0) return;
  // a problem small enough for one thread is read from cache: prefetching would only cost
  // (decode, T = 1, Qwen3-8B heads, Intel: rope-neox f32 346 to 387 ns with 2048 bytes)
  if (elements_of(plan) < min_parallel_elements) plan.prefetch_bytes = 0;
  const std::int64_t blocks = token_blocks(plan);
  if (blocks == 1) {
    rope_tokens(plan, 0, tokens, 0);
    return;
  }
  // Block b holds tokens [T b / n, T (b + 1) / n) and sums its weight-gradient terms into
  // chunk b, so the sums do not depend on which thread took which block.
  const int threads = static_cast<int>(std::min<std::int64_t>(num_threads(), tokens));
  std::atomic<std::int64_t> next{0};
#pragma omp parallel num_threads(threads)
  for (std::int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1)) {
    rope_tokens(plan, tokens * b / blocks, tokens * (b + 1) / blocks, static_cast<int>(b));
  }
  // weight gradients: the chunks added in a fixed order into chunk 0
  for (int k = 0; k < plan.num_blocks; ++k) {
    double* g = plan.blocks[k].weight_grad;
    if (g == nullptr) continue;
    for (std::int64_t c = 1; c < blocks; ++c) {
      for (std::int64_t j = 0; j < plan.head_dim; ++j) g[j] += g[c * plan.head_dim + j];
    }
  }
}

}  // namespace detail
}  // namespace tilerope
