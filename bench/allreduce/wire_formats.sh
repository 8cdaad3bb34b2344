#!/usr/bin/env bash
# The engine's outer all-reduce per wire format (fp32, bf16, int8, fp4): bench/allreduce/
# co2_wire_allreduce.c over UCX/TCP, on loopback and on rate-capped links (one network namespace
# per rank, tc tbf on every veth: bench/overlap/netns.sh). Prints one table per link: seconds per
# all-reduce, GB/s of payload (in the format) and of fp32 equivalent, and the speed-up over fp32.
#   bash bench/allreduce/wire_formats.sh [--rate 1gbit] [--min-mib 4] [--max-mib 64] [--ranks "2 4"]
#                                        [--loopback-only | --capped-only]
# Needs root for the namespaces (the capped part is skipped with a message otherwise).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

rate=1gbit min_mib=4 max_mib=64 ranks_list="2 4" loopback_only=0 capped_only=0 phase=""
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --min-mib) min_mib=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --loopback-only) loopback_only=1; shift ;;
    --capped-only) capped_only=1; shift ;;
    --capped-phase) phase=capped; shift ;;  # internal: runs inside netns.sh
    *) echo "usage: $0 [--rate RATE] [--min-mib N] [--max-mib N] [--ranks \"2 4\"] [--loopback-only|--capped-only]" >&2; exit 2 ;;
  esac
done

build=$root/${BUILD_DIR:-build}
bin=$build/bench/co2_wire_allreduce
formats="fp32 bf16 int8 fp4"
port=$((29700 + $$ % 200))

if [ -z "$phase" ]; then
  ninja -C "$build" bench/co2_wire_allreduce launcher/co2run >/dev/null
fi

# run FORMAT W LINK: rank 0's data lines.
run() {
  local format=$1 world=$2 link=$3 i pids=() tmp
  port=$((port + 1))
  if [ "$link" = loopback ]; then
    UCX_TLS=tcp UCX_NET_DEVICES=lo CO2_LOG_LEVEL=warn "$build/launcher/co2run" --nproc-per-node "$world" \
      --master-port "$port" "$bin" "$format" "$min_mib" "$max_mib" 2>/dev/null |
      sed -n 's/^\[rank 0\] //p' | grep -v '^#' || true
    return
  fi
  tmp=$(mktemp -d)
  for ((i = 0; i < world; i++)); do
    ip netns exec "${CO2_NETNS_PREFIX}r$i" env RANK=$i WORLD_SIZE="$world" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="$CO2_NETNS_ADDR_0" MASTER_PORT="$port" UCX_TLS=tcp UCX_NET_DEVICES="eth$i" CO2_LOG_LEVEL=warn \
      "$bin" "$format" "$min_mib" "$max_mib" >"$tmp/out.$i" 2>"$tmp/err.$i" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || cat "$tmp"/err.* >&2; done
  grep -v '^#' "$tmp/out.0" || true
  rm -rf "$tmp"
}

table() {
  local link=$1 world format tmp
  tmp=$(mktemp -d)
  for world in $ranks_list; do
    for format in $formats; do run "$format" "$world" "$link" >"$tmp/$format.$world"; done
  done
  /usr/bin/python3 - "$tmp" "$link" "$ranks_list" "$formats" <<'PY'
import os, sys
tmp, link, ranks, formats = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
def load(name):
    out = {}
    path = os.path.join(tmp, name)
    if os.path.exists(path):
        for line in open(path):
            f = line.split()
            if len(f) >= 5:
                out[int(f[0])] = (float(f[1]), float(f[2]), float(f[3]), int(f[4]))
    return out
print(f"\n== {link}: the engine's outer all-reduce; GB/s = bytes / time (payload: in the format; "
      f"fp32 eq.: count x 4); sent: bytes rank 0 sent")
print(f"{'W':>2} {'fp32 bytes':>10} {'format':>6} {'ms':>9} {'payload GB/s':>12} {'fp32eq GB/s':>11} "
      f"{'sent':>10} {'vs fp32':>8}")
for w in ranks:
    rows = {f: load(f"{f}.{w}") for f in formats}
    for b in sorted(rows["fp32"]):
        for f in formats:
            if b not in rows[f]:
                continue
            s, pay, eq, sent = rows[f][b]
            speedup = rows["fp32"][b][0] / s
            print(f"{w:>2} {b:>10} {f:>6} {s * 1e3:>9.1f} {pay:>12.3f} {eq:>11.3f} {sent:>10} {speedup:>7.2f}x")
PY
  rm -rf "$tmp"
}

if [ "$phase" = capped ]; then
  table "capped at $CO2_NETNS_RATE per rank link"
  exit 0
fi

echo "co2 outer all-reduce per wire format, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$capped_only" = 1 ] || table loopback
if [ "$loopback_only" = 1 ]; then exit 0; fi
netns=$root/bench/overlap/netns.sh
if ! bash "$netns" check; then
  echo "skipping the rate-capped link: no privilege to create network namespaces (see above)"
  exit 0
fi
max_world=0
for w in $ranks_list; do [ "$w" -gt "$max_world" ] && max_world=$w; done
bash "$netns" run --ranks "$max_world" --rate "$rate" --prefix co2wf -- \
  env BUILD_DIR="${BUILD_DIR:-build}" bash "$0" --capped-phase --min-mib "$min_mib" --max-mib "$max_mib" --ranks "$ranks_list"
