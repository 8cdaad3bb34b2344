#!/usr/bin/env bash
# The demo: builds co2 and runs examples/c/regression.c, least-squares regression trained on 4
# local ranks with CO2 and then with sync (DDP) for comparison. Installs the Debian packages it
# needs when they are missing (as root, or through sudo).
#   bash scripts/demo.sh [--rounds N] [--tau N] [--quiet]
# BUILD_DIR (default build) and CO2_JOBS (default: all cores) are honoured.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_packages meson ninja-build gcc g++ libc6-dev pkg-config
configure false
log "building the example"
ninja -C "$BUILD_DIR" -j "$(jobs)" examples/c/co2_example_regression
log "running examples/c/co2_example_regression $*"
exec "$BUILD_DIR/examples/c/co2_example_regression" "$@"
