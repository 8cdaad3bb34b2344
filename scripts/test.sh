#!/usr/bin/env bash
# The test suite: builds co2 with its tests and runs `meson test`. Installs the Debian packages
# it needs when they are missing (as root, or through sudo). The last line it prints is
#   N passed, N failed, N skipped
# counted from $BUILD_DIR/meson-logs/testlog.json; the exit status is nonzero when anything
# failed (or the build did).
#   bash scripts/test.sh [extra meson test arguments, e.g. a test name or --suite capi]
# BUILD_DIR (default build), CO2_JOBS (default: all cores) are honoured. CO2_SANITIZE=1 builds
# and tests in build-asan with -Db_sanitize=address,undefined instead. CO2_SANITIZE=thread builds
# build-tsan with ThreadSanitizer (host only: no CUDA, NCCL, Python, Rust, LibTorch) and runs
# the capi and runtime suites unless told otherwise:
#   CO2_SANITIZE=thread bash scripts/test.sh [--suite capi --suite runtime]
# UCX's memory hooks are turned off there (they patch malloc and mmap under TSan's own), the
# checkpoint test's million-parameter case is shrunk (CO2_TEST_BIG_PARAMETERS) and one timing
# assertion is left out (GTEST_FILTER).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_packages meson ninja-build gcc g++ libc6-dev binutils pkg-config zlib1g-dev libgtest-dev libgmock-dev \
  libucx-dev ucx-utils bindgen libclang-dev python3-clang valgrind iproute2 \
  swig python3-dev python3-numpy python3-pytest python3-torch python3-sklearn python3-matplotlib mypy \
  python3-mesonpy patchelf python3-venv python3-pip \
  python3-doc prometheus-cpp-dev \
  libtorch-dev || exit 1

extra_options=()
test_arguments=("$@")
if [ "${CO2_SANITIZE:-0}" = thread ]; then
  BUILD_DIR=${BUILD_DIR_TSAN:-build-tsan}
  # debugoptimized: TSan's reports name file:line.
  extra_options=(-Db_sanitize=thread -Db_lundef=false -Dbuildtype=debugoptimized -Dcuda=disabled -Dnccl=disabled
                 -Dpython=disabled -Drust=disabled -Dlibtorch=disabled)
  # allocator_may_return_null: bad_input asks for absurd sizes on purpose and expects an error.
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1}
  export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
  export CO2_TEST_BIG_PARAMETERS=${CO2_TEST_BIG_PARAMETERS:-20011}
  # A timing assertion (the boundary's wait under 5 % of the all-reduce): TSan's slowdown is
  # uneven across threads, so the ratio means nothing there.
  export GTEST_FILTER=${GTEST_FILTER:--Overlap.BoundaryWaitIsSmallWhenStepsOutlastTheCollective}
  [ ${#test_arguments[@]} -gt 0 ] || test_arguments=(--suite capi --suite runtime)
  # Everything is several times slower under TSan.
  test_arguments+=(--timeout-multiplier "${CO2_TSAN_TIMEOUT_MULTIPLIER:-4}")
elif [ "${CO2_SANITIZE:-0}" = 1 ]; then
  BUILD_DIR=${BUILD_DIR_ASAN:-build-asan}
  extra_options=(-Db_sanitize=address,undefined -Db_lundef=false)
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi

if ! configure true "${extra_options[@]}" || ! ninja -C "$BUILD_DIR" -j "$(jobs)"; then
  log "error: the build failed"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi

testlog="$BUILD_DIR/meson-logs/testlog.json"
rm -f "$testlog"
log "meson test -C $BUILD_DIR ${test_arguments[*]}"
meson test -C "$BUILD_DIR" --no-rebuild --print-errorlogs "${test_arguments[@]}"
rc=$?

if [ ! -f "$testlog" ]; then
  log "error: meson test wrote no $testlog"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
summary=$(/usr/bin/python3 - "$testlog" <<'PY'
import json, sys
passed = failed = skipped = 0
with open(sys.argv[1]) as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        entry = json.loads(line)
        result = entry.get("result", "ERROR")
        if result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:  # FAIL, TIMEOUT, ERROR, UNEXPECTEDPASS, INTERRUPT
            failed += 1
            # Named again here so that a log's tail says which test failed (.ci/run repeats it).
            print(f"failed test: {entry.get('name', '?')} ({result}, {entry.get('duration', 0):.1f}s)")
            # meson keeps a test's stderr apart from its stdout; a tool that fails often says
            # why on stderr only (marked '!').
            for stream, mark in (("stdout", "|"), ("stderr", "!")):
                for output in (entry.get(stream) or "").splitlines()[-20:]:
                    print(f"failed test:   {mark} {output}")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
PY
)
parse_rc=$?
[ -n "$summary" ] || summary="0 passed, 1 failed, 0 skipped"
echo "$summary"
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
exit "$parse_rc"
