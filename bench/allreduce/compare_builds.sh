#!/usr/bin/env bash
# co2's loopback all-reduce of two builds side by side: the same co2_allreduce.c against each
# build's libco2, alternating in one run, so that a change is measured against its base on the
# same machine at the same time. Prints the median bus bandwidth, the paired ratios' median and
# range, and the CPU per bus byte as cores@25G (see run.sh).
#   bash bench/allreduce/compare_builds.sh BASE_BUILD_DIR BASE_SOURCE_DIR [REPS] [RANKS...]
# e.g. git worktree add /tmp/base <commit> && meson setup /tmp/base-build /tmp/base &&
#      ninja -C /tmp/base-build && bash bench/allreduce/compare_builds.sh /tmp/base-build /tmp/base
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/${BUILD_DIR:-build}
base_build=$(cd "$1" && pwd) base_source=$(cd "$2" && pwd)
reps=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
ranks=("${@:-2 4}")
ninja -C "$build" bench/co2_allreduce launcher/co2run >/dev/null
base_bin=$(mktemp)
out=$(mktemp)
trap 'rm -f "$base_bin" "$out"' EXIT
cc -O2 -std=c99 -I"$base_source/capi/include" -I"$here" "$here/co2_allreduce.c" -o "$base_bin" \
  -L"$base_build" -lco2 -Wl,-rpath,"$base_build"

port=29300
run() {  # BIN W: data lines of rank 0
  port=$((port + 1))
  UCX_TLS=tcp UCX_NET_DEVICES=lo "$build/launcher/co2run" --nproc-per-node "$2" --master-port "$port" \
    "$1" 1 64 2>/dev/null | sed -n 's/^\[rank 0\] //p' | grep -v '^#' || true
}
echo "load before: $(cat /proc/loadavg)"
for w in ${ranks[*]}; do
  for ((rep = 1; rep <= reps; rep++)); do
    run "$base_bin" "$w" | sed "s/^/$w base /" >>"$out"
    run "$build/bench/co2_allreduce" "$w" | sed "s/^/$w new /" >>"$out"
  done
done
echo "load after: $(cat /proc/loadavg)"
/usr/bin/python3 - "$out" <<'PY'
import collections, statistics as st, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 7:
        w, build, size = int(f[0]), f[1], int(f[2])
        busbw, cpu = float(f[5]), float(f[6])
        runs[(w, build, size)].append((busbw, cpu / (2 * (w - 1) / w * size) * 3.125e9))
print(" W      bytes  busbw base  busbw new  new/base (min-max)   cores@25G base  new")
for w, size in sorted({(k[0], k[2]) for k in runs}):
    base, new = runs[(w, "base", size)], runs[(w, "new", size)]
    ratios = [n[0] / b[0] for n, b in zip(new, base)]
    if not ratios:
        continue
    median = lambda xs: st.median(xs)
    print(f"{w:2} {size:10} {median([b[0] for b in base]):11.3f} {median([n[0] for n in new]):10.3f}"
          f" {median(ratios):6.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
          f" {median([b[1] for b in base]):14.2f} {median([n[1] for n in new]):5.2f}")
PY
