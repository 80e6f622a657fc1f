// Thread count and SIMD target selection.

#include <gtest/gtest.h>

#include <algorithm>

#include "cpu/cpu_plan.h"
#include "tilerope/error.h"
#include "tilerope/runtime.h"

namespace {

using namespace tilerope;

TEST(Runtime, ThreadCountIsSetAndChecked) {
  const int before = num_threads();
  EXPECT_GE(before, 1);
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  try {
    set_num_threads(0);
    FAIL();
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("num_threads (0)"), std::string::npos);
  }
  set_num_threads(before);
}

TEST(Runtime, CpuClassesAndTheirPaths) {
  using detail::cpu_class_of;
  struct known {
    const char* vendor;
    int family, model;
    std::string name;
    std::int64_t prefetch;
    bool held;
  };
  const known table[] = {
      {"GenuineIntel", 6, 143, "Intel", 2048, true},      // Sapphire Rapids
      {"AuthenticAMD", 26, 2, "AMD Zen 5", 4096, true},   // Turin
      {"AuthenticAMD", 25, 0x11, "AMD Zen 4", 0, false},  // Genoa
      {"AuthenticAMD", 25, 0xa0, "AMD Zen 4", 0, false},  // Bergamo
      {"AuthenticAMD", 25, 0x01, "AMD Zen 3", 0, false},  // Milan
      {"AuthenticAMD", 25, 0x21, "AMD Zen 3", 0, false},  // Vermeer
      {"AuthenticAMD", 23, 0x31, "AMD before Zen 3", 0, false},
      {"CentaurHauls", 6, 15, "other", 0, false},
  };
  for (const auto& k : table) {
    const auto c = cpu_class_of({k.vendor, k.family, k.model});
    EXPECT_EQ(c.name, k.name) << k.vendor << " " << k.family << " " << k.model;
    EXPECT_EQ(c.prefetch_bytes, k.prefetch) << k.name;
    EXPECT_EQ(c.hold_16bit_norm_rows, k.held) << k.name;
    EXPECT_EQ(c.stream_f16_norm_backward, k.name == "Intel") << k.name;
  }
  // this machine: a vendor read from cpuid and a class named with its family and model
  const std::string here = cpu_class();
  EXPECT_NE(here.find("(family "), std::string::npos) << here;
  EXPECT_EQ(here.rfind(cpu_class_of(detail::this_cpu()).name, 0), 0u) << here;
}

TEST(Runtime, PrefetchDistanceIsSetAndChecked) {
  const std::int64_t before = prefetch_bytes();
  EXPECT_GE(before, 0);
  set_prefetch_bytes(4096);
  EXPECT_EQ(prefetch_bytes(), 4096);
  set_prefetch_bytes(0);
  EXPECT_EQ(prefetch_bytes(), 0);
  for (const std::int64_t bad : {std::int64_t{-1}, std::int64_t{(1 << 20) + 1}}) {
    try {
      set_prefetch_bytes(bad);
      FAIL() << bad;
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("prefetch_bytes (" + std::to_string(bad) + ")"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(prefetch_bytes(), 0);  // unchanged by the rejected value
  }
  set_prefetch_bytes(before);
}

TEST(Runtime, TargetsCanBeForcedAndUnknownNamesAreErrors) {
  const auto compiled = compiled_cpu_targets();
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), "scalar"), compiled.end());
  set_cpu_target("scalar");
  EXPECT_EQ(cpu_target(), "scalar");
  for (const auto& t : supported_cpu_targets()) {
    set_cpu_target(t);
    EXPECT_EQ(cpu_target(), t);
  }
  set_cpu_target("best");
  EXPECT_EQ(cpu_target(), supported_cpu_targets().back());
  try {
    set_cpu_target("avx9000");
    FAIL();
  } catch (const error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'avx9000'"), std::string::npos);
    EXPECT_NE(msg.find("scalar"), std::string::npos);
  }
  try {
    set_cpu_target("neon");  // compiled out on x86, or absent on Arm without it
    if (std::find(compiled.begin(), compiled.end(), "neon") == compiled.end()) FAIL();
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("not available"), std::string::npos);
  }
  set_cpu_target("best");
}

}  // namespace
