#!/usr/bin/env bash
# Runs cargo for the Rust bindings against the libco2 of a meson build directory.
#   rust_cargo.sh BUILD_DIR SOURCE_ROOT MODE [args...]
# MODE: test      cargo test --offline --workspace (co2-sys layout tests, co2 tests, doc tests)
#       valgrind  the co2 crate's tests again, every test binary under valgrind's memcheck:
#                 fails on memory errors and on definitely/indirectly lost blocks (a handle that
#                 Drop did not destroy leaks its C++ objects)
#       example   cargo run of examples/rust with the given arguments
#       doc       cargo doc of the workspace; any rustdoc warning fails it
#       package   rust_package.sh: cargo package, the packaged example built from a vendored
#                 directory against an installed libco2 and run; args: the meson project version
# Exit 77 (meson: skipped) when cargo is not installed, or for valgrind when valgrind is missing
# or libco2 is built with ASan (which then checks leaks itself during MODE=test).
set -euo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$2" && pwd)
mode=$3
shift 3

cargo=$(command -v cargo || true)
[ -n "$cargo" ] || { [ -x "${HOME:-/root}/.cargo/bin/cargo" ] && cargo="${HOME:-/root}/.cargo/bin/cargo"; } || true
if [ -z "$cargo" ]; then
  echo "cargo not found: skipping the Rust bindings" >&2
  exit 77
fi
export PATH="$(dirname "$cargo"):$PATH"

export CO2_LIB_DIR="$build"
export CARGO_TARGET_DIR="$build/cargo-target"
export LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CARGO_TERM_COLOR=never

# Test binaries run through a "runner" (cargo's target.<triple>.runner); the compiler and build
# scripts do not, so an ASan preload or valgrind applies to the tests only.
host=$(rustc -vV | sed -n 's/^host: //p')
runner_var="CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUNNER"
asan=""
if readelf -d "$build/libco2.so" 2>/dev/null | grep -q 'libasan'; then
  asan=$(gcc -print-file-name=libasan.so)
fi

cd "$root/bindings/rust"
case "$mode" in
  test)
    [ -n "$asan" ] && export "$runner_var=env LD_PRELOAD=$asan"
    exec cargo test --offline --workspace "$@"
    ;;
  valgrind)
    if [ -n "$asan" ]; then echo "libco2 is built with ASan: leaks are checked by the test run" >&2; exit 77; fi
    command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 77; }
    export "$runner_var=valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect --fair-sched=yes"
    exec cargo test --offline -p co2 --tests "$@" -- --test-threads=1
    ;;
  example)
    [ -n "$asan" ] && export "$runner_var=env LD_PRELOAD=$asan"
    exec cargo run --offline -q -p co2-example-regression -- "$@"
    ;;
  doc)
    export RUSTDOCFLAGS="-D warnings"
    exec cargo doc --offline --no-deps --workspace "$@"
    ;;
  package)
    export asan
    exec bash "$root/tests/bindings/rust_package.sh" "$build" "$root" "$@"
    ;;
  *)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
