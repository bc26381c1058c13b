#!/usr/bin/env bash
# Source coverage reached by the fuzz corpus (fuzz/corpus + fuzz/regressions),
# per file of the code under test (crates/ratelimit-core/src/*).
#
#   ./fuzz/coverage.sh            (after ./fuzz/run.sh has grown a corpus)
#
# Builds the targets with the "coverage" feature (symbolizer hooks, so
# libFuzzer's -print_coverage=1 works without a sanitizer runtime), replays
# each target's corpus once, and sums, per source file, the instrumented
# edges of each function that the best target covered (a lower bound of the
# union over targets).
set -euo pipefail
cd "$(dirname "$0")"
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
export CARGO_TARGET_DIR="$PWD/target/coverage-build"
# Without overflow checks here: each checked operation adds a panic edge
# that can never run, which would make the percentages meaningless.
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=false CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=false
cargo build --release --target "$TRIPLE" --features coverage -j "$(nproc)" 2>&1 | grep -E '^(error|warning: unused)' || true
OUT=$CARGO_TARGET_DIR/$TRIPLE/release
mkdir -p target
: >target/coverage.txt
for t in args_tokenbucket args_slidinglog args_slidingcounter args_fixedwindow decode_tokenbucket decode_slidinglog decode_slidingcounter decode_fixedwindow decode_concurrency decode_codec; do
  dirs=("regressions/$t")
  [ -d "corpus/$t" ] && dirs+=("corpus/$t")
  "$OUT/$t" -runs=0 -print_coverage=1 "${dirs[@]}" 2>&1 | sed -n "s/^\(UN\)\{0,1\}COVERED_FUNC: /$t /p" >>target/coverage.txt
done
python3 - target/coverage.txt <<'PY'
import re, sys, collections
best = {}  # (file, function) -> (covered, total)
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) hits: (\d+) edges: (\d+)/(\d+) (.*) (\S+):(\d+)$", line.strip())
    if not m:
        continue
    _, hits, cov, tot, func, path, _ = m.groups()
    core = re.search(r"crates/ratelimit-core/(src/.*)$", path)
    if not core:
        continue
    path = core.group(1)
    key = (path, func)
    c, t = int(cov), int(tot)
    if key not in best or c > best[key][0]:
        best[key] = (c, t)
files = collections.defaultdict(lambda: [0, 0, 0, 0])
for (path, func), (c, t) in best.items():
    f = files[path]
    f[0] += c; f[1] += t; f[2] += c > 0; f[3] += 1
print(f"{'file':34} {'edges':>13} {'functions':>11}")
tc = tt = 0
for path in sorted(files):
    c, t, fc, ft = files[path]
    tc += c; tt += t
    print(f"{path:34} {c:5}/{t:<5} {100*c/max(t,1):3.0f}% {fc:4}/{ft:<4}")
print(f"{'total':34} {tc:5}/{tt:<5} {100*tc/max(tt,1):3.0f}%")
uncovered = sorted((p, f) for (p, f), (c, t) in best.items() if c == 0)
if uncovered:
    print("functions never reached:", ", ".join(f"{f} ({p})" for p, f in uncovered))
PY
