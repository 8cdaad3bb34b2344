#!/usr/bin/env bash
# The overlap program's issue-16 modes (bench/overlap/hierarchy.py drives them between
# processes): sharded and hierarchical co2 run on 4 ranks as threads (nodes of 2 from
# --ranks-per-node) and say so in their JSON, and hierarchical without a node size is refused.
set -euo pipefail
ov="$1"
common=(--algo co2 --tau 2 --params 4096 --step-us 500 --steps 8 --world 4 --timeout-ms 20000)
out=$("$ov" "${common[@]}" --shard)
[[ $(grep -c '"shard": 1, "hierarchy": "flat"' <<<"$out") -eq 4 ]] || { echo "sharded: $out"; exit 1; }
out=$("$ov" "${common[@]}" --hierarchy nodes --ranks-per-node 2)
[[ $(grep -c '"hierarchy": "nodes"' <<<"$out") -eq 4 ]] || { echo "hierarchical: $out"; exit 1; }
rc=0
"$ov" "${common[@]}" --hierarchy nodes 2>/dev/null || rc=$?
[[ $rc -eq 2 ]] || { echo "--hierarchy nodes without --ranks-per-node: exit $rc, expected 2"; exit 1; }
echo ok
