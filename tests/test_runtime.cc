// Thread count and SIMD target selection.

#include <gtest/gtest.h>

#include <algorithm>

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
