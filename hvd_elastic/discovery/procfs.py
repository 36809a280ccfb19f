"""The few Linux ``/proc`` facts the reaper needs, from the standard library alone.

Discovery runs under ``python3 -I -S`` (``discovery/consul_hosts``): no
site-packages, so no psutil.  Every reader returns None or an empty answer for
a process that is gone or unreadable; processes come and go while we look.
"""

from __future__ import annotations

import os
import socket
from typing import NamedTuple

from hvd_elastic.discovery import jobdir

_ESTABLISHED = "01"  # the st column of /proc/net/tcp (include/net/tcp_states.h)


class Stat(NamedTuple):
    comm: str  # the executable's name, at most 15 characters
    state: str  # R, S, D, T (stopped), t (traced), Z, X...
    ppid: int
    sid: int


def stat(pid: int) -> Stat | None:
    """``/proc/<pid>/stat``, the fields above; None when it is gone."""
    try:
        comm, fields = jobdir.stat_fields(pid)
        return Stat(comm.decode("utf-8", "replace"), fields[0].decode("ascii"), int(fields[1]), int(fields[3]))
    except (OSError, ValueError, IndexError):
        return None


def all_stats() -> dict[int, Stat]:
    """Every visible process's :class:`Stat`."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat(int(name))) is not None:
            stats[int(name)] = st
    return stats


def _address(hexed: str) -> str:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hexed)
    flipped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, flipped)


def established_peers(pid: int) -> list[tuple[str, int]]:
    """(address, port) of each established TCP connection ``pid`` holds, in its own network namespace."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    peers = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == _ESTABLISHED and cols[9] in inodes:
                address, port = cols[2].split(":")
                peers.append((_address(address), int(port, 16)))
    return peers
