#!/usr/bin/env bash
# A link with a per-flow cap (issue 27, item 2): each rank's link capped at RATE, and each TCP
# connection at FLOW below it (bench/overlap/netns.sh --flow-rate: htb, 16 hashed flow classes).
# Beside each other in one run: iperf3 with 1 and K streams, ucx_perftest tag_bw (one UCX
# endpoint), and co2's outer all-reduce in fp32 (bench/allreduce/co2_wire_allreduce.c) at W = 2
# and 4, with 1 and more connections per peer (CO2_UCX_CONNECTIONS). Prints Gbit/s per rank and
# link and the fraction of RATE each gets. Without --flow-rate: the plain capped link (tbf).
#   bash bench/allreduce/per_flow.sh [--rate 1gbit] [--flow-rate 250mbit|none] [--mib 64] [--ranks "2 4"]
#                                    [--connections "1 4 8"]
# Needs root (namespaces); iperf3 is optional (apt-get install iperf3).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

rate=1gbit flow_rate=250mbit mib=64 ranks_list="2 4" connections_list="1 4 8" phase=""
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --flow-rate) flow_rate=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --connections) connections_list=$2; shift 2 ;;
    --inner) phase=inner; shift ;;  # internal: runs inside netns.sh
    *) echo "usage: $0 [--rate RATE] [--flow-rate FLOW] [--mib N] [--ranks \"2 4\"]" >&2; exit 2 ;;
  esac
done
build=$root/${BUILD_DIR:-build}
bin=$build/bench/co2_wire_allreduce
port=$((29400 + $$ % 200))

if [ -z "$phase" ]; then
  ninja -C "$build" bench/co2_wire_allreduce >/dev/null
  max_world=0
  for w in $ranks_list; do [ "$w" -gt "$max_world" ] && max_world=$w; done
  [ "$max_world" -ge 2 ] || max_world=2
  echo "per-flow-capped link, $(date -u +%FT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  flow_args=()
  [ "$flow_rate" = none ] || flow_args=(--flow-rate "$flow_rate")
  exec bash "$root/bench/overlap/netns.sh" run --ranks "$max_world" --rate "$rate" "${flow_args[@]}" \
    --prefix co2f -- bash "$0" --rate "$rate" --flow-rate "$flow_rate" --mib "$mib" --ranks "$ranks_list" \
    --connections "$connections_list" --inner
fi

ns() { echo "${CO2_NETNS_PREFIX}r$1"; }
rate_bits=$(( $(echo "$rate" | sed 's/gbit/000000000/; s/mbit/000000/; s/kbit/000/') ))
row() {  # row TOOL DETAIL BITS_PER_S
  awk -v t="$1" -v d="$2" -v b="$3" -v r="$rate_bits" 'BEGIN { printf "%-14s %-22s %8.3f %8.2f\n", t, d, b / 1e9, b / r }'
}

echo "== rank link $rate, per-flow cap $flow_rate"
printf "%-14s %-22s %8s %8s\n" tool detail "Gbit/s" "of link"

if command -v iperf3 >/dev/null; then
  for streams in 1 4 16; do
    port=$((port + 1))
    ip netns exec "$(ns 1)" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    bits=$(ip netns exec "$(ns 0)" iperf3 -c "$CO2_NETNS_ADDR_1" -p "$port" -t 5 -P "$streams" -J 2>/dev/null |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
    wait "$server" || true
    row iperf3 "$streams stream(s)" "$bits"
  done
else
  echo "iperf3: not installed (apt-get install iperf3); its rows are left out"
fi

bytes=$((mib << 20))
port=$((port + 1))
UCX_TLS=tcp UCX_NET_DEVICES=eth1 ip netns exec "$(ns 1)" ucx_perftest -p "$port" -t tag_bw -s "$bytes" -n 8 >/dev/null 2>&1 &
server=$!
sleep 0.5
mbps=$(UCX_TLS=tcp UCX_NET_DEVICES=eth0 ip netns exec "$(ns 0)" ucx_perftest "$CO2_NETNS_ADDR_1" -p "$port" -t tag_bw \
  -s "$bytes" -n 8 2>/dev/null | awk '/^Final:/ { print $7 }')
wait "$server" || true
row ucx_perftest "tag_bw, $mib MiB" "$(awk -v m="${mbps:-0}" 'BEGIN { print m * 1048576 * 8 }')"

# co2: each rank sends 2(W-1)/W of the model per all-reduce; Gbit/s = those bits / time.
for world in $ranks_list; do
 for connections in $connections_list; do
  port=$((port + 1))
  tmp=$(mktemp -d)
  pids=()
  for ((i = 0; i < world; i++)); do
    ip netns exec "$(ns $i)" env RANK=$i WORLD_SIZE="$world" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="$CO2_NETNS_ADDR_0" MASTER_PORT="$port" UCX_TLS=tcp UCX_NET_DEVICES="eth$i" CO2_LOG_LEVEL=warn \
      CO2_UCX_CONNECTIONS="$connections" \
      "$bin" fp32 "$mib" "$mib" >"$tmp/out.$i" 2>"$tmp/err.$i" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || cat "$tmp"/err.* >&2; done
  seconds=$(grep -v '^#' "$tmp/out.0" | awk '{ print $2 }')
  rm -rf "$tmp"
  row "co2 W=$world" "$connections conn, $mib MiB" "$(awk -v s="${seconds:-0}" -v b="$bytes" -v w="$world" \
    'BEGIN { print (s > 0 ? 2 * (w - 1) / w * b * 8 / s : 0) }')"
 done
done
