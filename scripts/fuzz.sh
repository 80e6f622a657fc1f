#!/usr/bin/env bash
# Runs each libFuzzer target of BUILD (a build with -DTILEROPE_BUILD_FUZZERS=ON, as
# scripts/sanitize.sh makes) for SECONDS (or for N inputs: runs=N) over its seed corpus (fuzz/corpus/TARGET, plus
# tests/configs and tests/cases for the readers) and dictionary, printing libFuzzer's final
# statistics. New inputs go to BUILD/fuzz-corpus/TARGET; a crash, a sanitizer report or a leak
# stops the target with its input saved in BUILD/fuzz-findings and fails this script.
#   scripts/fuzz.sh BUILD SECONDS [TARGET...]     (targets: npy config cases api; default all)
#   scripts/fuzz.sh BUILD runs=10000000 api        (a long run: docs/reliability.md)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1 seconds=$2
shift 2
targets=("$@")
((${#targets[@]})) || targets=(npy config cases api)
mkdir -p "$build/fuzz-findings"
for t in "${targets[@]}"; do
  seeds=(fuzz/corpus/"$t")
  [ "$t" = config ] && seeds+=(tests/configs)
  [ "$t" = cases ] && seeds+=(tests/cases)
  dict=()
  [ -f fuzz/dict/"$t".dict ] && dict=(-dict=fuzz/dict/"$t".dict)
  mkdir -p "$build/fuzz-corpus/$t"
  limit=(-max_total_time="$seconds")
  [[ $seconds == runs=* ]] && limit=(-runs="${seconds#runs=}")
  echo "== fuzz_$t: ${seconds}"
  start=$(date +%s)
  # one job; -timeout: an input slower than 10 s is a finding (a hang)
  "$build/fuzz/fuzz_$t" "${limit[@]}" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 "${dict[@]}" -artifact_prefix="$build/fuzz-findings/$t-" \
    "$build/fuzz-corpus/$t" "${seeds[@]}" 2>"$build/fuzz-$t.log" ||
    { tail -40 "$build/fuzz-$t.log"; echo "fuzz_$t: a finding (above)"; exit 1; }
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^stat::new_units_added" "$build/fuzz-$t.log"
  grep -E "cov: [0-9]+" "$build/fuzz-$t.log" | tail -1 | sed -E 's/.*(cov: [0-9]+ ft: [0-9]+ corp: [^ ]+).*/final \1/'
  echo "fuzz_$t: $(($(date +%s) - start)) s, no finding"
done
