#!/usr/bin/env bash
# What sharded outer state costs in communication: reduce_scatter + allgather_shards against one
# all-reduce of the same buffer (bench/allreduce/sharded_allreduce.cpp), per wire format, over
# UCX/TCP loopback between processes (co2run) and over the local transport between threads.
#   bash bench/allreduce/sharded.sh [--min-mib 4] [--max-mib 64] [--ranks "2 4"]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

min_mib=4 max_mib=64 ranks_list="2 4"
while [ $# -gt 0 ]; do
  case $1 in
    --min-mib) min_mib=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    *) echo "usage: $0 [--min-mib N] [--max-mib N] [--ranks \"2 4\"]" >&2; exit 2 ;;
  esac
done

build=$root/${BUILD_DIR:-build}
bin=$build/bench/sharded_allreduce
ninja -C "$build" bench/sharded_allreduce launcher/co2run >/dev/null
port=$((29500 + $$ % 300))

for world in $ranks_list; do
  for format in fp32 bf16 int8 fp4; do
    port=$((port + 1))
    UCX_TLS=tcp UCX_NET_DEVICES=lo "$build/launcher/co2run" --nproc-per-node "$world" --master-port "$port" \
      "$bin" launched 0 "$min_mib" "$max_mib" "$format" | sed -n 's/^\[rank 0\] //p'
  done
  "$bin" local "$world" "$min_mib" "$max_mib" fp32
done
