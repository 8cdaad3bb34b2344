#!/usr/bin/env bash
# The demo: builds co2 and runs examples/c/regression.c, least-squares regression trained with
# CO2 and then with sync (DDP) for comparison, as 4 real processes launched by co2run that talk
# over UCX (TCP on loopback). Installs the Debian packages it needs when they are missing (as
# root, or through sudo).
#   bash scripts/demo.sh [--nproc N] [--threads] [--rounds N] [--tau N] [--quiet]
# --threads runs the 4 ranks as threads of one process on the local transport instead.
# BUILD_DIR (default build) and CO2_JOBS (default: all cores) are honoured; the user's UCX_*
# variables win over the loopback defaults set here.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

nproc=4 threads=0 args=()
while [ $# -gt 0 ]; do
  case $1 in
    --nproc) nproc=$2; shift 2 ;;
    --threads) threads=1; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

ensure_packages meson ninja-build gcc g++ libc6-dev pkg-config zlib1g-dev libucx-dev ucx-utils
configure false
log "building the example and co2run"
ninja -C "$BUILD_DIR" -j "$(jobs)" examples/c/co2_example_regression launcher/co2run
example="$BUILD_DIR/examples/c/co2_example_regression"
if [ "$threads" = 1 ]; then
  log "running $example ${args[*]:-} (4 ranks as threads, local transport)"
  exec "$example" "${args[@]}"
fi
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo} CO2_LOG_LEVEL=${CO2_LOG_LEVEL:-info}
log "co2run --nproc-per-node $nproc $example ${args[*]:-} (UCX_TLS=$UCX_TLS UCX_NET_DEVICES=$UCX_NET_DEVICES)"
exec "$BUILD_DIR/launcher/co2run" --nproc-per-node "$nproc" "$example" "${args[@]}"
