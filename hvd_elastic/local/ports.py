"""Ports for the programs started on this machine (Consul agents, exporters), chosen so that two never collide.

A port found free by binding port 0 and closing the socket is an *ephemeral*
port: the kernel hands the same range to every outgoing connection, so it can
be given out again, to this process's next probe or to anybody's next
``connect()``, before the program that was meant to listen on it has started.
CI saw exactly that: two ports of one Consul agent came back equal and the
agent refused to start ("Serf Advertise LAN address ... already configured for
HTTP").

:func:`reserve` therefore picks ports *below* the kernel's ephemeral range
(nobody is handed those without asking for them by number), never gives one
out twice in a process's life, and checks that each is free for both TCP and
UDP (Serf listens on both) on the address it will be used on.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_given: set[int] = set()
_lock = threading.Lock()
_LOWEST = 10000  # above the well-known and most registered service ports


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int, host: str) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def reserve(count: int = 1, host: str = "127.0.0.1", *, consecutive: bool = False) -> list[int]:
    """``count`` distinct ports free on ``host`` now and never returned before by this process.

    ``consecutive`` asks for a block ``base, base+1, ...`` (for programs that
    derive ports from one base). Raises RuntimeError when none can be found.
    """
    high = _ephemeral_low()
    rng = random.Random()  # its own seed per call: parallel processes start far apart
    picked: list[int] = []
    with _lock:
        for _ in range(200 + 4 * count):
            base = rng.randrange(_LOWEST, high - count)
            block = range(base, base + count) if consecutive else (base,)
            if all(p not in _given and p not in picked and _bindable(p, host) for p in block):
                picked.extend(block)
            if len(picked) >= count:
                _given.update(picked)
                return picked
    raise RuntimeError(f"no {count} free port(s) on {host} in {_LOWEST}-{high - 1}")
