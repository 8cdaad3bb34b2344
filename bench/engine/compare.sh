#!/usr/bin/env bash
# bench/engine/engine_boundary against two builds of libco2, alternated (A B A B) in one run so
# that the machine's load falls on both alike:
#   bash bench/engine/compare.sh <build-dir-A> <build-dir-B> [boundaries]
# The bench binary is taken from build-dir-B; libco2.so.1 from each dir in turn.
set -euo pipefail
a=$1 b=$2 boundaries=${3:-30}
bench="$b/bench/engine_boundary"
for round in 1 2; do
  for dir in "$a" "$b"; do
    echo "== $(basename "$(cd "$dir/.." && pwd)")/$(basename "$dir") (round $round)"
    LD_LIBRARY_PATH="$dir" "$bench" "$boundaries"
  done
done
