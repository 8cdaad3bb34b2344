#!/usr/bin/env bash
# Shaped links for benchmarks: one network namespace per rank, joined by a bridge, every rank's
# link capped at RATE in each direction (tc tbf on both ends of its veth pair), like a host with
# a full-duplex NIC of that rate.
#
#   netns.sh run --ranks W [--rate RATE] [--flow-rate FLOW] [--nodes K] [--prefix P] -- COMMAND [ARGS...]
#       Sets up, runs COMMAND in the root namespace with the environment below, and removes
#       everything it created when COMMAND ends, fails, or the script is interrupted.
#   netns.sh down [--prefix P]   removes leftovers of a killed run (namespaces named P*)
#   netns.sh check               exit 0 if this process may create namespaces, 77 if not
#
# COMMAND sees: CO2_NETNS_RANKS=W, CO2_NETNS_PREFIX, CO2_NETNS_RATE, CO2_NETNS_IFACE_PATTERN (eth%d: the rank's
# interface name inside its namespace), CO2_NETNS_ADDR_0..W-1 (rank addresses). It starts rank i
# with `ip netns exec ${CO2_NETNS_PREFIX}r$i ...`.
#
# RATE is tc's syntax (100mbit, 1gbit) or "none" for uncapped veth. Topology: namespace
# ${P}br holds bridge br0; namespace ${P}r$i holds eth$i = 10.77.0.(i+1)/24 whose peer is a port of
# br0. Everything lives in namespaces of its own: the host's interfaces are never touched.
#
# --nodes K (hierarchical benchmarks): the W ranks form K nodes of W/K consecutive ranks. Each
# node is a bridge of its own (namespace ${P}n$k, bridge nbr) whose rank ports are uncapped: the
# ranks of a node talk at veth speed. Each node bridge has one uplink (veth) to the core bridge
# (br0 in ${P}br), capped at RATE on both ends: the node's NIC, shared by its ranks, full duplex.
# Traffic between nodes crosses two such uplinks (its node's and the other's), so each direction
# of a node's traffic is capped at RATE. All addresses stay in one subnet (layer 2 throughout).
# COMMAND also sees CO2_NETNS_NODES=K (1 without --nodes).
#
# --flow-rate FLOW (a per-flow cap below the link's, as some clouds and WAN paths impose): every
# capped link becomes an htb class at RATE holding 16 classes of at most FLOW each, and a TCP
# packet goes to class (source port / 2 + destination port / 2) mod 16 (two levels of u32 hash
# tables on bits 1-4 of the ports: this kernel has no fq, sfq or flower). One connection then
# gets at most FLOW; several get up to RATE between them (hashed: two may share a class). COMMAND
# sees CO2_NETNS_FLOW_RATE (empty without it).
set -euo pipefail

PREFIX_DEFAULT="co2b"
SUBNET="10.77.0"

die() { echo "netns.sh: $*" >&2; exit 2; }

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

# Namespaces need CAP_SYS_ADMIN, links and qdiscs CAP_NET_ADMIN: try, do not guess from uid.
check_privilege() {
  local probe="co2probe$$"
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "netns.sh: needs iproute2 (ip, tc): apt-get install iproute2" >&2
    return 77
  fi
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "netns.sh: cannot create network namespaces here (needs root, or CAP_SYS_ADMIN and" \
         "CAP_NET_ADMIN); nothing was changed. Run as root, or use the loopback mode." >&2
    return 77
  fi
  ip netns del "$probe"
  return 0
}

# Removes every namespace named PREFIX* (the veth pairs and qdiscs go with them).
teardown() {
  local prefix="$1" ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${prefix}" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

# tbf needs a bucket of at least one maximal (GSO) packet and enough for the rate at timer
# granularity; 256 KiB covers 100 Mbit/s, faster links get rate/100 (10 ms worth).
tbf_args() {
  local rate="$1" bits burst
  bits=$(tc_rate_bits "$rate")
  burst=$(( bits / 8 / 100 ))
  (( burst < 262144 )) && burst=262144
  echo "rate $rate burst $burst latency 50ms"
}

tc_rate_bits() {
  local r="${1,,}" n unit
  n="${r%%[a-z]*}"
  unit="${r#"$n"}"
  case "$unit" in
    gbit) echo $(( n * 1000000000 )) ;;
    mbit) echo $(( n * 1000000 )) ;;
    kbit) echo $(( n * 1000 )) ;;
    bit|"") echo "$n" ;;
    *) die "unknown rate unit in '$1' (use kbit, mbit, gbit or none)" ;;
  esac
}

