#!/usr/bin/env bash
# The Rust crates the way a user gets them, run by rust_cargo.sh's `package` mode (cargo on PATH,
# CO2_LIB_DIR and CARGO_TARGET_DIR set to the meson build, $asan the ASan runtime or empty):
#   rust_package.sh BUILD_DIR SOURCE_ROOT VERSION
# 1. `cargo package` of co2-sys, co2 and the example; cargo verifies each by building it from
#    its .crate, with libco2 found through CO2_LIB_DIR. The crates carry VERSION, meson's.
# 2. The .crate files become a vendored directory source that replaces crates.io.
# 3. The packaged example, unpacked outside the repository, builds with `--locked` from
#    `co2 = "VERSION"`, with libco2 found through pkg-config in a `meson install` of this build
#    (no CO2_LIB_DIR), and trains on 3 ranks against the installed library alone; it builds
#    too with libco2 only on the compiler's default path (LIBRARY_PATH).
# 4. co2-sys's build script stops with what to do when CO2_LIB_DIR holds no libco2, when nothing
#    finds libco2, and when pkg-config's libco2 has a version the crate cannot use.
set -euo pipefail
build=$1
root=$2
version=$3
work="$build/rust-package"
rm -rf "$work"
mkdir -p "$work/vendor" "$work/empty"

fail() { echo "FAIL: $*" >&2; exit 1; }

# cargo unpacks the crates it verifies into $CARGO_HOME/registry/src, keyed by the path of the
# temporary registry only: a machine that ran this test before at the same path (a CI clone) would
# build the stale sources of an earlier co2-sys of the same version. A home of its own per run.
# (The toolchain is rustup's, found through RUSTUP_HOME, which this does not move.)
export CARGO_HOME="$work/cargo-home"
mkdir -p "$CARGO_HOME"

echo "== cargo package (verified against CO2_LIB_DIR=$CO2_LIB_DIR)"
rm -f "$CARGO_TARGET_DIR"/package/*.crate   # a stale one must not stand in for a missing one
(cd "$root/bindings/rust" && cargo package --offline --workspace --allow-dirty)

example=co2-example-regression
for crate in co2-sys co2 "$example"; do
  file="$CARGO_TARGET_DIR/package/$crate-$version.crate"
  [ -f "$file" ] || fail "no $file: the crates' version (bindings/rust/Cargo.toml) is not meson's $version"
  tar -xzf "$file" -C "$work/vendor"
  printf '{"files":{},"package":"%s"}\n' "$(sha256sum "$file" | cut -d' ' -f1)" \
    > "$work/vendor/$crate-$version/.cargo-checksum.json"
done
# What the packaged co2 asks of the registry: the co2-sys of its own version.
grep -A1 '^\[dependencies.co2-sys\]' "$work/vendor/co2-$version/Cargo.toml" | grep -qx "version = \"$version\"" \
  || fail "the packaged co2 does not require co2-sys $version (bindings/rust/Cargo.toml, [workspace.dependencies])"

# The application: the packaged example, outside any workspace; crates.io is the vendor directory.
mv "$work/vendor/$example-$version" "$work/app"
mkdir -p "$work/.cargo"
cat > "$work/.cargo/config.toml" <<EOF
[source.crates-io]
replace-with = "co2-packages"
[source.co2-packages]
directory = "$work/vendor"
EOF

echo "== meson install into $work/stage"
meson install -C "$build" --no-rebuild --quiet --destdir "$work/stage" --tags runtime,devel >/dev/null
pc_file=$(find "$work/stage" -name co2.pc | head -n1)
[ -n "$pc_file" ] || fail "meson install wrote no co2.pc"
pc_dir=$(dirname "$pc_file")
lib_dir=$(dirname "$pc_dir")
# The .pc names the install prefix; the sysroot puts the staged tree in front of it.
pkg_env=(env -u CO2_LIB_DIR PKG_CONFIG_PATH="$pc_dir" PKG_CONFIG_LIBDIR="$pc_dir" PKG_CONFIG_SYSROOT_DIR="$work/stage"
         CARGO_TARGET_DIR="$work/target")

echo "== the packaged example, libco2 through pkg-config"
(cd "$work/app" && "${pkg_env[@]}" cargo build --offline --locked)
binary="$work/target/debug/co2-regression"
ldd_out=$(LD_LIBRARY_PATH="$lib_dir" ldd "$binary")
echo "$ldd_out" | grep -q "libco2.so.* => $lib_dir/" || fail "the example does not load the installed libco2: $ldd_out"
LD_LIBRARY_PATH="$lib_dir" ${asan:+env LD_PRELOAD=$asan} "$binary" \
  --world 3 --rounds 12 --tau 6 --group "rust-package-$$"

echo "== the packaged example, libco2 on the compiler's default path (LIBRARY_PATH)"
(cd "$work/app" && env -u CO2_LIB_DIR PKG_CONFIG_PATH="$work/empty" PKG_CONFIG_LIBDIR="$work/empty" \
  LIBRARY_PATH="$lib_dir" CARGO_TARGET_DIR="$work/target" cargo build --offline --locked)

# Each must fail in co2-sys's build script with a message naming the cause and the fix.
expect_build_error() {
  local what=$1 message=$2
  shift 2
  local log="$work/build-error.log"
  if (cd "$work/app" && "$@" cargo build --offline --locked) >"$log" 2>&1; then
    fail "$what: the build succeeded"
  fi
  grep -qF -- "$message" "$log" || { cat "$log" >&2; fail "$what: no \"$message\" in the build's output"; }
  echo "ok: $what"
}

echo "== co2-sys's build script errors"
expect_build_error "CO2_LIB_DIR without libco2" "CO2_LIB_DIR=$work/empty holds no libco2.so" \
  env CO2_LIB_DIR="$work/empty" CARGO_TARGET_DIR="$work/target"

default_library=$(env -u LIBRARY_PATH ${CC:-cc} -print-file-name=libco2.so)
if [ "${default_library#/}" != "$default_library" ] && [ -e "$default_library" ]; then
  echo "skipped: a libco2 on the linker's default path would be found"
else
  expect_build_error "no libco2 anywhere" "libco2 not found: neither CO2_LIB_DIR is set" \
    env -u CO2_LIB_DIR -u LIBRARY_PATH PKG_CONFIG_PATH="$work/empty" PKG_CONFIG_LIBDIR="$work/empty" \
    CARGO_TARGET_DIR="$work/target"
fi

major=${version%%.*}
other_version="$((major + 1)).0.0"
mkdir -p "$work/other-pc"
sed "s/^Version:.*/Version: $other_version/" "$pc_file" > "$work/other-pc/co2.pc"
expect_build_error "libco2 of another major version" "is libco2 $other_version, but co2-sys $version needs libco2 $major.x" \
  env -u CO2_LIB_DIR PKG_CONFIG_PATH="$work/other-pc" PKG_CONFIG_LIBDIR="$work/other-pc" \
  PKG_CONFIG_SYSROOT_DIR="$work/stage" CARGO_TARGET_DIR="$work/target"

echo "rust package: ok"
