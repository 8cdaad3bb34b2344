#!/usr/bin/env bash
# bench/overlap/netns.sh: namespaces come up linked and rate-capped, the command sees them, and
# nothing is left behind, also when the command fails. Skips (77) without the privilege.
set -uo pipefail
netns="$1"
prefix="co2t$$"
prefix="${prefix:0:8}"
bash "$netns" check || exit $?   # 77: not permitted here (the script says why)

probe() {
  # Inside the harness: rank 1 reaches rank 0, and both ends of each link carry a tbf qdisc.
  set -e
  ip netns exec "${CO2_NETNS_PREFIX}r0" /usr/bin/python3 -c '
import socket
s = socket.create_server(("0.0.0.0", 5000)); s.settimeout(20)
c, _ = s.accept(); c.sendall(c.recv(5))' &
  local server=$!
  ip netns exec "${CO2_NETNS_PREFIX}r1" /usr/bin/python3 -c '
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 5000), timeout=5); break
    except OSError:
        time.sleep(0.1)
c.sendall(b"hello"); assert c.recv(5) == b"hello"' "$CO2_NETNS_ADDR_0"
  wait "$server"
  tc -n "${CO2_NETNS_PREFIX}r0" qdisc show dev eth0 | grep -q tbf
  tc -n "${CO2_NETNS_PREFIX}br" qdisc show dev port1 | grep -q tbf
  echo "linked and capped: ok"
}
export -f probe

fail=0
bash "$netns" run --ranks 2 --rate 100mbit --prefix "$prefix" -- bash -c probe || { echo "FAIL: probe"; fail=1; }
if ip netns list | grep -q "^${prefix}"; then echo "FAIL: namespaces left behind"; fail=1; fi

bash "$netns" run --ranks 2 --prefix "$prefix" -- false
rc=$?
[ "$rc" = 1 ] || { echo "FAIL: the command's exit status was not passed on ($rc)"; fail=1; }
if ip netns list | grep -q "^${prefix}"; then echo "FAIL: namespaces left after a failing command"; fail=1; fi

bash "$netns" run --ranks 2 --rate 7furlongs --prefix "$prefix" -- true 2>/dev/null
[ "$?" = 2 ] || { echo "FAIL: a bad rate was not refused"; fail=1; }
if ip netns list | grep -q "^${prefix}"; then echo "FAIL: namespaces left after a bad rate"; fail=1; fi
# Without the privilege: a polite refusal (77 and a message), nothing created.
if command -v setpriv >/dev/null; then
  # A copy nobody can read wherever the checkout lives (CI clones into a 0700 directory).
  readable=$(mktemp /tmp/co2-netns-XXXXXX.sh)
  cp "$netns" "$readable" && chmod 0755 "$readable"
  msg=$(setpriv --reuid=65534 --regid=65534 --clear-groups bash "$readable" run --ranks 2 --prefix "$prefix" -- true 2>&1)
  rc=$?
  rm -f "$readable"
  [ "$rc" = 77 ] || { echo "FAIL: an unprivileged run exited $rc, not 77"; fail=1; }
  echo "$msg" | grep -q "needs root" || { echo "FAIL: no explanation for the refusal: $msg"; fail=1; }
  if ip netns list | grep -q "^${prefix}"; then echo "FAIL: namespaces after a refused run"; fail=1; fi
fi
exit $fail
