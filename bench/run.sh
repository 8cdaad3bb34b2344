#!/usr/bin/env bash
# The overlap benchmark and the scale model in one command (docs/benchmarks.md):
#   bash bench/run.sh [run.py arguments, e.g. --transport model]
# Builds co2 if needed (BUILD_DIR, default build), runs bench/overlap/run.py with the CPU-burn
# and digits-MLP tables, then bench/scale/scale.py calibrated from what was just measured.
# Tables go to stdout; bench/results/ gets overlap.json, overlap_ratio.png, scale.json and scale.png.
# Namespaces (when run as root) are always removed, also on Ctrl-C.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
out="${CO2_BENCH_OUT:-$root/bench/results}"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" >/dev/null
fi
ninja -C "$build" -j "${CO2_JOBS:-2}" overlap-bench >/dev/null
/usr/bin/python3 "$root/bench/overlap/run.py" --build "$build" --out "$out" --burn --digits "$@"
echo
/usr/bin/python3 "$root/bench/scale/scale.py" --measured "$out/overlap.json" --out "$out"
