"""``free_port``: a TCP port for a store server that another process will bind later.

The usual recipe (bind port 0, read the port, close) returns a port from the kernel's
ephemeral range, the range it also hands out as the source port of every outgoing
connection. Between the choice and the server's bind, two things can then go wrong,
each about once in tens of thousands of tries, so a busy test suite or a large
cluster meets them:

* an outgoing connection of any process on the host takes the port first, and the
  server's bind fails;
* a client that connects to the port before the server listens retries, and one retry
  gets that very port as its own source port: on loopback the socket then connects to
  itself (a TCP simultaneous open), looks connected, and waits for a reply that never
  comes.

A port below the ephemeral range is never a source port, so neither can happen.
:func:`free_port` picks one at random there and checks that nothing is bound to it.
"""
from __future__ import annotations

import random
import socket
from typing import Tuple

#: Where Linux keeps the ephemeral range ("low high").
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
#: Lowest port :func:`free_port` picks: above the registered services people run most.
_FLOOR = 10000
#: Random ports tried below the ephemeral range before falling back to the kernel's.
_TRIES = 64


def ephemeral_range() -> Tuple[int, int]:
    """The kernel's ephemeral port range, ``(32768, 60999)`` (Linux's default) if unknown."""
    try:
        with open(_RANGE_FILE) as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "") -> int:
    """A port that nothing on ``host`` is bound to, chosen below the ephemeral range
    when there is room there (see the module's docstring), else the kernel's choice."""
    low, _ = ephemeral_range()
    if low - _FLOOR >= 1024:
        pick = random.Random()  # its own generator: a seeded global one repeats across ranks
        for _ in range(_TRIES):
            port = pick.randrange(_FLOOR, low)
            if _bindable(host, port):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
