#!/usr/bin/env bash
# The GPU check (issue 7): one run on a GPU machine, at most ~8 minutes. Prints the driver and
# CUDA versions, builds co2 with CUDA and NCCL, runs the GPU tests and the benchmark table
# (bench/gpu.cpp; record the numbers in docs/benchmarks.md with the date).
# Without a usable GPU it builds, runs the GPU tests (they exit 77 = skipped), skips the
# benchmark and exits 0.
#
#   bash scripts/gpu-check.sh --prepare   on the build machine: copies GoogleTest (headers,
#                                         static libs, relocatable .pc files), meson (its
#                                         Python package) and ninja into .gpu-deps/ for a GPU
#                                         machine that has only the driver, CUDA and NCCL
#                                         and builds build-gpu (CUDA enabled), so that compile
#                                         errors surface before device time is spent
#   bash scripts/gpu-check.sh [--quick]   the check; BUILD_DIR_GPU (default build-gpu), CO2_JOBS
#   bash scripts/gpu-check.sh --executor  no GPU needed: the same feature table from the device
#                                         path on the host executor (BUILD_DIR, default build)
#
# The feature table: every feature of the device path (tests/runtime/backends/device/host_executor_test.cpp:
# co2 delayed and eager, diloco, localsgd, sync, penalties, clipping, compressed wires with error
# feedback, checkpoints; 1 and 2 ranks on one device; sharded outer state at 2 and 3 ranks and
# hierarchical co2 at 2 nodes x 2 ranks, with their checkpoints and the node check: the Sharded*
# and Hierarchical* rows) against the host backend, one row a test. Sharded co2 over a real NCCL
# needs a GPU per rank: the table's collective-transport row runs on the host executor only.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CO2_ROOT"
BUILD_DIR=${BUILD_DIR_GPU:-build-gpu}
deps="$CO2_ROOT/.gpu-deps"

# Runs a gtest binary of the feature test and prints "feature  pass|FAIL" rows; returns its status
# (77 = no usable device, printed as one row).
feature_table() {
  local binary=$1 where=$2 out rc
  out=$(timeout 300 "$binary" 2>&1); rc=$?
  printf '\n%-60s %s\n' "feature ($where)" "result"
  if [ "$rc" -eq 77 ]; then
    printf '%-60s %s\n' "all" "skipped (no usable GPU)"
    return 77
  fi
  printf '%s\n' "$out" | sed -n -E 's/^\[ +(OK|FAILED) +\] DeviceFeatures\.([A-Za-z0-9_]+) \(.*/\2 \1/p' |
    while read -r name result; do
      printf '%-60s %s\n' "$name" "$([ "$result" = OK ] && echo pass || echo FAIL)"
    done
  [ "$rc" -eq 0 ] || printf '%s\n' "$out" | grep -E "Failure|error" | head -20
  return "$rc"
}

if [ "${1:-}" = --executor ]; then
  cpu_build=${BUILD_DIR_CPU:-build}
  if [ ! -f "$cpu_build/build.ninja" ]; then
    meson setup "$cpu_build" -Dtests=true || exit 1
  fi
  ninja -C "$cpu_build" -j "$(jobs)" tests/runtime/device_host_executor_test || exit 1
  feature_table "$cpu_build/tests/runtime/device_host_executor_test" "host executor, no GPU"
  exit $?
fi

if [ "${1:-}" = --prepare ]; then
  rm -rf "$deps" && mkdir -p "$deps/include" "$deps/lib" "$deps/pkgconfig" || exit 1
  cp -r /usr/include/gtest /usr/include/gmock "$deps/include/" || exit 1
  cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$deps/lib/" || exit 1
  for pc in gtest gtest_main gmock gmock_main; do
    sed -e 's|^libdir=.*|libdir=${pcfiledir}/../lib|' -e 's|^includedir=.*|includedir=${pcfiledir}/../include|' \
      "/usr/lib/x86_64-linux-gnu/pkgconfig/$pc.pc" > "$deps/pkgconfig/$pc.pc" || exit 1
  done
  mkdir -p "$deps/python" "$deps/bin" || exit 1
  # meson, and pytest (with what it imports) for the elastic NCCL test.
  for package in mesonbuild pytest _pytest pluggy iniconfig packaging attr; do
    cp -r "$(/usr/bin/python3 -c "import $package, os; print(os.path.dirname($package.__file__))")" "$deps/python/" || exit 1
  done
  site=$(/usr/bin/python3 -c 'import pytest, os; print(os.path.dirname(os.path.dirname(pytest.__file__)))')
  [ ! -f "$site/py.py" ] || cp "$site/py.py" "$deps/python/" || exit 1  # pytest's shim of the old py library
  cp "$(command -v ninja)" "$deps/bin/" || exit 1
  log "prepared $deps ($(du -sh "$deps" | cut -f1)); carry it: run(carry: ['.gpu-deps'])"
  if command -v nvcc >/dev/null 2>&1; then
    log "build $BUILD_DIR here (CUDA enabled): the GPU machine then only rebuilds what its paths change"
    [ -f "$BUILD_DIR/build.ninja" ] || meson setup "$BUILD_DIR" -Dcuda=enabled -Dtests=true -Dbuildtype=release || exit 1
    ninja -C "$BUILD_DIR" -j "$(jobs)" || exit 1
  fi
  exit 0