# cap_link NAMESPACE DEVICE RATE FLOW: the device's egress capped at RATE (tbf), or with FLOW
# (non-empty) an htb per-flow cap below it (see --flow-rate above), loaded in one tc -batch.
cap_link() {
  local ns="$1" dev="$2" rate="$3" flow="$4" a b share
  if [[ -z "$flow" ]]; then
    # shellcheck disable=SC2046
    tc -n "$ns" qdisc add dev "$dev" root tbf $(tbf_args "$rate")
    return
  fi
  # Each class is assured 1/17 of the link (16 flow classes and one for what is not TCP) and
  # may borrow up to FLOW; the parent bounds their sum by RATE.
  share="$(( $(tc_rate_bits "$rate") / 17 ))bit"
  {
    echo "qdisc add dev $dev root handle 1: htb default 2"
    echo "class add dev $dev parent 1: classid 1:1 htb rate $rate ceil $rate quantum 60000"
    echo "class add dev $dev parent 1:1 classid 1:2 htb rate $share ceil $rate quantum 60000"
    for (( a = 0; a < 16; a++ )); do
      printf 'class add dev %s parent 1:1 classid 1:%x htb rate %s ceil %s quantum 60000\n' "$dev" $(( 0x10 + a )) "$share" "$flow"
    done
    # Table 2: by bits 1-4 of the source port (a), then table 0x100+a: by the destination port's
    # (b). Not bits 0-3: Linux's connect() picks even ports, so bit 0 would halve the classes.
    echo "filter add dev $dev parent 1: prio 1 handle 2: protocol ip u32 divisor 16"
    for (( a = 0; a < 16; a++ )); do
      printf 'filter add dev %s parent 1: prio 1 handle %x: protocol ip u32 divisor 16\n' "$dev" $(( 0x100 + a ))
    done
    for (( a = 0; a < 16; a++ )); do
      for (( b = 0; b < 16; b++ )); do
        printf 'filter add dev %s parent 1: prio 1 protocol ip u32 ht %x:%x: match u32 0 0 flowid 1:%x\n' \
          "$dev" $(( 0x100 + a )) "$b" $(( 0x10 + ((a + b) & 15) ))
      done
      printf 'filter add dev %s parent 1: prio 1 protocol ip u32 ht 2:%x: match u32 0 0 link %x: hashkey mask 0x0000001e at 20\n' \
        "$dev" "$a" $(( 0x100 + a ))
    done
    echo "filter add dev $dev parent 1: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff link 2: hashkey mask 0x001e0000 at 20"
  } | tc -n "$ns" -batch - 2>&1 | grep -v "quantum of class" >&2 || true
  tc -n "$ns" qdisc show dev "$dev" | grep -q "htb 1:" || die "could not load the per-flow cap on $dev (htb, u32)"
}

# --nodes: per node a bridge, uncapped rank ports, one capped uplink to the core bridge br0.
setup_nodes() {
  local prefix="$1" ranks="$2" rate="$3" nodes="$4" i k ns nb
  ip netns add "${prefix}br"
  ip -n "${prefix}br" link add br0 type bridge
  ip -n "${prefix}br" link set br0 up
  ip -n "${prefix}br" link set lo up
  for (( k = 0; k < nodes; k++ )); do
    nb="${prefix}n$k"
    ip netns add "$nb"
    ip -n "$nb" link set lo up
    ip -n "$nb" link add nbr type bridge
    ip -n "$nb" link set nbr up
    ip -n "$nb" link add "up$k" type veth peer name "node$k" netns "${prefix}br"
    ip -n "$nb" link set "up$k" master nbr
    ip -n "$nb" link set "up$k" up
    ip -n "${prefix}br" link set "node$k" master br0
    ip -n "${prefix}br" link set "node$k" up
    if [[ "$rate" != "none" ]]; then
      cap_link "$nb" "up$k" "$rate" "$flow_rate"
      cap_link "${prefix}br" "node$k" "$rate" "$flow_rate"
    fi
  done
  for (( i = 0; i < ranks; i++ )); do
    ns="${prefix}r$i"
    nb="${prefix}n$(( i / (ranks / nodes) ))"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add "eth$i" type veth peer name "port$i" netns "$nb"
    ip -n "$ns" addr add "${SUBNET}.$(( i + 1 ))/24" dev "eth$i"
    ip -n "$ns" link set "eth$i" up
    ip -n "$nb" link set "port$i" master nbr
    ip -n "$nb" link set "port$i" up
  done
}

