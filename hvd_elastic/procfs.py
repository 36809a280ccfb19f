"""The few Linux ``/proc`` facts hvd-elastic reads about processes, from the standard library alone.

Discovery runs under ``python3 -I -S`` (``discovery/consul_hosts``): no
site-packages, so no psutil, and its warm path imports this every second, so
only ``os`` at the top.  Every reader of a process returns None or an empty
answer for one that is gone or unreadable: processes come and go while we look.

Who uses it: the job key (:mod:`hvd_elastic.discovery.jobdir`), the reaper's
worker sessions and probes (:mod:`hvd_elastic.discovery.reaper`,
:mod:`~hvd_elastic.discovery.host_answers`), and horovodrun's driver rules
ending what is left of a job (:mod:`hvd_elastic.horovodrun.rules`).
"""

from __future__ import annotations

import os

_ESTABLISHED = "01"  # the st column of /proc/net/tcp (include/net/tcp_states.h)
ZOMBIE = "Z"


class Stat:
    """``/proc/<pid>/stat``'s fields that matter here."""

    __slots__ = ("comm", "state", "ppid", "sid")

    def __init__(self, comm: str, state: str, ppid: int, sid: int):
        self.comm = comm  # the executable's name, at most 15 characters
        self.state = state  # R, S, D, T (stopped), t (traced), Z, X...
        self.ppid = ppid
        self.sid = sid


def stat_fields(pid: int) -> tuple[bytes, list[bytes]]:
    """``/proc/<pid>/stat`` as (comm, the fields after it: state, ppid, ...); raises OSError/ValueError/IndexError.

    The name is taken between the first `` (`` and the last ``)``: it may hold
    either itself.
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    comm, tail = raw.split(b" (", 1)[1].rsplit(b")", 1)
    return comm, tail.split()


def stat(pid: int) -> Stat | None:
    """The :class:`Stat` of ``pid``; None when it is gone."""
    try:
        comm, fields = stat_fields(pid)
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


def descendants(root: int, stats: dict[int, Stat]) -> set[int]:
    """Every process below ``root`` in ``stats``."""
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st.ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def session_leaders(root: int, stats: dict[int, Stat] | None = None, *, zombies: bool = True) -> list[int]:
    """The processes below ``root`` that lead their own session (``safe_shell_exec``'s middlemen call
    ``setsid()``: a child of horovodrun, or a grandchild when its forkserver made it).  ``zombies=False``
    leaves out leaders that have exited and wait to be reaped."""
    stats = all_stats() if stats is None else stats
    return sorted(pid for pid in descendants(root, stats)
                  if stats[pid].sid == pid and (zombies or stats[pid].state != ZOMBIE))


def _address(hexed: str) -> str:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    import socket  # not on discovery's warm path

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
