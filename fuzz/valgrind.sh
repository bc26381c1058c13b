#!/usr/bin/env bash
# redis-server with the module under valgrind memcheck, driven through every
# module code path (fuzz/valgrind_workload.py), then FLUSHALL and shutdown.
# Fails when valgrind reports an error or a definite/indirect leak whose
# stack has a frame in the module (libredis_ratelimit / redis_ratelimit::).
#
#   RL_MODULE=path/to/libredis_ratelimit.so ./fuzz/valgrind.sh
#
# Debian's redis-server calls malloc/free from the system libjemalloc;
# --soname-synonyms makes memcheck replace those, so every allocation —
# the module's go through RedisModule_Alloc → zmalloc → malloc — is tracked.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
MODULE=${RL_MODULE:-$ROOT/target/release/libredis_ratelimit.so}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
[ -f "$MODULE" ] || { echo "valgrind.sh: module not built: $MODULE" >&2; exit 2; }
"$PY" -c 'import redis' 2>/dev/null || { echo "valgrind.sh: $PY lacks redis-py (make venv)" >&2; exit 2; }
if ! command -v valgrind >/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq valgrind >/dev/null
fi

DIR=$(mktemp -d /tmp/rl-valgrind.XXXXXX)
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo "valgrind.sh: logs in $DIR, port $PORT"
valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect \
  --errors-for-leak-kinds=definite,indirect --soname-synonyms=somalloc=libjemalloc.so* \
  --num-callers=40 --trace-children=no --child-silent-after-fork=no ${VALGRIND_EXTRA:-} \
  --log-file="$DIR/vg.%p.log" \
  "$REDIS_SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save "" --appendonly yes \
    --aof-use-rdb-preamble no --enable-debug-command yes --hz 50 --loadmodule "$MODULE" \
    --logfile "$DIR/redis.log" &
VG=$!
trap 'kill -9 $VG 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
  kill -0 $VG 2>/dev/null || { echo "valgrind.sh: redis-server exited" >&2; tail -20 "$DIR/redis.log" >&2; exit 1; }
  sleep 0.2
done
status=0
"$PY" "$HERE/valgrind_workload.py" "$PORT" || status=$?
redis-cli -p "$PORT" flushall >/dev/null || true
redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
wait $VG || true
trap - EXIT
# Children (AOF rewrite, BGSAVE) log to their own files; scan them all.
"$PY" - "$DIR" <<'PYEOF' || status=1
import glob, re, sys
blocks, module_blocks, lost = 0, [], {}
for path in sorted(glob.glob(sys.argv[1] + "/vg.*.log")):
    text = open(path, errors="replace").read()
    for m in re.finditer(r"(definitely|indirectly) lost: ([\d,]+) bytes", text):
        lost[m.group(1)] = lost.get(m.group(1), 0) + int(m.group(2).replace(",", ""))
    # An error or leak record: lines after "==pid== " until an empty record.
    for block in re.split(r"\n==\d+== \n", text):
        # Errors, and definite/indirect leaks (not "possibly lost" or
        # "still reachable", shown only with VALGRIND_EXTRA=--show-leak-kinds=all).
        if not re.search(r"Invalid|uninitialised|Mismatched|(definitely|indirectly) lost in loss record"
                         r"|overlap|free\(\)|Syscall param", block):
            continue
        blocks += 1
        if "redis_ratelimit" in block:
            module_blocks.append((path, block))
print(f"valgrind: {blocks} error/leak records in total (Redis's own included), "
      f"definitely lost {lost.get('definitely', 0)} B, indirectly lost {lost.get('indirectly', 0)} B")
print(f"module errors: {len(module_blocks)}")
for path, block in module_blocks[:10]:
    print(f"--- {path}\n{block}")
sys.exit(1 if module_blocks else 0)
PYEOF
[ $status -eq 0 ] && echo "valgrind.sh: OK" || echo "valgrind.sh: FAILED (see $DIR)"
exit $status
