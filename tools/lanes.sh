#!/usr/bin/env bash
# lanes.sh JOBS LOGDIR COMMAND NAME... — run COMMAND (a shell command line
# in which {} stands for the name) for every NAME,
# at most JOBS at a time, each with its output in LOGDIR/NAME.log; print a
# run's log whole (under a "== NAME" line) as soon as it ends, so the output
# reads as if the runs had been made one after another; record "NAME
# SECONDS EXIT" in LOGDIR/times. Exits 0 when every run did, else 1.
#
# make test-py runs the integration suites of the four servers in four
# lanes with it: a suite run waits on its servers far more than it computes
# (a quarter of one core, measured), so four of them share the 2 cores of
# the CI machine without slowing each other much.
set -uo pipefail
jobs=$1 logdir=$2 cmd=$3
shift 3
mkdir -p "$logdir"
: > "$logdir/times"
declare -A pid_of_name=() start_of=()
rc=0

finish() {  # finish NAME EXIT: report one run
  local name=$1 code=$2
  local secs=$(( $(date +%s) - start_of[$name] ))
  echo "== $name (${secs} s, exit $code)"
  cat "$logdir/$name.log"
  echo "$name $secs $code" >> "$logdir/times"
  [ "$code" = 0 ] || rc=1
}

reap_one() {  # wait for any run to end, then report it
  local done_pid code name
  wait -n -p done_pid "${pid_of_name[@]}"
  code=$?
  for name in "${!pid_of_name[@]}"; do
    if [ "${pid_of_name[$name]}" = "$done_pid" ]; then
      unset "pid_of_name[$name]"
      finish "$name" "$code"
      return
    fi
  done
}

for name in "$@"; do
  while [ "${#pid_of_name[@]}" -ge "$jobs" ]; do reap_one; done
  start_of[$name]=$(date +%s)
  bash -c "${cmd//\{\}/$name}" > "$logdir/$name.log" 2>&1 &
  pid_of_name[$name]=$!
done
while [ "${#pid_of_name[@]}" -gt 0 ]; do reap_one; done
exit $rc
