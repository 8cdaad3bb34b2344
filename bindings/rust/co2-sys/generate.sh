#!/usr/bin/env bash
# Regenerates src/bindings.rs from the public header with the bindgen CLI (Debian's bindgen 0.60).
#   bash generate.sh           rewrite src/bindings.rs
#   bash generate.sh --check   regenerate into a temporary file and fail (exit 1, with a diff) if
#                              it differs from the committed src/bindings.rs; exit 77 (skip) if
#                              bindgen is not installed
# The flags are the contract: change them here only, then regenerate and commit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
header="$root/capi/include/co2/co2.h"
committed="$here/src/bindings.rs"

# bindgen formats its output with rustfmt (part of the Rust toolchain), with the settings of
# bindgen-rustfmt.toml, so the bytes do not depend on the working directory.
[ -d "${HOME:-/root}/.cargo/bin" ] && PATH="$PATH:${HOME:-/root}/.cargo/bin"
for tool in bindgen rustfmt; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "$tool not found (Debian: apt-get install bindgen libclang-dev; rustfmt comes with Rust)" >&2
    [ "${1:-}" = --check ] && exit 77
    exit 1
  fi
done

generate() {
  # --size_t-is-usize: size_t is usize (bindgen 0.60 otherwise emits c_ulong).
  # The allow-lists keep libc's typedefs out; layout tests stay in (they pin every struct's size,
  # alignment and field offsets as clang computed them, and run under `cargo test`).
  bindgen "$header" \
    --size_t-is-usize \
    --allowlist-function 'co2_.*' \
    --allowlist-type 'co2_.*' \
    --allowlist-var 'CO2_.*' \
    --no-doc-comments \
    --disable-header-comment \
    --rust-target 1.47 \
    --rustfmt-configuration-file "$here/bindgen-rustfmt.toml" \
    -o "$1" \
    -- -I"$root/capi/include" -std=c99
}

if [ "${1:-}" = --check ]; then
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT
  generate "$tmp"
  if ! diff -u "$committed" "$tmp"; then
    echo "error: bindings/rust/co2-sys/src/bindings.rs is stale: run bash bindings/rust/co2-sys/generate.sh and commit" >&2
    exit 1
  fi
  echo "co2-sys bindings are current ($(bindgen --version))"
  exit 0
fi
generate "$committed"
echo "wrote $committed"
