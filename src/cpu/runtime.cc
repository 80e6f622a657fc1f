#include "tilerope/runtime.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cpu/cpu_plan.h"
#include "hwy/targets.h"
#include "tilerope/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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
  return detail::cpu_class_of(detail::this_cpu()).prefetch_bytes;
}

void force_target(std::string_view name);

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

std::string cpu_class() {
  const detail::cpu_identity id = detail::this_cpu();
  return std::string(detail::cpu_class_of(id).name) + " (family " + std::to_string(id.family) +
         ", model " + std::to_string(id.model) + ")";
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
  detail::apply_env_target();
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return name_of(targets & -targets);
}

std::string_view version() { return "0.1.0"; }

namespace detail {

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

cpu_identity this_cpu() {
  cpu_identity id;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return id;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  id.vendor = vendor;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return id;
  const int base_family = static_cast<int>((a >> 8) & 0xf);
  const int base_model = static_cast<int>((a >> 4) & 0xf);
  id.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  id.model = base_family == 0xf || base_family == 0x6
                 ? base_model + (static_cast<int>((a >> 16) & 0xf) << 4)
                 : base_model;
#endif
  return id;
}

// Each class's prefetch distance and kernel paths, from the runs in docs/performance.md ("CPU
// classes"). A class not measured takes Zen 3's row: no prefetch, the staged paths.
cpu_class_info cpu_class_of(const cpu_identity& id) {
  if (id.vendor == "GenuineIntel") return {"Intel", 2048, true, true};
  if (id.vendor == "AuthenticAMD" || id.vendor == "HygonGenuine") {
    if (id.family >= 0x1a) return {"AMD Zen 5", 4096, true, false};
    if (id.family == 0x19) {
      const bool zen4 = (id.model >= 0x10 && id.model <= 0x1f) ||
                        (id.model >= 0x60 && id.model <= 0x7f) || id.model >= 0xa0;
      return {zen4 ? "AMD Zen 4" : "AMD Zen 3", 0, false, false};
    }
    return {"AMD before Zen 3", 0, false, false};
  }
  return {"other", 0, false, false};
}

namespace {
// A kernel path chosen per CPU class (cpu_class_info) that the kernel tests can set: -1 (the
// class's default), 0 or 1.
class class_default {
 public:
  explicit class_default(bool cpu_class_info::*field) : field_(field) {}
  bool taken() const {
    const int v = set_to_.load();
    if (v >= 0) return v != 0;
    static const cpu_class_info cls = cpu_class_of(this_cpu());
    return cls.*field_;
  }
  void set(int v) { set_to_ = v < 0 ? -1 : v != 0; }

 private:
  bool cpu_class_info::*field_;
  std::atomic<int> set_to_{-1};
};

class_default held_16bit_norm_rows(&cpu_class_info::hold_16bit_norm_rows),
    streamed_f16_norm_backward(&cpu_class_info::stream_f16_norm_backward);
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

}  // namespace detail
}  // namespace tilerope
