#!/usr/bin/env bash
# The C usage example in README.md compiles against co2.h as strict C99.
# Usage: readme_example_test.sh <README.md> <include dir> <c compiler> [compiler args...]
set -u
readme=${1:?usage}; inc=${2:?usage}; shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The first ```c fenced block.
awk '/^```c$/ { inside = 1; next } inside && /^```/ { exit } inside { print }' "$readme" > "$tmp/readme_example.c"
if ! grep -q 'co2_engine_step' "$tmp/readme_example.c"; then
  echo "FAIL: no C example calling co2_engine_step found in $readme"
  exit 1
fi
"$@" -std=c99 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$tmp/readme_example.c" || {
  echo "FAIL: the README's C example does not compile"
  exit 1
}
echo "OK: README example compiles ($(wc -l < "$tmp/readme_example.c") lines)"
