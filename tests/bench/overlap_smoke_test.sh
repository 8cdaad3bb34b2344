#!/usr/bin/env bash
# Smoke test of bench/overlap/run.py and bench/scale/scale.py at a tiny size: the benchmark still
# runs end to end, prints its table, writes its plot and JSON, and the scale model reads them.
# --digits adds the digits-MLP table (a few steps of bench/overlap/digits_rank.py per algorithm);
# it is checked wherever the build has the co2 Python binding and torch and sklearn are there.
# No timing is asserted.
#   overlap_smoke_test.sh SOURCE_ROOT BUILD_ROOT model|loopback
# loopback needs the multi-process transport: without it run.py exits 77 and so does this test.
set -uo pipefail
src="$1" build="$2" transport="$3"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

/usr/bin/python3 "$src/bench/overlap/run.py" --quick --digits --transport "$transport" --build "$build" \
  --out "$out" >"$out/table.txt" 2>"$out/log.txt"
rc=$?
cat "$out/log.txt" "$out/table.txt"
if [ "$rc" = 77 ]; then
  echo "skipped: $transport needs what this build or machine lacks (see above)"
  exit 77
fi
[ "$rc" = 0 ] || { echo "FAIL: run.py exited $rc"; exit 1; }

fail=0
for algo in "sync (co2)" localsgd diloco co2; do
  grep -q "^    $algo " "$out/table.txt" || { echo "FAIL: no '$algo' row in the table"; fail=1; }
done
grep -q "compute-only" "$out/table.txt" || { echo "FAIL: no compute-only reference"; fail=1; }
[ -s "$out/overlap_ratio.png" ] || { echo "FAIL: no plot written"; fail=1; }
/usr/bin/python3 - "$out/overlap.json" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))
algos = {r["algo"] for r in d["results"]}
missing = {"none", "sync", "localsgd", "diloco", "co2"} - algos
assert not missing, f"missing algorithms in overlap.json: {missing}"
for r in d["results"]:
    assert r["steps_per_s"] > 0, r
    if r["algo"] == "co2":
        assert r["advised_tau"] >= 1, f"co2 ran without a tau advice: {r}"
print("overlap.json: ok,", len(d["results"]), "results")
PY

if [ ! -f "$build/bindings/python/co2/__init__.py" ]; then
  echo "digits table: this build has no co2 Python binding, not checked"
elif ! /usr/bin/python3 -c "import torch, sklearn" 2>/dev/null; then
  echo "digits table: python3-torch or python3-sklearn is missing, not checked"
else
  grep -q "step = the digits MLP" "$out/table.txt" || { echo "FAIL: no digits table"; fail=1; }
  /usr/bin/python3 - "$out/overlap.json" "$transport" <<'PY' || fail=1
import json, sys
d, transport = json.load(open(sys.argv[1])), sys.argv[2]
rows = [r for r in d["results"] if r["work"] == "digits"]
want = {"none", "sync", "sync-step", "localsgd", "diloco", "co2"} | ({"ddp"} if transport != "model" else set())
missing = want - {r["algo"] for r in rows}
assert not missing, f"missing digits rows in overlap.json: {missing}"
for r in rows:
    assert r["steps_per_s"] > 0 and r["ranks"] == 2 and r["world"] == 2, r
    assert r["params"] == 64 * r["hidden"] + r["hidden"] + r["hidden"] ** 2 + r["hidden"] + 10 * r["hidden"] + 10, r
    if r["algo"] in ("localsgd", "diloco", "co2"):
        assert r["boundaries"] >= 1 and r["allreduces"] >= 1, f"no round completed: {r}"
    if r["algo"] == "sync":      # averaged in backward, every step; sync-step in optimizer.step
        assert r["grad_reductions"] >= r["steps"] and r["allreduces"] == 0, r
    if r["algo"] == "sync-step":
        assert r["grad_reductions"] == 0 and r["allreduces"] >= r["steps"], r
print("digits rows: ok,", len(rows), "results")
PY
fi

# --tables-from re-renders an earlier run's tables without measuring: the same table.
/usr/bin/python3 "$src/bench/overlap/run.py" --tables-from "$out/overlap.json" --no-plot >"$out/again.txt" || {
  echo "FAIL: run.py --tables-from failed"; fail=1; }
diff <(grep -v '^# ' "$out/table.txt") <(grep -v '^# ' "$out/again.txt") >/dev/null || {
  echo "FAIL: --tables-from printed other tables than the run"; fail=1; }

/usr/bin/python3 "$src/bench/scale/scale.py" --measured "$out/overlap.json" --out "$out" >"$out/scale.txt" || {
  echo "FAIL: scale.py failed"; fail=1; }
cat "$out/scale.txt"
grep -q "CO2 tau=48" "$out/scale.txt" && grep -q "CO2 hier tau=48" "$out/scale.txt" || {
  echo "FAIL: scale.py printed no prediction"; fail=1; }
[ -s "$out/scale.png" ] || { echo "FAIL: scale.py wrote no plot"; fail=1; }
exit $fail
