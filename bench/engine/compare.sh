#!/usr/bin/env bash
# bench/engine/engine_boundary against two revisions of libco2, alternated (A B A B ...) in one run
# so that the machine's load falls on both alike; prints each run, then a table of B/A ratios of
# the median time per boundary with the load average seen during the runs.
#   bash bench/engine/compare.sh [--revs REV_A REV_B] [--rounds R] [--boundaries N]
#   bash bench/engine/compare.sh --dirs BUILD_DIR_A BUILD_DIR_B [--rounds R] [--boundaries N]
# --revs (default: main HEAD) checks each revision out with `git worktree` under $TMPDIR and builds
# libco2 and the bench there (host only: same options for both); --dirs takes existing build
# directories. The bench binary is B's; libco2.so.1 comes from each side in turn (the bench uses
# the installed header only, so either library serves it).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
rev_a=main rev_b=HEAD dir_a="" dir_b="" rounds=2 boundaries=30
while [ $# -gt 0 ]; do
  case $1 in
    --revs) rev_a=$2 rev_b=$3; shift 3 ;;
    --dirs) dir_a=$2 dir_b=$3; shift 3 ;;
    --rounds) rounds=$2; shift 2 ;;
    --boundaries) boundaries=$2; shift 2 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# build_revision REV -> prints the build directory of REV (a detached worktree under $TMPDIR).
build_revision() {
  local rev=$1 commit tree
  commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}")
  tree=${TMPDIR:-/tmp}/co2-compare-${commit:0:12}
  if [ ! -d "$tree" ]; then
    git -C "$repo" worktree add --detach "$tree" "$commit" >&2
  fi
  if [ ! -f "$tree/build-compare/build.ninja" ]; then
    meson setup "$tree/build-compare" "$tree" -Dcuda=disabled -Dnccl=disabled -Dpython=disabled \
      -Drust=disabled -Dlibtorch=disabled -Dtests=false >&2
  fi
  meson compile -C "$tree/build-compare" -j "${CO2_JOBS:-2}" co2 engine_boundary >&2
  echo "$tree/build-compare"
}

if [ -z "$dir_a" ]; then
  dir_a=$(build_revision "$rev_a")
  dir_b=$(build_revision "$rev_b")
else
  rev_a=$dir_a rev_b=$dir_b
fi
bench="$dir_b/bench/engine_boundary"
out=$(mktemp -d)
loads=()
for round in $(seq 1 "$rounds"); do
  for side in a b; do
    dir=$dir_a; [ $side = b ] && dir=$dir_b
    echo "== $side ($([ $side = a ] && echo "$rev_a" || echo "$rev_b")), round $round" >&2
    LD_LIBRARY_PATH="$dir" "$bench" "$boundaries" | tee "$out/$side.$round" >&2
    loads+=("$(cut -d' ' -f1 /proc/loadavg)")
  done
done

# The table: per (algorithm, N) the median of A's and of B's per-run medians, and B/A.
echo
echo "A = $rev_a, B = $rev_b; $rounds alternated rounds of $boundaries boundaries; load average after each run: ${loads[*]}"
/usr/bin/python3 - "$out" "$rounds" <<'EOF'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {side: {} for side in "ab"}
for side in "ab":
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}").read().splitlines()[1:]:
            algorithm, n, median, _ = line.split()
            runs[side].setdefault((algorithm, int(n)), []).append(float(median))
print(f"{'algorithm':<10} {'N':>10} {'A_us':>10} {'B_us':>10} {'B/A':>7}")
for key, a in runs["a"].items():
    b = runs["b"].get(key, [])
    if not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{key[0]:<10} {key[1]:>10} {ma:>10.1f} {mb:>10.1f} {mb / ma:>7.3f}")
EOF
rm -rf "$out"
