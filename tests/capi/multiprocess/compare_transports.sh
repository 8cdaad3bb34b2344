#!/usr/bin/env bash
# Every collective and every algorithm over UCX between W real processes (launched by co2run, TCP
# on loopback) must give results bit-identical to the local transport (W threads) for the same
# inputs.   compare_transports.sh WORKER CO2RUN W
set -uo pipefail
worker=$1 co2run=$2 world=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/local" "$work/ucx"

if ! timeout 300 "$worker" --threads "$world" "$work/local"; then
  echo "FAIL: the local-transport run failed"; exit 1
fi
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo} CO2_LOG_LEVEL=info
# Transport AUTO must pick UCX by itself (co2run's environment says: processes); info logs say so.
if ! timeout 300 "$co2run" --nproc-per-node "$world" "$worker" "$work/ucx" 2>"$work/stderr"; then
  cat "$work/stderr"; echo "FAIL: the UCX run (co2run, $world processes) failed"; exit 1
fi
chosen=$(grep -c "transport ucx" "$work/stderr")
if [ "$chosen" -ne "$world" ]; then
  cat "$work/stderr"; echo "FAIL: transport AUTO chose UCX on $chosen of $world ranks"; exit 1
fi

compared=0 differ=0
for expected in "$work/local"/*.bin; do
  name=$(basename "$expected")
  if ! cmp -s "$expected" "$work/ucx/$name"; then
    echo "DIFFERENT: $name"; differ=$((differ + 1))
  fi
  compared=$((compared + 1))
done
# Every rank holds the same consensus (anchor, or the average), whatever the wire format.
for first in "$work"/{local,ucx}/*.consensus.rank0.bin; do
  for other in "${first%.rank0.bin}".rank*.bin; do
    if ! cmp -s "$first" "$other"; then
      echo "RANKS DIFFER: $other vs $(basename "$first")"; differ=$((differ + 1))
    fi
  done
done
extra=$(comm -13 <(ls "$work/local") <(ls "$work/ucx") | wc -l)
echo "$compared result files compared over $world processes: $differ differ, $extra unexpected"
[ "$compared" -gt 0 ] && [ "$differ" -eq 0 ] && [ "$extra" -eq 0 ]