fi
bench_args=()
[ "${1:-}" = --quick ] && bench_args=(--quick --max-millions 64 --repeats 3)

log "versions"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi: not found (no NVIDIA driver on this machine)"
fi
command -v nvcc >/dev/null 2>&1 || { log "error: nvcc not found (expected in /usr/local/cuda/bin)"; exit 1; }
nvcc --version | tail -n 2

# meson and ninja from .gpu-deps when the machine has none of its own.
[ -d "$deps/bin" ] && ! command -v ninja >/dev/null 2>&1 && export PATH="$PATH:$deps/bin"
[ -d "$deps/python" ] && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$deps/python"
MESON=(meson)
command -v meson >/dev/null 2>&1 || MESON=(python3 -m mesonbuild.mesonmain)
"${MESON[@]}" --version >/dev/null 2>&1 || { log "error: meson is not installed"; exit 1; }
command -v ninja >/dev/null 2>&1 || { log "error: ninja is not installed"; exit 1; }
# GoogleTest from .gpu-deps when the machine has none of its own.
if [ -d "$deps/pkgconfig" ] && ! pkg-config --exists gtest 2>/dev/null; then
  export PKG_CONFIG_PATH="$deps/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
fi
# NCCL: next to the toolkit, else a pip wheel's copy (nvidia-nccl-cu13) through NCCL_HOME.
if [ -z "${NCCL_HOME:-}" ] && ! ls /usr/local/cuda/lib64/libnccl.so >/dev/null 2>&1; then
  wheel=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
  if [ -n "$wheel" ] && [ -e "$wheel/lib/libnccl.so.2" ]; then
    mkdir -p /tmp/co2-nccl/lib
    ln -sfn "$wheel/include" /tmp/co2-nccl/include
    ln -sf "$wheel/lib/libnccl.so.2" /tmp/co2-nccl/lib/libnccl.so
    ln -sf "$wheel/lib/libnccl.so.2" /tmp/co2-nccl/lib/libnccl.so.2
    export NCCL_HOME=/tmp/co2-nccl
  fi
fi

log "build ($BUILD_DIR, cuda enabled, nccl auto)"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  "${MESON[@]}" setup "$BUILD_DIR" -Dcuda=enabled -Dtests=true -Dbuildtype=release || exit 1
fi
ninja -C "$BUILD_DIR" -j "$(jobs)" || exit 1

log "GPU tests (and the host-side device tests)"
timeout 300 "${MESON[@]}" test -C "$BUILD_DIR" --no-rebuild --print-errorlogs \
  runtime/backends/device/gpu runtime/backends/device/selection runtime/backends/device/state_checksum runtime/engine/engine_rounds \
  runtime/backends/device/host_executor runtime/comm/collective_comm nccl_transport nccl_transport_without_gpu
test_rc=$?

log "feature table"
feature_table "$BUILD_DIR/tests/runtime/device_features_gpu_test" "GPU"
features_rc=$?
[ "$features_rc" -eq 77 ] && features_rc=0
[ "$features_rc" -eq 0 ] || test_rc=1

log "elastic membership over NCCL"
# Two ranks on two GPUs (NCCL refuses two ranks of one communicator on one GPU): a rank leaves
# and a new process joins on its GPU, then a rank is killed (tests/capi/multiprocess/elastic_test.py,
# the nccl tests). Fewer than two GPUs: they skip, and the row says so.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
printf '\n%-60s %s\n' "elastic over NCCL ($gpus GPUs)" "result"
if [ "$gpus" -lt 2 ]; then
  printf '%-60s %s\n' "leave, join, loss" "skipped (needs two GPUs)"
else
  ELASTIC_WORKER="$BUILD_DIR/tests/capi/elastic_worker" ELASTIC_WORKER_CUDA="$BUILD_DIR/tests/capi/elastic_worker_cuda" \
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/capi/multiprocess/elastic_test.py -k nccl
  elastic_rc=$?
  printf '%-60s %s\n' "leave, join, loss" "$([ "$elastic_rc" -eq 0 ] && echo pass || echo FAIL)"
  [ "$elastic_rc" -eq 0 ] || test_rc=1
fi

log "benchmark"
"$BUILD_DIR/bench/gpu_bench" "${bench_args[@]}"
bench_rc=$?
if [ "$bench_rc" -eq 77 ]; then
  log "no usable GPU: GPU tests skipped, benchmark skipped"
  bench_rc=0
fi
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