setup() {
  local prefix="$1" ranks="$2" rate="$3" i ns
  ip netns add "${prefix}br"
  ip -n "${prefix}br" link add br0 type bridge
  ip -n "${prefix}br" link set br0 up
  ip -n "${prefix}br" link set lo up
  for (( i = 0; i < ranks; i++ )); do
    ns="${prefix}r$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add "eth$i" type veth peer name "port$i" netns "${prefix}br"
    ip -n "$ns" addr add "${SUBNET}.$(( i + 1 ))/24" dev "eth$i"
    ip -n "$ns" link set "eth$i" up
    ip -n "${prefix}br" link set "port$i" master br0
    ip -n "${prefix}br" link set "port$i" up
    if [[ "$rate" != "none" ]]; then
      cap_link "$ns" "eth$i" "$rate" "$flow_rate"
      cap_link "${prefix}br" "port$i" "$rate" "$flow_rate"
    fi
  done
}

cmd="${1:-}"
[[ -n "$cmd" ]] || usage
shift
prefix="$PREFIX_DEFAULT"
ranks=""
rate="none"
flow_rate=""
nodes=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --flow-rate) flow_rate="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--prefix must be 1-8 lowercase letters/digits"

case "$cmd" in
  check)
    check_privilege
    ;;
  down)
    teardown "$prefix"
    ;;
  run)
    [[ "$ranks" =~ ^[0-9]+$ && "$ranks" -ge 1 && "$ranks" -le 64 ]] || die "--ranks must be 1..64"
    [[ $# -gt 0 ]] || die "run needs a command after --"
    [[ "$nodes" =~ ^[0-9]+$ && "$nodes" -ge 1 && $(( ranks % nodes )) -eq 0 ]] \
      || die "--nodes must be >= 1 and divide --ranks"

    [[ "$rate" == "none" ]] || tc_rate_bits "$rate" >/dev/null
    if [[ -n "$flow_rate" ]]; then
      [[ "$rate" != "none" ]] || die "--flow-rate needs --rate (the link's cap, above the flow's)"
      (( $(tc_rate_bits "$flow_rate") <= $(tc_rate_bits "$rate") )) || die "--flow-rate must not exceed --rate"
    fi
    check_privilege || exit $?
    if ip netns list | awk '{print $1}' | grep -q "^${prefix}"; then
      die "namespaces named ${prefix}* exist already (another run, or a killed one: netns.sh down --prefix $prefix)"
    fi
    # From here on, whatever happens, the namespaces go.
    # The command runs in the background so that a signal to this script is handled at once
    # (bash runs traps only between foreground commands): the command is stopped, then torn down.
    child=""
    stop_child() { [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null || true; }
    trap 'teardown "$prefix"' EXIT
    trap 'stop_child; exit 130' INT
    trap 'stop_child; exit 143' TERM
    trap 'stop_child; exit 129' HUP
    if (( nodes > 1 )); then
      setup_nodes "$prefix" "$ranks" "$rate" "$nodes"
    else
      setup "$prefix" "$ranks" "$rate"
    fi
    export CO2_NETNS_NODES="$nodes"
    export CO2_NETNS_RANKS="$ranks" CO2_NETNS_PREFIX="$prefix" CO2_NETNS_RATE="$rate" CO2_NETNS_FLOW_RATE="$flow_rate"
    for (( i = 0; i < ranks; i++ )); do
      export "CO2_NETNS_ADDR_$i=${SUBNET}.$(( i + 1 ))"
    done
    # Each rank has its own interface name (eth$i); the command picks it per rank.
    export CO2_NETNS_IFACE_PATTERN="eth%d"
    "$@" &
    child=$!
    status=0
    wait "$child" || status=$?
    child=""
    exit "$status"
    ;;
  *)
    die "unknown command '$cmd' (run, down, check)"
    ;;
esac
