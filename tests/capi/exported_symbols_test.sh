#!/usr/bin/env bash
# The shared library exports co2_* and nothing else (the version script capi/libco2.map), every
# function declared in co2.h is exported, and the soname carries the ABI major version.
# Usage: exported_symbols_test.sh <path/to/libco2.so> <path/to/co2.h>
set -u
lib=${1:?usage: $0 libco2.so co2.h}
header=${2:?usage: $0 libco2.so co2.h}

if ! command -v nm >/dev/null 2>&1; then
  echo "nm not found (binutils): skipping"
  exit 77
fi

fail=0

# Defined dynamic symbols. Version nodes (CO2_1, type A/absolute) are not code or data.
exported=$(nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' | sort -u)
if [ -z "$exported" ]; then
  echo "FAIL: $lib exports no symbols at all"
  exit 1
fi

bad=$(printf '%s\n' "$exported" | grep -v '^co2_' || true)
if [ -n "$bad" ]; then
  echo "FAIL: symbols outside the co2_ namespace are exported:"
  printf '  %s\n' $bad | head -50
  fail=1
fi

# Every function the header declares must be exported.
declared=$(sed -n 's/^[a-z0-9_ ]*[ *]\(co2_[a-z0-9_]*\)(.*/\1/p' "$header" | sort -u)
ndeclared=$(printf '%s\n' "$declared" | grep -c . || true)
if [ "$ndeclared" -lt 30 ]; then
  echo "FAIL: found only $ndeclared function declarations in $header (parser out of date?)"
  fail=1
fi
missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported"))
if [ -n "$missing" ]; then
  echo "FAIL: functions declared in co2.h but not exported by $lib:"
  printf '  %s\n' $missing
  fail=1
fi
extra=$(comm -13 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported"))
if [ -n "$extra" ]; then
  echo "FAIL: exported co2_ symbols that co2.h does not declare:"
  printf '  %s\n' $extra
  fail=1
fi

# The exported symbols carry the version node CO2_1.
if command -v objdump >/dev/null 2>&1; then
  unversioned=$(objdump -T "$lib" | awk '/ co2_/ && !/CO2_1/ { print $NF }')
  if [ -n "$unversioned" ]; then
    echo "FAIL: co2_ symbols without the CO2_1 version node:"
    printf '  %s\n' $unversioned
    fail=1
  fi
fi

# soname = libco2.so.<ABI major>
if command -v readelf >/dev/null 2>&1; then
  major=$(sed -n 's/^#define CO2_VERSION_MAJOR \([0-9]*\).*/\1/p' "$header")
  soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
  if [ "$soname" != "libco2.so.$major" ]; then
    echo "FAIL: soname is '$soname', expected 'libco2.so.$major'"
    fail=1
  fi
fi

if [ "$fail" -ne 0 ]; then exit 1; fi
echo "OK: $ndeclared functions, all exported, nothing else exported"
exit 0
