#!/usr/bin/env bash
# The checking builds, run by .ci/run after the tests:
#  1. build-asan: clang, AddressSanitizer + UndefinedBehaviorSanitizer (any report fails), with
#     libFuzzer coverage. Runs the unit tests, the kernel tests on every SIMD target they force
#     (scalar, sse4, avx2, avx512, those this CPU has; the long sweeps of the release run left
#     out, below), the concurrency tests, the CLI's error and hostile-input tests, then each
#     fuzz target for FUZZ_SECONDS (default 30) from its seed corpus.
#  2. build-tsan: clang, ThreadSanitizer, with LLVM's OpenMP runtime and its Archer tool (which
#     tells TSan about OpenMP's barriers and tasks; without it every parallel region reports
#     races inside libomp). Runs the concurrency tests: host threads, each call with its own
#     OpenMP team.
# The kernels in these builds are compiled for the four forced targets only (CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${FUZZ_SECONDS:-30}
jobs=$(nproc)
configure() {  # DIR SANITIZERS [CMAKE ARGS...]
  local dir=$1 sanitizers=$2
  shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DTILEROPE_SANITIZE="$sanitizers" "$@" >/dev/null
}
phase() { echo "== $1 ($(($(date +%s) - t0)) s)"; }
t0=$(date +%s)

# --- 1. ASan + UBSan --------------------------------------------------------------------------
phase "build-asan: configure and build"
configure build-asan address,undefined -DTILEROPE_BUILD_FUZZERS=ON
cmake --build build-asan -j "$jobs" --target tilerope_tests tilerope_kernel_tests \
  tilerope_concurrency_tests tilerope_cli fuzz_npy fuzz_config fuzz_cases fuzz_api
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
phase "build-asan: unit tests"
build-asan/tests/tilerope_tests --gtest_filter=-*Exhaustive* --gtest_brief=1
# The release run (ctest) keeps these: an exhaustive f32 conversion sweep and three repetitions
# of whole paths at sizes large enough for streaming stores, minutes each when instrumented;
# and two QK RMSNorm sweeps (a minute each here) run on avx2 only.
long_sweeps="*EveryF32BitPattern*:*StreamingOutOfPlaceEqualsInPlace*"
long_sweeps+=":*QkNormBackwardStreamingEqualsInPlace*:*PrefetchDistanceDoesNotChangeResults*"
for target in scalar sse4 avx2 avx512; do
  phase "build-asan: kernel tests, $target"
  left_out=$long_sweeps
  [ "$target" = avx2 ] || left_out+=":*QkNormSweepMatchesGolden*:*QkNormBackwardOverRunsOfTokens*"
  status=0
  TILEROPE_CPU_TARGET=$target TILEROPE_NUM_THREADS=2 build-asan/tests/tilerope_kernel_tests \
    --gtest_filter="-$left_out" --gtest_brief=1 || status=$?
  if [ "$status" = 77 ]; then echo "($target: this CPU cannot run it)"; elif [ "$status" != 0 ]; then exit "$status"; fi
done
phase "build-asan: concurrency tests"
build-asan/tests/tilerope_concurrency_tests --gtest_brief=1
phase "build-asan: CLI error and hostile-input tests"
/usr/bin/python3 tests/cli/test_cli_errors.py build-asan/tools/tilerope/tilerope | tail -1
/usr/bin/python3 tests/cli/test_hostile.py build-asan/tools/tilerope/tilerope | tail -1
phase "build-asan: fuzz targets, ${fuzz_seconds} s each"
ASAN_OPTIONS=detect_leaks=1 scripts/fuzz.sh build-asan "$fuzz_seconds"

# --- 2. TSan ------------------------------------------------------------------------------------
phase "build-tsan: configure and build"
configure build-tsan thread
cmake --build build-tsan -j "$jobs" --target tilerope_concurrency_tests
phase "build-tsan: concurrency tests"
archer=/usr/lib/llvm-$(clang++ -dumpversion | cut -d. -f1)/lib/libarcher.so
[ -f "$archer" ] || { echo "no $archer (libomp-dev): run scripts/setup.sh"; exit 1; }
OMP_TOOL_LIBRARIES=$archer TSAN_OPTIONS="halt_on_error=1:ignore_noninstrumented_modules=1" \
  TILEROPE_NUM_THREADS=2 build-tsan/tests/tilerope_concurrency_tests --gtest_brief=1
phase "done"
