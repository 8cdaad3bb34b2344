#!/usr/bin/env bash
# The GPU check (issue 7): one run on a GPU machine, at most ~8 minutes. Prints the driver and
# CUDA versions, builds co2 with CUDA and NCCL, runs the GPU tests and the benchmark table
# (bench/gpu.cpp; record the numbers in docs/benchmarks.md with the date).
# Without a usable GPU it builds, runs the GPU tests (they exit 77 = skipped), skips the
# benchmark and exits 0.
#   bash scripts/gpu-check.sh [--quick]        BUILD_DIR (default build-gpu), CO2_JOBS honoured
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CO2_ROOT"
BUILD_DIR=${BUILD_DIR_GPU:-build-gpu}
bench_args=()
[ "${1:-}" = --quick ] && bench_args=(--quick --max-millions 64 --repeats 3)

log "versions"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi: not found (no NVIDIA driver on this machine)"
fi
if ! command -v nvcc >/dev/null 2>&1; then
  log "error: nvcc not found (expected in /usr/local/cuda/bin)"
  exit 1
fi
nvcc --version | tail -n 2
for tool in meson ninja; do
  command -v "$tool" >/dev/null 2>&1 || { log "error: $tool is not installed (apt-get install meson ninja-build)"; exit 1; }
done

log "build ($BUILD_DIR, cuda and nccl enabled)"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  meson setup "$BUILD_DIR" -Dcuda=enabled -Dnccl=enabled -Dtests=true -Dbuildtype=release || exit 1
fi
ninja -C "$BUILD_DIR" -j "$(jobs)" || exit 1

log "GPU tests (and the host-side device tests)"
timeout 300 meson test -C "$BUILD_DIR" --no-rebuild --print-errorlogs \
  runtime/device/gpu runtime/device/selection runtime/collective_comm nccl_transport nccl_transport_without_gpu
test_rc=$?

log "benchmark"
"$BUILD_DIR/bench/gpu_bench" "${bench_args[@]}"
bench_rc=$?
if [ "$bench_rc" -eq 77 ]; then
  log "no usable GPU: GPU tests skipped, benchmark skipped"
  bench_rc=0
fi
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
