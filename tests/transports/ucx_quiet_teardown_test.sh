#!/usr/bin/env bash
# A clean run over UCX ends without UCX's own warnings: the peers' goodbyes that arrive after a
# rank stopped receiving are taken off the unexpected queue before the worker is destroyed
# (UCX would report each one, "unexpected tag-receive descriptor ... was not matched").
#   ucx_quiet_teardown_test.sh CO2RUN PROGRAM [ARGS...]   (4 processes, 5 runs)
set -u
co2run=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0
for run in 1 2 3 4 5; do
  if ! "$co2run" --nproc-per-node 4 "$@" >"$out" 2>&1; then
    cat "$out"
    echo "FAIL: run $run exited nonzero"
    exit 1
  fi
  if grep -E "UCX +(WARN|ERROR)" "$out"; then
    echo "FAIL: run $run: UCX reported the lines above"
    fail=1
  fi
done
[ "$fail" = 0 ] && echo "5 runs of 4 processes, no UCX warning"
exit $fail
