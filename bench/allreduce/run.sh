#!/usr/bin/env bash
# All-reduce bus bandwidth of co2 over UCX/TCP, side by side in one run with Open MPI's
# MPI_Allreduce, torch.distributed's gloo all_reduce and ucx_perftest point-to-point (tag_bw) on
# the same link: first on loopback, then on rate-capped links (one network namespace per rank on
# a bridge, tc tbf on every veth: bench/overlap/netns.sh). Prints one table per link.
#   bash bench/allreduce/run.sh [--rate 1gbit] [--max-mib 256] [--ranks "2 4"] [--loopback-only]
# Needs root for the namespaces (the capped part is skipped with a message otherwise). Open MPI
# runs on loopback only (its PMIx does not cross namespaces).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/scripts/common.sh"

rate=1gbit max_mib=256 ranks_list="2 4" loopback_only=0 phase=""
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --loopback-only) loopback_only=1; shift ;;
    --capped-phase) phase=capped; shift ;;  # internal: runs inside netns.sh
    *) echo "usage: $0 [--rate RATE] [--max-mib N] [--ranks \"2 4\"] [--loopback-only]" >&2; exit 2 ;;
  esac
done

build=$root/${BUILD_DIR:-build}
out_dir=$build/bench
co2_bin=$out_dir/co2_allreduce
mpi_bin=$out_dir/mpi_allreduce
port=29650

if [ -z "$phase" ]; then
  ensure_packages meson ninja-build libucx-dev ucx-utils openmpi-bin libopenmpi-dev python3-torch iproute2
  configure false
  ninja -C "$build" bench/co2_allreduce launcher/co2run >/dev/null
  mpicc -O2 -o "$mpi_bin" "$here/mpi_allreduce.c"
fi

# run_tool TOOL W LINK: prints the tool's data lines (bytes seconds algbw busbw).
run_tool() {
  local tool=$1 world=$2 link=$3 i pids=()
  local args=(1 "$max_mib")
  port=$((port + 1))
  if [ "$link" = loopback ]; then
    case $tool in
      co2) UCX_TLS=tcp UCX_NET_DEVICES=lo "$build/launcher/co2run" --nproc-per-node "$world" --master-port "$port" \
             "$co2_bin" "${args[@]}" 2>/dev/null | sed -n 's/^\[rank 0\] //p' ;;
      gloo) GLOO_SOCKET_IFNAME=lo "$build/launcher/co2run" --nproc-per-node "$world" --master-port "$port" \
             /usr/bin/python3 "$here/gloo_allreduce.py" "${args[@]}" 2>/dev/null | sed -n 's/^\[rank 0\] //p' ;;
      mpi) mpirun --allow-run-as-root --oversubscribe -np "$world" --mca pml ob1 --mca btl tcp,self \
             --mca btl_tcp_if_include lo "$mpi_bin" "${args[@]}" 2>/dev/null ;;
    esac | grep -v '^#' || true
    return
  fi
  # Capped: rank i runs in namespace ${CO2_NETNS_PREFIX}r$i on interface eth$i.
  local tmp
  tmp=$(mktemp -d)
  if [ "$tool" = mpi ]; then
    # Not measured here: Open MPI 4.1's ranks reach their daemon through PMIx over the loopback
    # of the daemon's namespace, which a rank in a namespace of its own cannot see ("OPAL ERROR:
    # Unreachable" in MPI_Init). ucx_perftest is the reference on capped links.
    rm -rf "$tmp"
    return
  fi
  for ((i = 0; i < world; i++)); do
    local cmd=("$co2_bin" "${args[@]}")
    [ "$tool" = gloo ] && cmd=(/usr/bin/python3 "$here/gloo_allreduce.py" "${args[@]}")
    ip netns exec "${CO2_NETNS_PREFIX}r$i" env RANK=$i WORLD_SIZE="$world" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="$CO2_NETNS_ADDR_0" MASTER_PORT="$port" UCX_TLS=tcp UCX_NET_DEVICES="eth$i" \
      GLOO_SOCKET_IFNAME="eth$i" "${cmd[@]}" >"$tmp/out.$i" 2>"$tmp/err.$i" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$tmp"/err.* >&2; }; done
  grep -v '^#' "$tmp/out.0" || true
  rm -rf "$tmp"
}

