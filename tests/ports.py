"""Ports for the tests' rendezvous: the rule co2run picks MASTER_PORT by (launcher/master_port.cpp).

A port from the kernel's ephemeral range (bind to port 0) can be taken by any outgoing connection
of a test running beside this one before the rank that should listen on it binds it; the CI once
failed that way. Below the range only an explicit bind takes a port."""
import random
import socket

LOWEST_PICK = 10000
DEFAULT_EPHEMERAL_LOW = 32768


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port(count=1):
    """A port p below the ephemeral range with p .. p + count - 1 free now (count=2: co2's store,
    then a framework's gloo group at p + 1)."""
    high = _ephemeral_low() - count
    for _ in range(256):
        port = random.SystemRandom().randrange(LOWEST_PICK, high)
        if all(_bindable(port + i) for i in range(count)):
            return port
    raise RuntimeError(f"no {count} consecutive free ports in [{LOWEST_PICK}, {high + count})")
