# Shared by scripts/demo.sh and scripts/test.sh: installs missing Debian packages and configures
# the build directory. Source it; do not run it.

# Repository root, whatever the caller's working directory.
CO2_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-build}

# CUDA 13 and NCCL live in /usr/local/cuda (not from apt): with nvcc on PATH, meson's cuda=auto
# finds them; a machine without them builds the host-only library.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# The Rust toolchain of this machine kind is rustup's, in ~/.cargo/bin (not from apt), which a
# non-login shell may not have on PATH; without cargo the Rust tests are not registered at all.
if ! command -v cargo >/dev/null 2>&1 && [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
  export PATH="$PATH:${HOME:-/root}/.cargo/bin"
fi

log() { printf '==> %s\n' "$*" >&2; }

# ensure_packages PKG...: installs the Debian packages that are not installed yet.
ensure_packages() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    log "not a Debian system: make sure these are installed: $*"
    return 0
  fi
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      log "error: not root and no sudo; install these packages first: ${missing[*]}"
      return 1
    fi
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Debian packages whose presence meson's configure probes for optional parts (LibTorch example,
# Python binding, Rust, tests). Meson caches a probe's answer ("torch/torch.h: NO (cached)")
# even across --reconfigure, so a build directory configured before one of them was installed
# (demo.sh before test.sh) would silently keep leaving that part out.
OPTIONAL_PACKAGES=(libtorch-dev swig python3-dev python3-numpy python3-torch libgtest-dev
                   libgmock-dev libucx-dev bindgen libclang-dev python3-clang zlib1g-dev prometheus-cpp-dev)
PACKAGES_STAMP=co2-optional-packages.txt

# The installed versions of OPTIONAL_PACKAGES, one line each (empty where not installed).
optional_packages_state() {
  command -v dpkg-query >/dev/null 2>&1 || return 0
  local p
  for p in "${OPTIONAL_PACKAGES[@]}"; do
    printf '%s %s\n' "$p" "$(dpkg-query -W -f='${Status} ${Version}' "$p" 2>/dev/null |
                              sed -n 's/^install ok installed //p')"
  done
}

# configure TESTS(true|false) [meson options...]: sets up $BUILD_DIR with these options. If it
# exists already, only turns tests on when TESTS is true (demo.sh sets up without tests; it never
# turns them off in a directory that test.sh configured), and sets it up afresh (meson setup
# --wipe: same options, probes re-run) when OPTIONAL_PACKAGES changed since its configure.
configure() {
  local tests=$1
  shift
  cd "$CO2_ROOT"
  local state
  state=$(optional_packages_state)
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    log "meson setup $BUILD_DIR -Dtests=$tests $*"
    meson setup "$BUILD_DIR" -Dtests="$tests" "$@" || return 1
    printf '%s\n' "$state" > "$BUILD_DIR/$PACKAGES_STAMP"
    return
  fi
  if [ "$state" != "$(cat "$BUILD_DIR/$PACKAGES_STAMP" 2>/dev/null)" ]; then
    log "optional packages changed since $BUILD_DIR was configured: meson setup --wipe $BUILD_DIR"
    meson setup --wipe "$BUILD_DIR" "$@" || return 1
    printf '%s\n' "$state" > "$BUILD_DIR/$PACKAGES_STAMP"
  fi
  local current
  current=$(/usr/bin/python3 -c '
import json, sys
for o in json.load(open(sys.argv[1])):
    if o["name"] == "tests":
        print(str(o["value"]).lower())
' "$BUILD_DIR/meson-info/intro-buildoptions.json" 2>/dev/null || true)
  if [ "$tests" = true ] && [ "$current" != true ]; then
    log "meson configure $BUILD_DIR -Dtests=$tests"
    meson configure "$BUILD_DIR" -Dtests="$tests"
  fi
}

# Parallel build jobs: all cores unless CO2_JOBS says otherwise.
jobs() { echo "${CO2_JOBS:-$(nproc 2>/dev/null || echo 2)}"; }