# ucx_perftest tag_bw between two ranks: prints "bytes GB/s" per size.
run_perftest() {
  local link=$1 mib bytes iters
  for ((mib = 1; mib <= max_mib; mib *= 4)); do
    bytes=$((mib << 20)) iters=$(( (512 << 20) / bytes )); [ $iters -lt 4 ] && iters=4
    local server=() client=() dev=lo addr=127.0.0.1 cdev=lo
    if [ "$link" != loopback ]; then
      server=(ip netns exec "${CO2_NETNS_PREFIX}r0") client=(ip netns exec "${CO2_NETNS_PREFIX}r1")
      dev=eth0 cdev=eth1 addr=$CO2_NETNS_ADDR_0
    fi
    port=$((port + 1))
    UCX_TLS=tcp UCX_NET_DEVICES=$dev "${server[@]}" ucx_perftest -p "$port" -t tag_bw -s "$bytes" -n "$iters" >/dev/null 2>&1 &
    local spid=$!
    sleep 0.5
    UCX_TLS=tcp UCX_NET_DEVICES=$cdev "${client[@]}" ucx_perftest "$addr" -p "$port" -t tag_bw -s "$bytes" -n "$iters" 2>/dev/null |
      awk -v b="$bytes" '/^Final:/ { printf "%d %.3f\n", b, $7 * 1048576 / 1e9 }'
    wait "$spid" || true
  done
}

# table LINK: runs everything on LINK and prints busbw per size and tool, with co2's ratios.
table() {
  local link=$1 world tool
  local tmp
  tmp=$(mktemp -d)
  run_perftest "$link" >"$tmp/p2p"
  for world in $ranks_list; do
    for tool in co2 mpi gloo; do run_tool "$tool" "$world" "$link" >"$tmp/$tool.$world"; done
  done
  /usr/bin/python3 - "$tmp" "$link" "$ranks_list" <<'PY'
import os, sys
tmp, link, ranks = sys.argv[1], sys.argv[2], sys.argv[3].split()
def load(name, column):
    out = {}
    path = os.path.join(tmp, name)
    if os.path.exists(path):
        for line in open(path):
            f = line.split()
            if len(f) > column:
                out[int(f[0])] = float(f[column])
    return out
p2p = load("p2p", 1)
print(f"\n== {link}: bus bandwidth GB/s (2(W-1)/W * bytes / time); p2p = ucx_perftest tag_bw, one direction")
print("   cores@25G: CPU seconds per second (all threads of a rank, its kernel time included) that")
print("   the rank would spend at 25 Gbit/s of bus bandwidth: its CPU time per bus byte x 3.125 GB/s")
print(f"{'W':>2} {'bytes':>10} {'co2':>7} {'mpi':>7} {'gloo':>7} {'p2p':>7} {'co2/mpi':>8} {'co2/best':>9} {'co2/p2p':>8}"
      f" {'cores@25G co2':>14} {'mpi':>6} {'gloo':>6}")
for w in ranks:
    co2, mpi, gloo = load(f"co2.{w}", 3), load(f"mpi.{w}", 3), load(f"gloo.{w}", 3)
    cpu = {tool: load(f"{tool}.{w}", 4) for tool in ("co2", "mpi", "gloo")}
    bus_factor = 2 * (int(w) - 1) / int(w)
    def cores(tool, b):
        seconds = cpu[tool].get(b)
        return f"{seconds / (bus_factor * b) * 3.125e9:.2f}" if seconds else "-"
    for b in sorted(co2):
        m, g, p = mpi.get(b), gloo.get(b), p2p.get(b)
        best = max([x for x in (m, g) if x] or [0])
        ratio = lambda a, d: f"{a / d:.2f}" if d else "-"
        fmt = lambda x: f"{x:.3f}" if x else "-"
        print(f"{w:>2} {b:>10} {co2[b]:>7.3f} {fmt(m):>7} {fmt(g):>7} {fmt(p):>7} {ratio(co2[b], m):>8} {ratio(co2[b], best):>9} {ratio(co2[b], p):>8}"
              f" {cores('co2', b):>14} {cores('mpi', b):>6} {cores('gloo', b):>6}")
PY
  rm -rf "$tmp"
}

if [ "$phase" = capped ]; then
  table "capped at $CO2_NETNS_RATE per rank link (mpi: not run in namespaces, see run_tool)"
  exit 0
fi

echo "co2 all-reduce benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r)"
table loopback
if [ "$loopback_only" = 1 ]; then exit 0; fi
netns=$root/bench/overlap/netns.sh
if ! bash "$netns" check; then
  echo "skipping the rate-capped link: no privilege to create network namespaces (see above)"
  exit 0
fi
max_world=0
for w in $ranks_list; do [ "$w" -gt "$max_world" ] && max_world=$w; done
bash "$netns" run --ranks "$max_world" --rate "$rate" --prefix co2ar -- \
  env BUILD_DIR="${BUILD_DIR:-build}" bash "$0" --capped-phase --max-mib "$max_mib" --ranks "$ranks_list"
