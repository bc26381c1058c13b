#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer via libfuzzer-sys) of the parsers and
# decoders, on the stable toolchain.
#
#   ./fuzz/run.sh [seconds-per-target] [target...]
#
# 1. installs a C++ compiler if missing (libFuzzer is C++), then builds every
#    target with SanitizerCoverage flags (all stable -C options; no nightly),
#    overflow checks and debug assertions on (fuzz/Cargo.toml);
# 2. replays every committed case in fuzz/regressions/<target>/ (seeds and
#    past findings): any failure stops here;
# 3. fuzzes each target for the given seconds (default 60), starting from
#    the regressions and the local corpus (fuzz/corpus, not committed);
#    FUZZ_JOBS targets run at once (default: 2 on a machine with ≥ 2 cores);
# 4. prints executions, edges covered (libFuzzer's `cov`) and features per
#    target. A finding is copied to fuzz/regressions/<target>/crash-* and
#    the script exits non-zero: fix the code, keep the file.
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_PER_TARGET=${1:-60}
shift || true
ALL_TARGETS=(args_tokenbucket args_slidinglog args_slidingcounter args_fixedwindow args_multi decode_tokenbucket decode_slidinglog decode_slidingcounter decode_fixedwindow decode_concurrency decode_codec)
if [ $# -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi
CARGO=${CARGO:-cargo}
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
OUT=target/$TRIPLE/release
NPROC=$(nproc 2>/dev/null || echo 1)
JOBS=${FUZZ_JOBS:-$(( NPROC >= 2 ? 2 : 1 ))}

command -v "$CARGO" >/dev/null || { echo "fuzz: cargo (Rust toolchain) is required" >&2; exit 1; }
if ! command -v c++ >/dev/null && ! command -v clang++ >/dev/null; then
  echo "fuzz: installing a C++ compiler (g++) for libFuzzer"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq g++ >/dev/null
fi

# Coverage instrumentation (what cargo-fuzz passes, minus the sanitizer: the
# fuzzed code is safe Rust, so ASan would add nothing but -Z flags). An
# explicit --target keeps build scripts uninstrumented.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing ${FUZZ_RUSTFLAGS:-}"
export CARGO_TARGET_DIR="$PWD/target"
echo "fuzz: building ${#TARGETS[@]} targets"
bins=()
for t in "${TARGETS[@]}"; do bins+=(--bin "$t"); done
"$CARGO" build --release --target "$TRIPLE" "${bins[@]}" -j "$NPROC" 2>&1 | grep -Ev '^\s*(Compiling|Downloaded|Downloading|Locking|Updating|Adding)' || true
for t in "${TARGETS[@]}"; do [ -x "$OUT/$t" ] || { echo "fuzz: build of $t failed" >&2; exit 1; }; done

# 2. Replay the committed cases, one process per target.
for t in "${TARGETS[@]}"; do
  mkdir -p "regressions/$t"
  files=(regressions/"$t"/*)
  [ -e "${files[0]}" ] || continue
  if ! "$OUT/$t" -runs=1 "${files[@]}" >"target/replay-$t.log" 2>&1; then
    echo "fuzz: REGRESSION in $t:" >&2
    grep -E "Running:|panicked|^  [0-9]+: (redis_)?ratelimit" -A1 "target/replay-$t.log" | head -30 >&2
    exit 1
  fi
  echo "fuzz: $t: ${#files[@]} regression cases pass"
done

[ "$SECONDS_PER_TARGET" -gt 0 ] || exit 0

# 3. Fuzz.
run_one() {
  local t=$1 dict=()
  rm -rf "artifacts/$t"; mkdir -p "corpus/$t" "artifacts/$t"
  case $t in args_*) dict=(-dict=args.dict) ;; esac
  "$OUT/$t" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 -timeout=10 -rss_limit_mb=1024 \
    -max_len=4096 -artifact_prefix="artifacts/$t/" "${dict[@]}" "corpus/$t" "regressions/$t" \
    >"target/fuzz-$t.log" 2>&1
}
pids=() names=() failed=0
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.2; done
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s"
  run_one "$t" &
  pids+=($!) names+=("$t")
done
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then failed=1; fi
done

# 4. Report.
printf '\n%-22s %12s %9s %7s %7s %7s\n' target execs exec/s cov ft corpus
for t in "${TARGETS[@]}"; do
  log="target/fuzz-$t.log"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # A target that fails at once logs no "cov:" line: not an error here
  # (set -e, pipefail), the finding is reported below.
  last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1 || true)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
  n=$(find "corpus/$t" -type f | wc -l)
  printf '%-22s %12s %9s %7s %7s %7s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$n"
  for crash in "artifacts/$t"/crash-* "artifacts/$t"/timeout-* "artifacts/$t"/oom-*; do
    [ -e "$crash" ] || continue
    cp "$crash" "regressions/$t/"
    echo "fuzz: FINDING in $t: regressions/$t/$(basename "$crash")" >&2
    grep -E "panicked|^  [0-9]+: (redis_)?ratelimit" -A1 "$log" | head -20 >&2
    failed=1
  done
done
exit $failed
